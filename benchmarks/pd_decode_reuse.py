"""What the P/D decode-side patch changes for a hybrid model under load,
measured with vLLM's own `vllm bench serve` (`ci/suites/pd/bench.py`, the unpatched
release's client for every arm): a prefill and a decode `vllm serve` of the
tiny Qwen3.5 hybrid behind upstream's toy proxy (`ci/suites/pd/pair.py`; on the
CPU layout each server confined to a core of its own), `prefix_repetition`
requests, greedy.

Arms: one server without a connector (the yardstick), and the P/D pair with
the decode side behind plain NixlConnector or MultiConnector[NixlConnector,
DecodeBenchConnector], each on the unpatched and the patched build. Cells:
each concurrency of `--concurrency`, with the decode server's KV cache
uncapped (1 GiB) and capped to three requests' worth
(`ci/suites/pd/cases.py` DECODE_CAP_BLOCKS); in a capped cell the one server gets
the same cap, the KV cache the decode side has, so that its requests queue
for blocks as the pair's do (the ratios also give the uncapped one server,
the yardstick of earlier runs). A round starts every arm afresh, once
per cache setting, the arms in turn, and runs every concurrency on it, each
with prompts of its own (a seed per round and concurrency, so no run finds
another's prefix cached): on the CPU layout, 4 requests per client and at
least 16 (16, 16, 48 at concurrency 1, 4, 12), so a cell of one request at
a time takes about as long as one of many; the rounds repeat that. Per cell and arm: the
median over rounds of median and p99 TTFT, median TPOT, output tokens/s,
the decode server's local-hit and pulled prompt tokens, the CPU seconds
each server's processes used (on the CPU layout a server's busy core slows
the other: the client and the proxy run on either), and the prefill
side's expired leases and reads of blocks it had released (`ci/suites/pd/load.py`);
every ratio is printed as its median over rounds
with its spread (min-max), each round's ratio taken between runs of the
same round.

The model is tiny and the machine a CPU: the times say how transfer and
scheduling compare here, not what a GPU deployment of a real model gains.
`--workload seed` is the seed's layout for a GPU runner (16,384-token
prefixes, 2 of them, 1,024-token suffixes, 512 prompts; use it with
`--concurrency 256`).

Usage: python -m benchmarks.pd_decode_reuse [RELEASE] [--rounds N]
    [--concurrency C ...] [--prompts N] [--output-len N] [--workload seed]
(the release's test environment must exist: tools/test.sh RELEASE)
"""

import argparse
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from ci.suites.pd.bench import BenchResult, Workload, run_bench
from ci.suites.pd.cases import CASE_BY_KEY, DECODE_CAP_BLOCKS, HYBRID
from ci.suites.pd.load import EXPIRED_LEASE, INVALID_READ, SEED_WORKLOAD, count_lines
from ci.suites.pd.metrics import DecodeCounts, decode_counts, scrape
from ci.suites.pd.pair import (
    PATCHED,
    UNPATCHED,
    Layout,
    start_pair,
    start_vllm,
    wait_all,
)
from ci.suites.pd_e2e import make_layout
from ci.suites.servers import Server, session_cpu_seconds
from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.common.locations import cache_root
from vllm_overlay.series.facts import e2e_release

ONE_SERVER = "one server"


@dataclass(frozen=True)
class Arm:
    """What a round starts: its name in the tables, its build, its P/D case
    ("" for the one server), whether each server of the pair runs confined
    to its core (`ci/suites/pd/pair.py`) and the prefill server's build where
    it is not `build`."""

    name: str
    build: str
    case_key: str = ""
    confine: bool = True
    prefill_build: str | None = None


