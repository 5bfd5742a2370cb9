"""One release end to end: pinned wheel -> verified -> series applied -> wheel."""

from pathlib import Path

from packaging.version import Version

from vllm_overlay.build.fetch import fetch_wheel
from vllm_overlay.build.wheel import SourceWheel, build_patched_wheel
from vllm_overlay.locations import PINS_FILE, cache_root, patches_root
from vllm_overlay.series.model import Series, has_series, load_series
from vllm_overlay.series.pins import ReleasePin, load_pins, resolve_release


def pinned_releases(root: Path | None = None) -> dict[str, ReleasePin]:
    root = root or patches_root()
    return load_pins(root / PINS_FILE)


def nearest_release(pins: dict[str, ReleasePin], version: str) -> ReleasePin:
    """The pinned release whose series best fits `version`: the greatest one
    not after it (upstream changes accumulate, so the newest older series is
    closest), else the oldest pinned one."""
    ordered = sorted(pins, key=Version)
    older = [v for v in ordered if Version(v) <= Version(version)]
    return pins[older[-1] if older else ordered[0]]


def nearest_series(
    root: Path, pins: dict[str, ReleasePin], version: str
) -> ReleasePin | None:
    """`nearest_release` among the pinned releases that have a series (None
    when none has one yet): a release pinned but not rebased onto yet has
    nothing to offer."""
    with_series = {v: pin for v, pin in pins.items() if has_series(root, v)}
    return nearest_release(with_series, version) if with_series else None


def release_series(version: str | None, root: Path | None = None) -> Series:
    """The validated series of a pinned release (the newest when None)."""
    root = root or patches_root()
    release = resolve_release(pinned_releases(root), version)
    return load_series(root, release)


def build_release(
    version: str | None,
    dist: str,
    out_dir: Path,
    root: Path | None = None,
    cache: Path | None = None,
) -> Path:
    """Build the patched wheel of a pinned release from its pinned `dist` wheel.

    The series is validated before anything is downloaded, so a defect in it
    costs no bandwidth.
    """
    series = release_series(version, root)
    wheel = series.release.wheel_for(dist)
    path = fetch_wheel(series.release, wheel, cache or cache_root())
    return build_patched_wheel(SourceWheel(path, wheel.sha256, dist), series, out_dir)
