"""vLLM's own load generator, `vllm bench serve`, against a server or a P/D
pair's proxy, and what its results JSON holds.

The workload is `prefix_repetition` (benchmarks/datasets/datasets.py:4181
in 0.32.0): `prompts` requests, each a shared random prefix plus a random
suffix, drawn under a fixed seed, sent `concurrency` at a time, greedy
(`--temperature 0`: the client no longer defaults to greedy, serve.py:2199)
and `--ignore-eos`, so every request asks exactly `output_len` tokens. With
`--save-detailed` the JSON holds, in prompt order, every request's TTFT,
inter-token latencies, generated text and error (serve.py:1280-1299).
"""

import json
import math
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.suites.servers import server_environment
from vllm_overlay.common.errors import OverlayError

# A run that has not ended by then is stuck; the P/D pairs of this suite
# take a few minutes at most.
BENCH_TIMEOUT_S = 900


@dataclass(frozen=True)
class Workload:
    """What `vllm bench serve` sends."""

    prompts: int = 48
    concurrency: int = 12
    prefix_len: int = 1150
    suffix_len: int = 130
    num_prefixes: int = 1
    output_len: int = 32
    seed: int = 0

    def describe(self) -> str:
        return (
            f"{self.prompts} requests of a {self.prefix_len:,}-token shared prefix "
            f"({self.num_prefixes} prefix{'es' if self.num_prefixes > 1 else ''}) "
            f"+ {self.suffix_len:,} tokens, {self.output_len} output tokens, "
            f"concurrency {self.concurrency}, seed {self.seed}"
        )

    def args(self) -> list[str]:
        return [
            *("--dataset-name", "prefix_repetition"),
            *("--prefix-repetition-prefix-len", str(self.prefix_len)),
            *("--prefix-repetition-suffix-len", str(self.suffix_len)),
            *("--prefix-repetition-num-prefixes", str(self.num_prefixes)),
            *("--prefix-repetition-output-len", str(self.output_len)),
            *("--num-prompts", str(self.prompts)),
            *("--max-concurrency", str(self.concurrency)),
            *("--request-rate", "inf"),
            *("--seed", str(self.seed)),
            *("--temperature", "0"),
            "--ignore-eos",
        ]


@dataclass(frozen=True)
class BenchResult:
    """One `vllm bench serve` run, from its results JSON."""

    completed: int
    failed: int
    output_throughput: float
    ttfts: tuple[float, ...]
    tpots: tuple[float, ...]
    texts: tuple[str, ...]
    errors: tuple[str, ...]

    @classmethod
    def from_json(cls, data: dict[str, object]) -> "BenchResult":
        try:
            output_lens = data["output_lens"]
            itls = data["itls"]
            tpots = tuple(
                (sum(itl) / (n - 1)) if n > 1 else math.nan
                for itl, n in zip(itls, output_lens, strict=True)  # type: ignore[arg-type]
            )
            return cls(
                completed=int(data["completed"]),  # type: ignore[arg-type]
                failed=int(data["failed"]),  # type: ignore[arg-type]
                output_throughput=float(data["output_throughput"]),  # type: ignore[arg-type]
                ttfts=tuple(float(t) for t in data["ttfts"]),  # type: ignore[union-attr]
                tpots=tpots,
                texts=tuple(str(t) for t in data["generated_texts"]),  # type: ignore[union-attr]
                errors=tuple(str(e or "") for e in data["errors"]),  # type: ignore[union-attr]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise OverlayError(
                f"unexpected vllm bench serve results ({exc!r})"
            ) from None

    @property
    def median_ttft_s(self) -> float:
        return statistics.median(self.ttfts) if self.ttfts else math.nan

    @property
    def p99_ttft_s(self) -> float:
        return percentile(self.ttfts, 99)

    @property
    def median_tpot_s(self) -> float:
        finite = [t for t in self.tpots if not math.isnan(t)]
        return statistics.median(finite) if finite else math.nan

    @property
    def failures(self) -> list[str]:
        """`index: error` for every request that failed."""
        return [f"{i}: {e[:200]}" for i, e in enumerate(self.errors) if e]


def percentile(values: Sequence[float], p: float) -> float:
    """The `p`th percentile, linearly interpolated (numpy's default, which
    `vllm bench serve` prints)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def run_bench(
    env: Path,
    port: int,
    model: Path,
    workload: Workload,
    result: Path,
    vllm_cache: Path,
) -> BenchResult:
    """`vllm bench serve` of the environment `env` against 127.0.0.1:`port`;
    its output goes to `result` with the suffix `.log`."""
    result.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    command = [
        str(env / "bin" / "vllm"),
        *("bench", "serve"),
        *("--backend", "vllm"),
        *("--base-url", f"http://127.0.0.1:{port}"),
        *("--model", str(model)),
        *("--tokenizer", str(model)),
        *workload.args(),
        *("--save-result", "--save-detailed"),
        *("--result-dir", str(result.parent)),
        *("--result-filename", result.name),
    ]
    log = result.with_suffix(".log")
    try:
        with open(log, "wb") as out:
            proc = subprocess.run(
                command,
                env=server_environment(vllm_cache),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=BENCH_TIMEOUT_S,
                check=False,
            )
    except subprocess.TimeoutExpired:
        raise OverlayError(
            f"vllm bench serve ran past {BENCH_TIMEOUT_S}s; see {log}"
        ) from None
    if proc.returncode or not result.is_file():
        raise OverlayError(
            f"vllm bench serve exited with {proc.returncode} and no results; see {log}"
        )
    try:
        data = json.loads(result.read_text())
    except ValueError as exc:
        raise OverlayError(f"unreadable results {result}: {exc}") from None
    return BenchResult.from_json(data)