ARMS = (
    Arm(ONE_SERVER, UNPATCHED),
    Arm("NixlConnector, unpatched", UNPATCHED, "hybrid-nixl"),
    Arm("NixlConnector, patched", PATCHED, "hybrid-nixl"),
    Arm("MultiConnector, unpatched", UNPATCHED, "hybrid-multi"),
    Arm("MultiConnector, patched", PATCHED, "hybrid-multi"),
)
CACHES = ("uncapped", "capped")
CPU_WORKLOAD = Workload(prefix_len=1200, suffix_len=100, output_len=32)
# A run whose median TPOT is under this got most of its requests' tokens in
# one burst at their end (a token a millisecond is beyond this model here).
BURST_TPOT_S = 0.001
# Requests per run of the CPU layout: per client, and at least.
PROMPTS_PER_CLIENT, MIN_PROMPTS = 4, 16


@dataclass(frozen=True)
class Sample:
    """One `vllm bench serve` run of an arm, and what the servers counted."""

    bench: BenchResult
    counts: DecodeCounts | None
    expired_leases: int
    released_reads: int
    # CPU seconds each server used over the run: the one server's, or the
    # prefill and the decode server's. They include each worker's busy-wait
    # for the engine's next step (vLLM's shared-memory queue yields in a loop
    # for a second after each message, `shm_broadcast.py` `SpinCondition`),
    # which fills whatever its core leaves idle: the column shows where a
    # core's time went, not how much work a server did.
    cpu_s: tuple[float, ...]


# (cache, concurrency) -> arm name -> one Sample per round.
Results = dict[tuple[str, int], dict[str, list[Sample]]]


def run_arm(
    layout: Layout,
    arm: Arm,
    cache: str,
    workloads: Sequence[Workload],
    tag: str,
) -> list[Sample]:
    """A fresh server or pair of the arm, and every workload on it in turn;
    `cache` "capped" caps the decode server's KV cache, or the one server's."""
    case = CASE_BY_KEY[arm.case_key] if arm.case_key else None
    capped = ("--num-gpu-blocks-override", str(DECODE_CAP_BLOCKS[HYBRID]))
    cache_args = capped if cache == "capped" else ()
    samples = []
    with ExitStack() as stack:
        if case is None:
            server, port = start_vllm(
                stack,
                layout,
                arm.build,
                HYBRID,
                f"bench-one-{tag}",
                None,
                cores="0-1",
                extra_args=cache_args,
            )
            wait_all([(server, port, "/health")])
            target, decode_port = port, None
            prefill_log: Path | None = None
            servers: tuple[Server, ...] = (server,)
        else:
            pair = start_pair(
                stack,
                layout,
                arm.build,
                HYBRID,
                case.decode,
                f"bench-{tag}",
                decode_args=cache_args,
                confine=arm.confine,
                prefill_build=arm.prefill_build,
            )
            target, decode_port = pair.proxy_port, pair.decode_port
            prefill_log = pair.prefill.log
            servers = (pair.prefill, pair.decode)
        for workload in workloads:
            before = scrape(decode_port) if decode_port else None
            expired = count_lines(prefill_log, EXPIRED_LEASE) if prefill_log else 0
            released = count_lines(prefill_log, INVALID_READ) if prefill_log else 0
            cpu_before = [session_cpu_seconds(s.proc.pid) for s in servers]
            bench = run_bench(
                layout.envs[UNPATCHED],
                target,
                layout.models[HYBRID],
                workload,
                layout.logs / f"bench-{tag}-c{workload.concurrency}.json",
                layout.vllm_cache,
            )
            cpu_s = tuple(
                session_cpu_seconds(s.proc.pid) - b
                for s, b in zip(servers, cpu_before, strict=True)
            )
            counts = None
            if before is not None and decode_port is not None:
                counts = decode_counts(before, scrape(decode_port))
            if prefill_log is not None:
                expired = count_lines(prefill_log, EXPIRED_LEASE) - expired
                released = count_lines(prefill_log, INVALID_READ) - released
            if bench.failed:
                print(
                    f"  {arm.name}, {cache}, c{workload.concurrency}: "
                    f"{bench.failed} failed ({bench.failures[:1]})",
                    flush=True,
                )
            samples.append(Sample(bench, counts, expired, released, cpu_s))
    return samples


