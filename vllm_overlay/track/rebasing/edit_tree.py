"""`vllm-overlay edit RELEASE DIR`: a release's series as a git tree to edit.

A series is generated (`refresh` writes it from a git tree), so a patch is
changed in a tree, not in its file: the release's upstream files tagged
`upstream`, then one commit a patch, as `rebase` and `refresh --check` build
it (`scratch_tree`). The maintainer edits, amends or rebases the commits, and
`vllm-overlay refresh RELEASE --repo DIR --base upstream` writes the series
back.
"""

from collections.abc import Iterable
from pathlib import Path

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import cache_root, patches_root
from vllm_overlay.series.loader import release_series
from vllm_overlay.series.pins import Dist
from vllm_overlay.track.workspace.scratch_tree import (
    UPSTREAM_TAG,
    materialize,
    pristine_files,
)
from vllm_overlay.upstream.fetch import fetch_sdist_tree, fetch_wheel, wheel_members

# Upstream's tests come from the sdist; everything else from the wheel.
_TESTS = "tests/"


def open_series(
    version: str,
    dest: Path,
    files: Iterable[str] = (),
    root: Path | None = None,
    cache: Path | None = None,
) -> Path:
    """Write the release's series as a git tree at `dest` (a new folder),
    with upstream's `files` besides those the series touches (a file a new
    change needs: `vllm/...` from the pinned `vllm` wheel, `tests/...` from
    the sdist), and return it."""
    if dest.exists():
        raise OverlayError(f"{dest} already exists; name a new folder")
    root = root or patches_root()
    cache = cache or cache_root()
    series = release_series(version, root)
    files = sorted(set(files))
    wheel = fetch_wheel(series.release, Dist.VLLM, cache).path
    needs_sdist = series.upstream_test_files or any(
        name.startswith(_TESTS) for name in files
    )
    sdist = fetch_sdist_tree(series.release, cache) if needs_sdist else None
    originals = pristine_files(series, wheel, sdist)
    from_wheel = wheel_members(wheel, [n for n in files if not n.startswith(_TESTS)])
    originals.update(from_wheel)
    for name in files:
        if name.startswith(_TESTS):
            assert sdist is not None
            source = sdist / name
            if source.is_file():
                originals[name] = source.read_bytes()
        if name not in originals:
            raise OverlayError(
                f"vLLM {series.release.version} has no {name} (a path in its "
                f"wheel, or tests/... in its sdist); nothing was written"
            )
    return materialize(series, originals, dest)


def refresh_command(version: str, dest: Path) -> str:
    """The command that writes the edited series back."""
    return f"vllm-overlay refresh {version} --repo {dest} --base {UPSTREAM_TAG}"
