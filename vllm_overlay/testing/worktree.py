"""pytest plugin: run tests against the series in this checkout, applied to
the installed release's pristine sources, without rebuilding or reinstalling
the wheel.

While a patch is being written the installed patched wheel carries the last
built series, and swapping wheels in a shared release environment would pull
it out from under any other run. This plugin instead applies the checkout's
series for the installed release to the pristine upstream files (from the
verified pinned source wheel) and serves the result in place of the installed
modules, exactly as the wheel would ship them. Files the installed series
patched but the checkout's no longer does are served pristine.

Use: `pytest -p vllm_overlay.testing.worktree TESTS...` with this checkout on
`PYTHONPATH`. The harness never uses it: CI tests the built wheel.
"""

import tempfile
from pathlib import Path

import pytest

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.runtime import source_overlay
from vllm_overlay.series.loader import release_series
from vllm_overlay.series.manifest import read_installed_manifest
from vllm_overlay.testing.pristine import installed_touched_files, pristine_sources
from vllm_overlay.upstream.applier import apply_series

_SCRATCH = pytest.StashKey[tempfile.TemporaryDirectory[str]]()
_SERIES = pytest.StashKey[str]()


def worktree_sources(manifest: dict, scratch: Path) -> tuple[str, dict[str, Path]]:
    """The checkout's series id and module name -> patched (or pristine) file."""
    try:
        series = release_series(manifest["release"])
    except OverlayError as exc:
        raise pytest.UsageError(str(exc)) from None
    relatives = installed_touched_files(manifest) | set(series.touched_files)
    pristine = pristine_sources(manifest, relatives, scratch)
    by_path = {relative: source_overlay.module_name(relative) for relative in relatives}
    originals = {rel: pristine[mod].read_bytes() for rel, mod in by_path.items()}
    try:
        patched = apply_series(series, originals)
    except OverlayError as exc:
        raise pytest.UsageError(str(exc)) from None
    for relative, content in patched.items():
        if content is not None:
            pristine[by_path[relative]].write_bytes(content)
    return f"{series.series_id} ({len(series.patches)} patches)", pristine


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Install the overlay before any conftest or test module imports vLLM."""
    manifest = read_installed_manifest()
    if manifest is None:
        raise pytest.UsageError(
            "the installed vLLM carries no vllm-overlay series manifest; build "
            "and install the release once with the harness first"
        )
    scratch = tempfile.TemporaryDirectory(prefix="vllm-overlay-worktree-")
    early_config.stash[_SCRATCH] = scratch
    label, sources = worktree_sources(manifest, Path(scratch.name))
    early_config.stash[_SERIES] = label
    source_overlay.install(sources)


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash[_SCRATCH].cleanup()


def pytest_report_header(config: pytest.Config) -> str:
    series = config.stash[_SERIES]
    return f"vllm-overlay: vLLM sources patched by this checkout's {series}"
