"""The harness pieces that decide what CI reports: JUnit counting and the
upstream-cleanup plugin."""

import os
from pathlib import Path

import pytest

from ci.suites.pytest_runs import (
    PLATFORM_VAR,
    Counts,
    junit_counts,
    our_deselection_args,
    pytest_command,
    pytest_environment,
)
from vllm_overlay.common.errors import OverlayError

PLUGINS = Path(__file__).resolve().parents[2] / "ci" / "suites" / "pytest_plugins"

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="3" tests="10">
</testsuite></testsuites>
"""


def test_junit_counts(tmp_path):
    report = tmp_path / "r.xml"
    report.write_text(JUNIT)
    assert junit_counts(report) == Counts(passed=4, failed=3, skipped=3)
    assert str(junit_counts(report)) == "4 passed, 3 failed, 3 skipped"


def test_missing_report_counts_as_a_failure(tmp_path):
    assert junit_counts(tmp_path / "absent.xml") == Counts(failed=1)


def test_counts_add_up():
    assert Counts(1, 2, 3) + Counts(10, 20, 30) == Counts(11, 22, 33)


SKIP_CHECKS = """
def marked(request):
    return request.node.get_closest_marker("skip_global_cleanup") is not None

def test_unit(request):
    assert marked(request)

def test_engine(request):
    llm = "LLM(" and None
    assert not marked(request)

def test_distributed(request, dist_init):
    assert not marked(request)
"""


@pytest.mark.parametrize("plugin", [True, False])
def test_cleanup_is_skipped_only_where_no_engine_is_involved(
    pytester, monkeypatch, plugin
):
    monkeypatch.setenv("PYTHONPATH", str(PLUGINS))
    pytester.makeconftest(
        "import pytest\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'skip_global_cleanup: x')\n"
        "@pytest.fixture\n"
        "def dist_init():\n"
        "    return None\n"
    )
    pytester.makepyfile(test_marks=SKIP_CHECKS)
    args = ["-p", "skip_cpu_global_cleanup"] if plugin else []
    result = pytester.runpytest_subprocess(*args)
    if plugin:
        result.assert_outcomes(passed=3)
    else:
        result.assert_outcomes(passed=2, failed=1)


def test_pytest_runs_inherit_neither_pythonpath_nor_the_platform(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv(PLATFORM_VAR, "cuda")
    env = pytest_environment({"HF_HUB_OFFLINE": "1"}, [Path("/a"), Path("/b")])
    assert env["PYTHONPATH"] == os.pathsep.join(["/a", "/b"])
    assert PLATFORM_VAR not in env
    assert env["HF_HUB_OFFLINE"] == "1"
    assert pytest_environment({PLATFORM_VAR: "cpu"}, [])[PLATFORM_VAR] == "cpu"
    command = pytest_command(Path("/venv"), "-x")
    assert command == [
        "/venv/bin/python",
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-x",
    ]


def test_probes_a_series_does_not_carry_are_left_out_for_that_release_only():
    backport_probes = "--ignore=tests/probes/test_nixl_worker_hybrid_blocks.py"
    assert backport_probes in our_deselection_args("0.32.0")
    assert backport_probes not in our_deselection_args("0.22.1")


def test_a_deselection_of_our_tests_naming_no_test_is_refused(tmp_path):
    listed = tmp_path / "deselected.toml"
    listed.write_text(
        '[[deselect]]\ntest = "tests/probes/test_gone.py"\n'
        'until = "0.22.1"\nreason = "not carried"\n'
    )
    with pytest.raises(OverlayError, match=r"test_gone\.py"):
        our_deselection_args("0.22.1", listed)
