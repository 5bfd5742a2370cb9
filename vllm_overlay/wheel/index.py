"""A PEP 503 "simple" package index as static files, from a folder of wheels.

What the release workflow publishes, so that users install a patched build
with plain pip and nothing of this project: `pip install --extra-index-url
BASE/simple "vllm==0.33.0+hybridkv.N"`. Any static file host serves it
(GitHub Pages, a bucket, `python -m http.server`):

    OUT/simple/index.html            one link per project, `vllm/`
    OUT/simple/<project>/index.html  one link per wheel, `#sha256=...`
    OUT/simple/<project>/<wheel>     the wheels, copied (without --wheel-url)
    OUT/SHA256SUMS                   `sha256sum -c` lines, one per wheel
    OUT/wheels.json                  the listing of the wheels (with --wheel-url)

A project's name is normalised as PEP 503 says (`packaging.utils`), and a
link carries `data-requires-python` when the wheel's METADATA has
`Requires-Python`, so that pip skips a wheel the interpreter cannot run
before downloading it. pip checks each download against its `#sha256`.

vLLM's wheels are hundreds of megabytes, over what GitHub Pages serves per
file, so `wheel_url` lets the pages link to the wheels where they are
hosted instead (a GitHub release's assets); nothing else changes.

A release's index replaces the one before it, yet a user's exact pin
(`vllm==0.32.0+cpu.hybridkv.21`) must keep resolving after `.22` is out. So
each release publishes its listing too (`wheels.json`: file name, sha256,
Requires-Python and URL of each wheel it hosts), and the next index links
every wheel of every earlier listing (`earlier`) beside its own, without
downloading any of them again. A wheel keeps the link it was first published
at; the same file name with another sha256 is refused, since a revision
builds the same bytes on every run.

The index is written whole or not at all: into a scratch folder beside OUT,
renamed into place at the end. Every wheel is read and checked before the
first byte is written, so a bad input leaves nothing behind.
"""

