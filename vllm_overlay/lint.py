"""`vllm-overlay lint`: every defect of every series, in one run."""

from pathlib import Path

from vllm_overlay.errors import OverlayError
from vllm_overlay.history import read_history
from vllm_overlay.pins import load_pins
from vllm_overlay.release import PINS_FILE
from vllm_overlay.series import SERIES_FILE, series_dir, series_problems
from vllm_overlay.verdicts import read_verdicts


def lint(patches_root: Path) -> list[str]:
    """One-line problems: pins, series files, patch files, trailers, probes,
    the history of dropped patches and the recorded verdicts."""
    try:
        pins = load_pins(patches_root / PINS_FILE)
    except OverlayError as exc:
        return [str(exc)]
    problems = []
    for version in pins:
        if not (series_dir(patches_root, version) / SERIES_FILE).is_file():
            problems.append(f"vLLM {version} is pinned but has no series")
    for directory in sorted((patches_root / "vllm").glob("v*")):
        if not directory.is_dir():
            continue
        if directory.name[1:] not in pins:
            problems.append(f"{directory}: release {directory.name[1:]} is not pinned")
        problems.extend(series_problems(directory, patches_root.parent))
    for reader in (read_history, read_verdicts):
        try:
            reader(patches_root)
        except OverlayError as exc:
            problems.append(str(exc))
    return problems