def measure(
    release: str,
    rounds: int,
    cells: Sequence[Workload],
    arms: Sequence[Arm] = ARMS,
    caches: Sequence[str] = CACHES,
    extra_envs: Mapping[str, Path] | None = None,
) -> Results:
    """Every arm on every cell's workload (one per concurrency) and cache
    setting, `rounds` times, interleaved as the module docstring says;
    `extra_envs` adds builds to the suite's, by name."""
    cases = [CASE_BY_KEY["hybrid-nixl"], CASE_BY_KEY["hybrid-multi"]]
    layout = make_layout(release, cache_root(), cases)
    layout = replace(layout, envs={**layout.envs, **(extra_envs or {})})
    concurrencies = [cell.concurrency for cell in cells]
    results: Results = {
        (cache, c): {arm.name: [] for arm in arms}
        for cache in caches
        for c in concurrencies
    }
    for round_ in range(rounds):
        workloads = [
            replace(cell, seed=1000 * round_ + cell.concurrency) for cell in cells
        ]
        for cache in caches:
            for arm in arms:
                tag = f"{cache}-{arm.name.replace(', ', '-')}-r{round_}"
                samples = run_arm(layout, arm, cache, workloads, tag.replace(" ", "-"))
                for c, sample in zip(concurrencies, samples, strict=True):
                    results[(cache, c)][arm.name].append(sample)
                print(
                    f"round {round_ + 1}/{rounds}: {cache}, {arm.name} done",
                    flush=True,
                )
    return results


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(ratios: Sequence[float]) -> str:
    """A ratio's median over rounds and its min-max."""
    return f"x{median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def ttft(bench: BenchResult) -> float:
    return bench.median_ttft_s


def throughput(bench: BenchResult) -> float:
    return bench.output_throughput


def ratio(
    tops: Sequence[Sample],
    bottoms: Sequence[Sample],
    metric: Callable[[BenchResult], float],
) -> str:
    """`metric` of `tops` over `bottoms`, round by round."""
    return spread(
        [metric(a.bench) / metric(b.bench) for a, b in zip(tops, bottoms, strict=True)]
    )


def report(results: Results, rounds: int, cells: Sequence[Workload]) -> None:
    arm_table(results, rounds, cells)
    ratio_table(results)


