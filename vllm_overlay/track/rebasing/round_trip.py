"""`vllm-overlay refresh --check`: is `patches/` exactly what a refresh writes?

The series is materialized as a scratch tree (`scratch_tree`) and exported
again (`refresh`); any file that comes back different is a hand edit a
refresh would undo, or a patch written by another tool.
"""

import tempfile
from pathlib import Path

from vllm_overlay.common.locations import cache_root, patches_root
from vllm_overlay.series.loader import release_series
from vllm_overlay.series.model import Series
from vllm_overlay.series.pins import Dist
from vllm_overlay.track.rebasing.refresh import export_series, series_diff
from vllm_overlay.track.workspace.scratch_tree import (
    UPSTREAM_TAG,
    materialize,
    pristine_files,
)
from vllm_overlay.upstream.fetch import fetch_sdist_tree, fetch_wheel


def check_round_trip(
    series: Series, wheel: Path, sdist_tree: Path | None, root: Path
) -> list[str]:
    """The files of the release's series that a refresh of the series itself
    would change; empty when `patches/` is exactly what refresh writes."""
    originals = pristine_files(series, wheel, sdist_tree)
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-refresh-") as scratch:
        repo = materialize(series, originals, Path(scratch) / "tree")
        exported = export_series(repo, UPSTREAM_TAG, series.release.version, root)
    return series_diff(exported, series.release.version, series.directory)


def refresh_check(
    version: str, root: Path | None = None, cache: Path | None = None
) -> list[str]:
    """`vllm-overlay refresh RELEASE --check`: the round trip on the pinned
    `vllm` wheel, plus the sdist only when the series touches `tests/`."""
    root = root or patches_root()
    cache = cache or cache_root()
    series = release_series(version, root)
    wheel = fetch_wheel(series.release, Dist.VLLM, cache).path
    sdist = (
        fetch_sdist_tree(series.release, cache) if series.upstream_test_files else None
    )
    return check_round_trip(series, wheel, sdist, root)
