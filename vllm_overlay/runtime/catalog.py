"""Which series applies to an installed release, checkout or installed wheel.

In a checkout the series live in `patches/` (or `$VLLM_OVERLAY_PATCHES`); an
installed vllm-overlay wheel carries the same tree as package data under
`vllm_overlay/patches/` (see `pyproject.toml`). The series are not linted here:
that needs the probe files, which only a checkout has, and every series was
linted before it was committed; each patch file is still parsed and checked
for its format (`series.loader.read_series`).
"""

from packaging.version import Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import PINS_FILE, series_root
from vllm_overlay.series.loader import read_series
from vllm_overlay.series.model import Series, has_series
from vllm_overlay.series.pins import load_pins


def series_for(release: str) -> Series:
    """The series of `release`, or an `OverlayError` saying there is none."""
    root = series_root()
    pins = load_pins(root / PINS_FILE)
    if release not in pins or not has_series(root, release):
        have = [v for v in pins if has_series(root, v)]
        listed = ", ".join(sorted(have, key=Version))
        raise OverlayError(
            f"vLLM {release} has no series in vllm-overlay (series exist for: "
            f"{listed or 'none'}); use plain `vllm serve`"
        )
    return read_series(root, pins[release])
