"""Whether a longer NIXL lease keeps a loaded P/D pair from reading released
blocks, and what it costs: the tiny Qwen3.5 hybrid's prefill and decode
`vllm serve` over plain NixlConnector behind upstream's toy proxy
(`ci/suites/pd/pair.py`), the decode cache capped as in the CPU suite's load runs,
`vllm bench serve` at concurrency 12 (`ci/suites/pd/load.py`'s load run: the same
verdict inputs, counted the same way).

The prefill side keeps a finished request's KV for `kv_lease_duration`
seconds (30 by default, nixl/base_scheduler.py:82-85 in 0.32.0), renewed by
the decode side's heartbeats every lease/6 seconds for another 2/3 of it
(:88; base_worker.py:528-532). A decode engine that stalls longer than the
renewal lets leases expire, and its later reads then take blocks the prefill
side has released ("Potentially invalid KV blocks", pull_worker.py:664-671).
Arms: each build of `--builds` with vLLM's default lease and with
`--long-lease` seconds, set on both servers; rounds interleave the arms.
Per arm: expired leases and reads of released blocks per run, median TTFT
and output tokens/s; the throughput ratio long/default with its spread.

Usage: python -m benchmarks.pd_lease [RELEASE] [--rounds N]
    [--long-lease S] [--builds unpatched patched]
(the release's test environment must exist: tools/test.sh RELEASE)
"""

import statistics
import sys
from contextlib import ExitStack
from dataclasses import replace

from benchmarks.pd_decode_reuse import rounds_parser
from ci.suites.pd.cases import CASE_BY_KEY, DECODE_CAP_BLOCKS, HYBRID
from ci.suites.pd.load import WORKLOAD, LoadRun, run_load
from ci.suites.pd.pair import PATCHED, UNPATCHED, nixl_with_lease, start_pair
from ci.suites.pd_e2e import make_layout
from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.common.locations import cache_root

DEFAULT_LEASE_S = 30
CONCURRENCY = 12


def measure(
    release: str, rounds: int, builds: list[str], long_lease: int
) -> dict[tuple[str, int], list[LoadRun]]:
    case = CASE_BY_KEY["hybrid-nixl"]
    layout = make_layout(release, cache_root(), [case])
    workload = replace(WORKLOAD, concurrency=CONCURRENCY, output_len=32)
    arms = [
        (build, lease) for build in builds for lease in (DEFAULT_LEASE_S, long_lease)
    ]
    runs: dict[tuple[str, int], list[LoadRun]] = {arm: [] for arm in arms}
    for round_ in range(rounds):
        for build, lease in arms:
            tag = f"lease-{lease}-r{round_}"
            config = nixl_with_lease(lease)
            run = LoadRun(build, case)
            with ExitStack() as stack:
                pair = start_pair(
                    stack,
                    layout,
                    build,
                    HYBRID,
                    config,
                    tag,
                    decode_args=case.decode_args,
                    prefill_config=config,
                )
                run_load(
                    layout,
                    pair,
                    run,
                    layout.logs / f"bench-{build}-{tag}.json",
                    replace(workload, seed=round_),
                )
                pair.stop()
            runs[(build, lease)].append(run)
            print(
                f"round {round_ + 1}/{rounds}: {build}, lease {lease} s: "
                f"{run.expired_leases} expired, {run.invalid_reads} released reads",
                flush=True,
            )
    return runs


def report(runs: dict[tuple[str, int], list[LoadRun]], rounds: int) -> None:
    print(
        f"\n{rounds} rounds; per run: {WORKLOAD.prompts} requests, concurrency "
        f"{CONCURRENCY}, decode cache {DECODE_CAP_BLOCKS[HYBRID]} blocks"
    )
    print(
        "| build | lease | expired leases per run | reads of released blocks per "
        "run | median TTFT | output tok/s | failed |"
    )
    print("|---|---|---|---|---|---|---|")
    for (build, lease), arm in runs.items():
        benches = [run.bench for run in arm if run.bench is not None]
        print(
            f"| {build} | {lease} s | {[run.expired_leases for run in arm]} | "
            f"{[run.invalid_reads for run in arm]} | "
            f"{statistics.median(b.median_ttft_s for b in benches):.2f} s | "
            f"{statistics.median(b.output_throughput for b in benches):.1f} | "
            f"{sum(b.failed for b in benches)} |"
        )
    for build in dict.fromkeys(build for build, _ in runs):
        default, long = (arm for (b, _), arm in runs.items() if b == build)
        ratios = [
            b.bench.output_throughput / a.bench.output_throughput
            for a, b in zip(default, long, strict=True)
            if a.bench is not None and b.bench is not None
        ]
        if ratios:
            print(
                f"{build}: output tok/s long / default lease x"
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            )


def main(argv: list[str] | None = None) -> int:
    parser = rounds_parser(__doc__)
    parser.add_argument("--long-lease", type=int, default=300, help="seconds")
    parser.add_argument(
        "--builds",
        nargs="+",
        choices=(UNPATCHED, PATCHED),
        default=[UNPATCHED],
    )
    args = parser.parse_args(argv)
    if args.long_lease <= DEFAULT_LEASE_S:
        parser.error(f"--long-lease must be above vLLM's {DEFAULT_LEASE_S} s")
    try:
        runs = measure(args.release, args.rounds, args.builds, args.long_lease)
    except OverlayError as exc:
        report_error(exc)
        return 1
    print(f"vLLM {args.release}, tiny Qwen3.5 hybrid, plain NixlConnector")
    report(runs, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
