"""One release end to end: pinned wheel -> verified -> series applied -> wheel."""

from pathlib import Path

from vllm_overlay.fetch import fetch_wheel
from vllm_overlay.locations import PINS_FILE, cache_root, patches_root
from vllm_overlay.pins import ReleasePin, load_pins, resolve_release
from vllm_overlay.series import Series, load_series
from vllm_overlay.wheelbuild import SourceWheel, build_patched_wheel


def pinned_releases(root: Path | None = None) -> dict[str, ReleasePin]:
    root = root or patches_root()
    return load_pins(root / PINS_FILE)


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
