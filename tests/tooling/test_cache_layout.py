"""A cache that cannot hold its folders is refused with one error line, by
the harness as by the command line, never with a traceback from the lock or
the write that meets the file first."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import REPO_ROOT
from vllm_overlay.common.locking import exclusive


def test_a_file_where_a_cache_folder_belongs_is_refused_by_the_lock(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache_layout.wheels(cache).write_text("not a folder")
    with pytest.raises(OverlayError) as caught, exclusive(cache_layout.wheels(cache)):
        pytest.fail("locked a file")
    assert str(caught.value) == (
        f"cannot lock {cache / 'wheels'}: {cache / 'wheels'} is a file where a "
        "folder belongs; move it away"
    )


def test_a_lock_below_a_file_names_the_file(tmp_path):
    blocker = tmp_path / "envs"
    blocker.write_text("")
    lock = cache_layout.release_env_lock(tmp_path, "0.32.0")
    refused = pytest.raises(OverlayError, match=f"{blocker} is a file where a folder")
    with refused, exclusive(lock):
        pytest.fail("locked below a file")


def test_the_harness_refuses_a_cache_that_is_a_file_in_one_line(tmp_path):
    cache = tmp_path / "cache"
    cache.write_text("")
    env = {**os.environ, "VLLM_OVERLAY_CACHE": str(cache), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "ci.harness", "--release-only", "0.32.0"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"vllm-overlay: error: the cache {cache} (from $VLLM_OVERLAY_CACHE) cannot "
        f"be a folder: {cache} is a file; set VLLM_OVERLAY_CACHE to a folder"
    ]


def test_every_folder_is_under_the_cache_it_is_given():
    """Each location is a function of the cache root, so that `--cache` and
    `$VLLM_OVERLAY_CACHE` move all of them together."""
    root = Path("/cache")
    folders = [
        cache_layout.wheels(root),
        cache_layout.sdist_tree(root, "0.32.0"),
        cache_layout.release_env(root, "0.32.0"),
        cache_layout.upstream_tests(root, "0.32.0"),
        cache_layout.unpatched_envs(root),
        cache_layout.pd_e2e(root).models,
        cache_layout.gpu_env(root, "0.32.0"),
    ]
    assert all(folder.is_relative_to(root) for folder in folders)
    assert cache_layout.sdist_tree(root, "0.32.0") == root / "sources/vllm-0.32.0"
