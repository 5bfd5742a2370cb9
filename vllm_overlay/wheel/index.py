"""A PEP 503 "simple" package index as static files, from a folder of wheels.

What the release workflow publishes, so that users install a patched build
with plain pip and nothing of this project: `pip install --extra-index-url
BASE/simple "vllm==0.33.0+hybridkv.N"`. Any static file host serves it
(GitHub Pages, a bucket, `python -m http.server`):

    OUT/simple/index.html            one link per project, `vllm/`
    OUT/simple/<project>/index.html  one link per wheel, `#sha256=...`
    OUT/simple/<project>/<wheel>     the wheels, copied (without --wheel-url)
    OUT/SHA256SUMS                   `sha256sum -c` lines, one per wheel

A project's name is normalised as PEP 503 says (`packaging.utils`), and a
link carries `data-requires-python` when the wheel's METADATA has
`Requires-Python`, so that pip skips a wheel the interpreter cannot run
before downloading it. pip checks each download against its `#sha256`.

vLLM's wheels are hundreds of megabytes, over what GitHub Pages serves per
file, so `wheel_url` lets the pages link to the wheels where they are
hosted instead (a GitHub release's assets); nothing else changes.

The index is written whole or not at all: into a scratch folder beside OUT,
renamed into place at the end. Every wheel is read and checked before the
first byte is written, so a bad input leaves nothing behind.
"""

import html
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

from vllm_overlay import atomic
from vllm_overlay.errors import OverlayError
from vllm_overlay.upstream.fetch import (
    UNREADABLE,
    open_wheel,
    sha256_of,
    unreadable_wheel,
)

SIMPLE_DIR = "simple"
SUMS_FILE = "SHA256SUMS"
_METADATA = re.compile(r"[^/]+\.dist-info/METADATA")


@dataclass(frozen=True)
class IndexedWheel:
    """One wheel of the index, as its link says it."""

    path: Path
    project: NormalizedName
    sha256: str
    requires_python: str | None

    @property
    def filename(self) -> str:
        return self.path.name


def write_index(
    dist_dir: Path, out: Path, wheel_url: str | None = None
) -> list[IndexedWheel]:
    """Write the index of every wheel in `dist_dir` into the new folder `out`
    (absent, or an empty folder), the wheels copied beside their project's
    page, or linked at `wheel_url/<file>` when given; returns the wheels."""
    base = _wheel_base(wheel_url) if wheel_url is not None else None
    wheels = read_wheels(dist_dir)
    _check_out(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:
        raise OverlayError(f"cannot write {out}: {exc.strerror or exc}") from None
    try:
        _write(staging, wheels, base)
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
    return IndexedWheel(path, project, sha256_of(path), raw.get("requires_python"))


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _refuse_duplicates(wheels: Iterable[IndexedWheel]) -> None:
    """Two files pip cannot tell apart (one project, version, build tag and
    platform tags, spelled differently) would make the index ambiguous."""
    seen: dict[tuple, Path] = {}
    for wheel in wheels:
        key = parse_wheel_filename(wheel.filename)
        if key in seen:
            raise OverlayError(
                f"{seen[key].name} and {wheel.filename} name one wheel "
                f"({wheel.project} {key[1]}): keep one of them"
            )
        seen[key] = wheel.path


def _wheel_base(url: str) -> str:
    """`url` without its trailing slash, when it can prefix a file name."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise OverlayError(
            f"--wheel-url {url!r} is not an http(s) URL of the folder that "
            "holds the wheels"
        )
    if parts.query or parts.fragment:
        raise OverlayError(f"--wheel-url {url!r} must have no query or fragment")
    return url.rstrip("/")


def _check_out(out: Path) -> None:
    if out.is_dir():
        if any(out.iterdir()):
            raise OverlayError(
                f"{out} exists and is not empty: name a new folder for the index"
            )
    elif out.exists():
        raise OverlayError(f"{out} is a file, and the index needs a new folder")


def _write(root: Path, wheels: list[IndexedWheel], base: str | None) -> None:
    simple = root / SIMPLE_DIR
    projects = sorted({wheel.project for wheel in wheels})
    simple.mkdir()
    (simple / "index.html").write_text(_root_page(projects), encoding="utf-8")
    for project in projects:
        own = [wheel for wheel in wheels if wheel.project == project]
        folder = simple / project
        folder.mkdir()
        if base is None:
            for wheel in own:
                _copy(wheel, folder / wheel.filename)
        page = _project_page(project, own, base)
        (folder / "index.html").write_text(page, encoding="utf-8")
    sums = "".join(f"{wheel.sha256}  {wheel.filename}\n" for wheel in wheels)
    (root / SUMS_FILE).write_text(sums, encoding="utf-8")


def _copy(wheel: IndexedWheel, target: Path) -> None:
    """Copy the wheel; the copy must have the hash its link says."""
    shutil.copyfile(wheel.path, target)
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
        href = quote(wheel.filename)
        if base is not None:
            href = f"{base}/{href}"
        attributes = f'href="{html.escape(href)}#sha256={wheel.sha256}"'
        if wheel.requires_python:
            attributes += (
                f' data-requires-python="{html.escape(wheel.requires_python)}"'
            )
        links.append(f"<a {attributes}>{html.escape(wheel.filename)}</a>")
    return _page(f"Links for {project}", links)
