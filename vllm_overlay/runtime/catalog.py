"""Which series applies to an installed release, checkout or installed wheel.

In a checkout the series live in `patches/` (or `$VLLM_OVERLAY_PATCHES`); an
installed vllm-overlay wheel carries the same tree as package data under
`vllm_overlay/patches/` (see `pyproject.toml`). The series are not linted here:
that needs the probe files, which only a checkout has, and every series was
linted before it was committed; each patch file is still parsed and checked
for its format.
"""

from packaging.version import Version

from vllm_overlay.errors import OverlayError
from vllm_overlay.locations import PINS_FILE, series_root
from vllm_overlay.series.model import (
    SERIES_FILE,
    Series,
    parse_patch,
    read_series_file,
    series_dir,
)
from vllm_overlay.series.pins import load_pins


def series_for(release: str) -> Series:
    """The series of `release`, or an `OverlayError` saying there is none."""
    root = series_root()
    pins = load_pins(root / PINS_FILE)
    directory = series_dir(root, release)
    if release not in pins or not (directory / SERIES_FILE).is_file():
        have = [v for v in pins if (series_dir(root, v) / SERIES_FILE).is_file()]
        listed = ", ".join(sorted(have, key=Version))
        raise OverlayError(
            f"vLLM {release} has no series in vllm-overlay (series exist for: "
            f"{listed or 'none'}); use plain `vllm serve`"
        )
    names = read_series_file(directory / SERIES_FILE)
    patches = tuple(parse_patch(directory / name) for name in names)
    return Series(pins[release], directory, patches)