import html
import json
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from packaging.metadata import parse_email
from packaging.utils import (
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from vllm_overlay.common import atomic
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.upstream.fetch import (
    UNREADABLE,
    open_wheel,
    sha256_of,
    unreadable_wheel,
)

SIMPLE_DIR = "simple"
SUMS_FILE = "SHA256SUMS"
LISTING_FILE = "wheels.json"
LISTING_FORMAT = 1
_LISTING_KEYS = {"filename", "sha256", "requires_python", "url"}
_METADATA = re.compile(r"[^/]+\.dist-info/METADATA")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class IndexedWheel:
    """One wheel of the index, as its link says it: a file of the folder of
    wheels (`path`), or one an earlier release published at `url`."""

    filename: str
    project: NormalizedName
    sha256: str
    requires_python: str | None
    path: Path | None = None
    url: str | None = None


def write_index(
    dist_dir: Path,
    out: Path,
    wheel_url: str | None = None,
    earlier: Path | None = None,
) -> list[IndexedWheel]:
    """Write the index of every wheel in `dist_dir` into the new folder `out`
    (absent, or an empty folder), the wheels copied beside their project's
    page, or linked at `wheel_url/<file>` when given, with the listing of
    them; with `earlier` (a folder of earlier releases' listings) it links
    theirs too. Returns the wheels of `dist_dir`."""
    base = _wheel_base(wheel_url) if wheel_url is not None else None
    if earlier is not None and base is None:
        raise OverlayError(
            "--earlier needs --wheel-url: this release's listing must say where "
            "its wheels are hosted, as the earlier ones do"
        )
    wheels = read_wheels(dist_dir)
    linked = _merge(wheels, read_listings(earlier) if earlier is not None else [])
    _check_out(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:
        raise OverlayError(f"cannot write {out}: {exc.strerror or exc}") from None
    try:
        _write(staging, linked, wheels, base)
        atomic.replace_dir(staging, out)
    except OSError as exc:
        raise OverlayError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return wheels


def read_wheels(dist_dir: Path) -> list[IndexedWheel]:
    """Every file of `dist_dir`, each checked to be a wheel whose METADATA
    says the name and version its file name says; sorted by file name."""
    if not dist_dir.is_dir():
        what = "is not a folder" if dist_dir.exists() else "does not exist"
        raise OverlayError(f"{dist_dir} {what}; name the folder of built wheels")
    entries = sorted(dist_dir.iterdir())
    if not entries:
        raise OverlayError(f"{dist_dir} is empty: build the wheels into it first")
    wheels = [_read_wheel(entry) for entry in entries]
    _refuse_duplicates(wheels)
    return wheels


def _read_wheel(path: Path) -> IndexedWheel:
    if not path.is_file() or path.suffix != ".whl":
        kind = "folder" if path.is_dir() else "file"
        raise OverlayError(
            f"{path} is a {kind} that is not a wheel: the folder may hold only "
            "the wheels to publish"
        )
    try:
        project, version, _, _ = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise OverlayError(f"{path}: {exc}") from None
    with open_wheel(path) as archive:
        members = archive.namelist()
        names = [n for n in members if _METADATA.fullmatch(n)]
        # pip refuses a wheel without WHEEL at install, after the download.
        if len(names) != 1 or names[0].replace("METADATA", "WHEEL") not in members:
            raise OverlayError(
                f"{path} has no single .dist-info with METADATA and WHEEL"
            )
        try:
            text = archive.read(names[0]).decode("utf-8")
        except UNREADABLE as exc:
            raise unreadable_wheel(path, f"{names[0]}: {exc}") from None
        except UnicodeDecodeError:
            raise OverlayError(f"{path}: {names[0]} is not UTF-8") from None
    raw, _ = parse_email(text)
    said = (raw.get("name", ""), raw.get("version", ""))
    if canonicalize_name(said[0]) != project or _version(said[1]) != version:
        raise OverlayError(
            f"{path}: its METADATA says {said[0] or '(no name)'} "
            f"{said[1] or '(no version)'}, its file name {project} {version}"
        )
    return IndexedWheel(
        path.name, project, sha256_of(path), raw.get("requires_python"), path=path
    )


def read_listings(folder: Path) -> list[IndexedWheel]:
    """The wheels of every listing (`wheels.json` of a published release,
    saved under any name ending in `.json`) in `folder`, oldest release
    first as the file names' versions say (`v0.2.0.json`); the folder may be
    empty (the first release), and may hold nothing else."""
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise OverlayError(
            f"{folder} {what}; name the folder of earlier releases' listings"
        )
    files = sorted(folder.iterdir(), key=_release_order)
    wheels = []
    for path in files:
        if path.suffix != ".json" or not path.is_file():
            raise OverlayError(
                f"{path} is not a listing ({LISTING_FILE} of a published release, "
                "saved as <tag>.json): the folder may hold only those"
            )
        wheels += read_listing(path)
    return wheels


def _release_order(path: Path) -> tuple:
    """Listings sort by their release's version where the name is one."""
    version = _version(path.stem.removeprefix("v"))
    return (0, version, path.name) if version is not None else (1, path.name)


def read_listing(path: Path) -> list[IndexedWheel]:
    """The wheels one listing (`wheels.json`) names, each entry checked;
    the release workflow's draft check reads its own listing with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OverlayError(f"{path} is not a readable listing: {exc}") from None
    if (
        not isinstance(data, dict)
        or data.get("format") != LISTING_FORMAT
        or not isinstance(data.get("wheels"), list)
    ):
        raise OverlayError(
            f"{path} is not a listing of format {LISTING_FORMAT} "
            '({"format": 1, "wheels": [...]})'
        )
    return [_listed_wheel(path, n, entry) for n, entry in enumerate(data["wheels"], 1)]


def _listed_wheel(path: Path, number: int, entry: object) -> IndexedWheel:
    """One entry of a listing, every field checked: the index links it
    without reading the wheel."""
    where = f"{path}: wheel {number}"
    if not isinstance(entry, dict) or set(entry) != _LISTING_KEYS:
        raise OverlayError(f"{where} must have exactly {sorted(_LISTING_KEYS)}")
    filename, sha256 = entry["filename"], entry["sha256"]
    url, requires_python = entry["url"], entry["requires_python"]
    try:
        project = parse_wheel_filename(str(filename))[0]
    except InvalidWheelFilename as exc:
        raise OverlayError(f"{where}: {exc}") from None
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        raise OverlayError(f"{where}: sha256 {sha256!r} is not 64 hex digits")
    if not isinstance(url, str):
        raise OverlayError(f"{where}: url {url!r} is not text")
    problem = _url_problem(url)
    if problem is not None:
        raise OverlayError(f"{where}: url {url!r} {problem}")
    if not url.endswith("/" + quote(filename)):
        raise OverlayError(f"{where}: url {url} does not end in its file name")
    if requires_python is not None and not isinstance(requires_python, str):
        raise OverlayError(f"{where}: requires_python must be text or null")
    return IndexedWheel(filename, project, sha256, requires_python, url=url)


def _merge(
    wheels: list[IndexedWheel], earlier: list[IndexedWheel]
) -> list[IndexedWheel]:
    """What the index links: every earlier wheel at the link it was first
    published at, then each new one not published before; sorted by file
    name. One file name with two sha256 is refused."""
    first: dict[str, IndexedWheel] = {}
    for wheel in [*earlier, *wheels]:
        seen = first.setdefault(wheel.filename, wheel)
        if seen.sha256 != wheel.sha256:
            now = wheel.path or wheel.url
            raise OverlayError(
                f"{wheel.filename} was published at {seen.url} with sha256 "
                f"{seen.sha256}, and {now} has {wheel.sha256}: one revision "
                "builds the same bytes, so the series changed without "
                "`vllm-overlay pin --bump`"
            )
    linked = sorted(first.values(), key=lambda wheel: wheel.filename)
    _refuse_duplicates(linked)
    return linked


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _refuse_duplicates(wheels: Iterable[IndexedWheel]) -> None:
    """Two files pip cannot tell apart (one project, version, build tag and
    platform tags, spelled differently) would make the index ambiguous."""
    seen: dict[tuple, str] = {}
    for wheel in wheels:
        key = parse_wheel_filename(wheel.filename)
        if key in seen:
            raise OverlayError(
                f"{seen[key]} and {wheel.filename} name one wheel "
                f"({wheel.project} {key[1]}): keep one of them"
            )
        seen[key] = wheel.filename


def _wheel_base(url: str) -> str:
    """`url` without its trailing slash, when it can prefix a file name."""
    problem = _url_problem(url)
    if problem is not None:
        raise OverlayError(f"--wheel-url {url!r} {problem}")
    return url.rstrip("/")


def _url_problem(url: str) -> str | None:
    """Why `url` cannot be where wheels are hosted; None when it can."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "is not an http(s) URL of the folder that holds the wheels"
    if parts.query or parts.fragment:
        return "must have no query or fragment"
    return None


def _check_out(out: Path) -> None:
    if out.is_dir():
        if any(out.iterdir()):
            raise OverlayError(
                f"{out} exists and is not empty: name a new folder for the index"
            )
    elif out.exists():
        raise OverlayError(f"{out} is a file, and the index needs a new folder")


def _write(
    root: Path, linked: list[IndexedWheel], wheels: list[IndexedWheel], base: str | None
) -> None:
    """The pages of every `linked` wheel; SHA256SUMS and, with `base`, the
    listing of `wheels`, those of this release (its assets)."""
    simple = root / SIMPLE_DIR
    projects = sorted({wheel.project for wheel in linked})
    simple.mkdir()
    (simple / "index.html").write_text(_root_page(projects), encoding="utf-8")
    for project in projects:
        own = [wheel for wheel in linked if wheel.project == project]
        folder = simple / project
        folder.mkdir()
        if base is None:
            for wheel in own:
                _copy(wheel, folder / wheel.filename)
        page = _project_page(project, own, base)
        (folder / "index.html").write_text(page, encoding="utf-8")
    sums = "".join(f"{wheel.sha256}  {wheel.filename}\n" for wheel in wheels)
    (root / SUMS_FILE).write_text(sums, encoding="utf-8")
    if base is not None:
        (root / LISTING_FILE).write_text(_listing(wheels, base), encoding="utf-8")


def _listing(wheels: list[IndexedWheel], base: str) -> str:
    entries = [
        {
            "filename": wheel.filename,
            "sha256": wheel.sha256,
            "requires_python": wheel.requires_python,
            "url": _href(wheel, base),
        }
        for wheel in wheels
    ]
    return json.dumps({"format": LISTING_FORMAT, "wheels": entries}, indent=1) + "\n"


def _href(wheel: IndexedWheel, base: str | None) -> str:
    """Where the index links `wheel`: its earlier release's URL, or at `base`,
    or beside the page."""
    if wheel.url is not None:
        return wheel.url
    return f"{base}/{quote(wheel.filename)}" if base else quote(wheel.filename)


def _copy(wheel: IndexedWheel, target: Path) -> None:
    """Copy a wheel of the folder (only those are copied: `earlier` needs a
    `base`); the copy must have the hash its link says."""
    shutil.copyfile(str(wheel.path), target)
    if sha256_of(target) != wheel.sha256:
        raise OverlayError(f"{wheel.path} changed while it was copied")


def _page(title: str, links: list[str]) -> str:
    """A PEP 503 page (repository version 1.0, PEP 629)."""
    body = "".join(f"    {link}<br>\n" for link in links)
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n"
        f"    <h1>{html.escape(title)}</h1>\n{body}  </body>\n</html>\n"
    )


def _root_page(projects: list[NormalizedName]) -> str:
    links = [f'<a href="{quote(p)}/">{html.escape(p)}</a>' for p in projects]
    return _page("Simple index", links)


def _project_page(
    project: NormalizedName, wheels: list[IndexedWheel], base: str | None
) -> str:
    links = []
    for wheel in wheels:
        href = _href(wheel, base)
        attributes = f'href="{html.escape(href)}#sha256={wheel.sha256}"'
        if wheel.requires_python:
            attributes += (
                f' data-requires-python="{html.escape(wheel.requires_python)}"'
            )
        links.append(f"<a {attributes}>{html.escape(wheel.filename)}</a>")
    return _page(f"Links for {project}", links)
