"""Where a pulled request's time goes on a loaded decode server before its
read: `nixl-decode-confirms-reads` asks the prefill server's listener
whether it still holds the blocks as the engine's input thread receives the
request (before `hybridkv.20` of 0.32.0, as the scheduler added it), and
schedules the read at the first attempt that finds the answer. Issue 37's
goal at concurrency 4 (TTFT within 5 % of the build before the question) is
measured in `benchmarks/pd_read_confirmation.py`; this says what the
question adds.

The P/D pair of `benchmarks/pd_decode_reuse.py` (tiny Qwen3.5 hybrid, each
server confined to its core, the decode cache capped), plain NixlConnector
and MultiConnector[NixlConnector, DecodeBenchConnector] on the decode side,
this checkout's patched build in an environment of its own whose decode
processes time each pulled request (`read_question_timing.py` beside it).
Per concurrency and decode side, over every request of every round: the
median and 90th percentile of

- "queued": from the engine's input thread receiving the request to the
  scheduler adding it (the engine finishing the step it was in);
- "answer": from the question to its answer, in the asking thread;
- "taken up": from the question to the attempt to schedule the request that
  found the answer; its read is posted in that step;

the share of requests whose first attempt found no answer (the request then
waits for a later step; the build before the question posted every read at
its first attempt), and the share whose answer took less than their queue
wait (answer < queued): asked on receipt, as this build asks, their answer
was there when the scheduler added them. `vllm bench serve`'s median TTFT
and TPOT of the same runs give the scale. The decode sides run one after
the other, each over every round.

Usage: python -m benchmarks.investigations.pd_question_timing [RELEASE] [--rounds N]
    [--concurrency C ...] [--prompts N]
(the release's test environment must exist: tools/test.sh RELEASE)
"""

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.pd_decode_reuse import (
    Arm,
    Sample,
    cell_workloads,
    measure,
    median,
    rounds_parser,
)
from benchmarks.pd_read_confirmation import DECODE_SIDES, hooked_env
from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.common.locations import cache_root

HOOK = Path(__file__).resolve().parent / "read_question_timing.py"
BUILD = "question-timing"


def percentile(values: Sequence[float], share: float) -> float:
    """The value `share` of `values` are at or under (nearest rank); nan
    for none, as `median`."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, round(share * len(ordered)) - 1)]


def timings(folder: Path) -> list[dict]:
    """Every request the decode processes timed."""
    return [
        json.loads(line)
        for path in sorted(folder.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def row(concurrency: int, side: str, timed: list[dict], samples: list[Sample]) -> str:
    """One line of the table: a decode side's requests at one concurrency."""
    queued = [t["added"] - t["received"] for t in timed if t["received"] is not None]
    answer = [t["answered"] - t["asked"] for t in timed if "answered" in t]
    taken_up = [t["taken_up"] - t["asked"] for t in timed]
    missed = sum(1 for t in timed if t["attempts_before"])
    in_time = sum(
        1
        for t in timed
        if t["received"] is not None
        and "answered" in t
        and t["answered"] - t["asked"] < t["added"] - t["received"]
    )

    def ms(values: Sequence[float]) -> str:
        return f"{median(values) * 1000:.1f} / {percentile(values, 0.9) * 1000:.1f} ms"

    benches = [s.bench for s in samples]
    return (
        f"| {concurrency} | {side} | {len(timed)} | {ms(queued)} | {ms(answer)} | "
        f"{ms(taken_up)} | {missed / len(timed):.0%} | "
        f"{in_time / len(timed):.0%} | "
        f"{median([b.median_ttft_s for b in benches]) * 1000:.0f} ms | "
        f"{median([b.median_tpot_s for b in benches]) * 1000:.1f} ms |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = rounds_parser(__doc__, concurrency=(4, 12))
    args = parser.parse_args(argv)
    print(f"vLLM {args.release}, this checkout's patched build, timed")
    folder = cache_layout.layered_env(cache_root(), args.release, BUILD) / "timings"
    rows = []
    try:
        env = hooked_env(args.release, BUILD, HOOK, f"install({str(folder)!r})")
        for cell in cell_workloads("cpu", args.concurrency, args.prompts):
            # One decode side at a time: a MultiConnector's NIXL child cannot
            # tell its process's timings from plain NixlConnector's.
            for side, key in DECODE_SIDES:
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                results = measure(
                    args.release,
                    args.rounds,
                    [cell],
                    [Arm(side, BUILD, key)],
                    ["capped"],
                    {BUILD: env},
                )
                timed = timings(folder)
                if not timed:
                    raise OverlayError(
                        f"no pulled request was timed on the {side} decode server: "
                        f"{HOOK.name} found nothing to wrap in vLLM {args.release}"
                    )
                samples = results[("capped", cell.concurrency)][side]
                rows.append(row(cell.concurrency, side, timed, samples))
    except (OverlayError, subprocess.SubprocessError) as exc:
        report_error(OverlayError(str(exc)))
        return 1
    print(
        f"\n{args.rounds} rounds; per concurrency and decode side, over every "
        "pulled request (median / 90th percentile):"
    )
    print(
        "| concurrency | decode side | requests | queued | answer | taken up | "
        "first attempt without the answer | answer before the scheduler added "
        "it, asked on receipt | median TTFT | median TPOT |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for line in rows:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