def arm_table(results: Results, rounds: int, cells: Sequence[Workload]) -> None:
    """Per cell and arm, the medians over rounds and the sums of counts."""
    print(f"\n{rounds} rounds, medians over rounds; per run:")
    for cell in cells:
        print(f"  {replace(cell, seed=0).describe().removesuffix(', seed 0')}")
    print(
        "| decode cache | concurrency | arm | median TTFT | p99 TTFT | median TPOT | "
        "output tok/s | runs delivered in a burst | local hit / pulled (decode) | "
        "CPU s (prefill / decode) | expired leases | reads of released blocks | "
        "failed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (cache, c), cell in results.items():
        for name, samples in cell.items():
            benches = [s.bench for s in samples]
            counts = [s.counts for s in samples if s.counts is not None]
            reuse = (
                f"{median([k.reused for k in counts]):,.0f} / "
                f"{median([k.pulled for k in counts]):,.0f}"
                if counts
                else "-"
            )
            print(
                f"| {cache} | {c} | {name} | "
                f"{median([b.median_ttft_s for b in benches]):.2f} s | "
                f"{median([b.p99_ttft_s for b in benches]):.2f} s | "
                f"{median([b.median_tpot_s for b in benches]) * 1000:.0f} ms | "
                f"{median([b.output_throughput for b in benches]):.1f} | "
                f"{sum(1 for b in benches if b.median_tpot_s < BURST_TPOT_S)} | "
                f"{reuse} | "
                f"{cpu_seconds(samples)} | "
                f"{sum(s.expired_leases for s in samples)} | "
                f"{sum(s.released_reads for s in samples)} | "
                f"{sum(b.failed for b in benches)} |"
            )


def cpu_seconds(samples: Sequence[Sample]) -> str:
    """Per server, the median over rounds of the CPU seconds it used."""
    servers = zip(*(s.cpu_s for s in samples), strict=True)
    return " / ".join(f"{median(list(used)):.1f}" for used in servers) or "-"


def ratio_table(results: Results) -> None:
    """The ratios the goals are set in, each per round."""
    print("\nRatios (median over rounds, min-max):")
    print(
        "| decode cache | concurrency | TTFT patched / unpatched Multi | "
        "tok/s patched / unpatched Multi | TTFT patched Multi / patched Nixl | "
        "TTFT patched Multi / one server | tok/s one server / patched Multi | "
        "TTFT patched Multi / one server, uncapped | "
        "tok/s one server, uncapped / patched Multi |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (cache, c), cell in results.items():
        multi, one = cell["MultiConnector, patched"], cell[ONE_SERVER]
        uncapped_one = results[("uncapped", c)][ONE_SERVER]
        cells = [
            ratio(multi, cell["MultiConnector, unpatched"], ttft),
            ratio(multi, cell["MultiConnector, unpatched"], throughput),
            ratio(multi, cell["NixlConnector, patched"], ttft),
            ratio(multi, one, ttft),
            ratio(one, multi, throughput),
            ratio(multi, uncapped_one, ttft),
            ratio(uncapped_one, multi, throughput),
        ]
        print(f"| {cache} | {c} | " + " | ".join(cells) + " |")


def at_least_one(text: str) -> int:
    """A count that must be at least 1: `--rounds` (how many times each arm
    runs), `--concurrency`, `--prompts` and `--output-len`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def rounds_parser(
    doc: str, concurrency: Sequence[int] | None = None
) -> argparse.ArgumentParser:
    """The arguments every P/D benchmark takes: the release, `--rounds` and,
    where it runs `vllm bench serve` at several concurrencies, `--concurrency`
    with these defaults and `--prompts`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("release", nargs="?", default=e2e_release())
    parser.add_argument("--rounds", type=at_least_one, default=3)
    if concurrency is not None:
        parser.add_argument(
            "--concurrency", type=at_least_one, nargs="+", default=list(concurrency)
        )
        parser.add_argument(
            "--prompts",
            type=at_least_one,
            help=f"requests per run (default: {PROMPTS_PER_CLIENT} per client and "
            f"at least {MIN_PROMPTS})",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = rounds_parser(__doc__, concurrency=(1, 4, 12))
    parser.add_argument(
        "--output-len", type=at_least_one, help="output tokens per request"
    )
    parser.add_argument(
        "--workload",
        choices=("cpu", "seed"),
        default="cpu",
        help="the prompt layout: this CPU's (default) or the seed's, for a GPU "
        "(512 requests per run unless --prompts)",
    )
    args = parser.parse_args(argv)
    cells = cell_workloads(args.workload, args.concurrency, args.prompts)
    if args.output_len:
        cells = [replace(cell, output_len=args.output_len) for cell in cells]
    try:
        # The seed's layout is for a GPU runner, where a core per server
        # would starve the servers.
        arms = (
            ARMS
            if args.workload == "cpu"
            else [replace(a, confine=False) for a in ARMS]
        )
        results = measure(args.release, args.rounds, cells, arms)
    except OverlayError as exc:
        report_error(exc)
        return 1
    print(f"vLLM {args.release}, tiny Qwen3.5 hybrid")
    report(results, args.rounds, cells)
    return 0


def cell_workloads(
    layout: str, concurrencies: Sequence[int], prompts: int | None
) -> list[Workload]:
    """One workload per concurrency: the seed's layout with its 512 prompts,
    or the CPU's with PROMPTS_PER_CLIENT per client (at least MIN_PROMPTS);
    `prompts` fixes the count for every cell."""
    if layout == "seed":
        return [
            replace(
                SEED_WORKLOAD, concurrency=c, prompts=prompts or SEED_WORKLOAD.prompts
            )
            for c in concurrencies
        ]
    return [
        replace(
            CPU_WORKLOAD,
            concurrency=c,
            prompts=prompts or max(MIN_PROMPTS, PROMPTS_PER_CLIENT * c),
        )
        for c in concurrencies
    ]


if __name__ == "__main__":
    sys.exit(main())
