"""The plugin that tests this checkout's series without rebuilding the wheel."""

import json

import pytest
from conftest import SCHEDULER, sha256_file

CHECK = """
import importlib.util
from pathlib import Path

def test_scheduler_source():
    spec = importlib.util.find_spec("vllm.v1.core.sched.scheduler")
    text = Path(spec.origin).read_text()
    assert "line twenty, patched" in text
    assert "installed build" not in text

def test_stats_source():
    spec = importlib.util.find_spec("vllm.v1.metrics.stats")
    assert Path(spec.origin).read_text() == "STATS = 1\\n"
"""


@pytest.fixture
def installed(project, pytester, monkeypatch, tmp_path):
    """An installed patched `vllm` built from an older series: it patched the
    stats module (which the checkout's series no longer touches) and holds a
    stale scheduler."""
    site = tmp_path / "site"
    for package in ("vllm", "vllm/v1", "vllm/v1/core", "vllm/v1/core/sched"):
        (site / package).mkdir(parents=True, exist_ok=True)
        (site / package / "__init__.py").write_text("")
    (site / "vllm/v1/metrics").mkdir()
    (site / "vllm/v1/metrics/__init__.py").write_text("")
    (site / "vllm/v1/metrics/stats.py").write_text("STATS = 2\n")
    (site / SCHEDULER).write_text("# installed build\n")
    source = next((project.cache / "wheels").iterdir())
    manifest = {
        "format": 1,
        "release": "9.9.0",
        "source": {"filename": source.name, "sha256": sha256_file(source)},
        "patches": [{"name": "old.patch", "files": ["vllm/v1/metrics/stats.py"]}],
    }
    (site / "vllm" / "_overlay_series.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("PYTHONPATH", str(site))
    pytester.makepyfile(test_check=CHECK)
    return site


def test_serves_the_checkout_series_over_pristine_sources(pytester, installed):
    result = pytester.runpytest_subprocess("-p", "vllm_overlay.testing.worktree")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*patched by this checkout's vllm-9.9.0+hybridkv.1*"])


def test_refuses_a_series_that_does_not_apply(pytester, installed, project):
    patch = project.series_dir / "scheduler-demo.patch"
    patch.write_text(patch.read_text().replace("-line 20\n", "-line 20 moved\n"))
    result = pytester.runpytest_subprocess("-p", "vllm_overlay.testing.worktree")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*scheduler-demo.patch does not apply exactly*"])


def test_refuses_an_unpatched_install(pytester, installed):
    (installed / "vllm" / "_overlay_series.json").unlink()
    result = pytester.runpytest_subprocess("-p", "vllm_overlay.testing.worktree")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*carries no vllm-overlay series manifest*"])
