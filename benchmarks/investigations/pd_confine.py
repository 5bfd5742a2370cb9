"""What confining each server of a P/D pair to its core changes on a CPU
host: the tiny Qwen3.5 hybrid's prefill and decode `vllm serve` (the
patched build) behind upstream's toy proxy, each server run whole under
`taskset -c <its core>` (the API server, the engine core and the worker, as
`ci/suites/pd/pair.py` runs the CPU suite's pairs and docs/user/pd.md tells
users), against vLLM's own placement, where VLLM_CPU_OMP_THREADS_BIND binds only the
worker's model threads and the engine cores and API servers go wherever the
kernel puts them (an engine core polls its worker, and steps a millisecond
apart while a request waits for its KV, so a stray one takes half of the
other server's model core).

Arms: the one server without a connector (both cores, the yardstick; the
unpatched build, as in `benchmarks/pd_decode_reuse.py`), and the pair with
NixlConnector or MultiConnector[NixlConnector, DecodeBenchConnector] on the
decode side, confined and unconfined. Cells:
each concurrency of `--concurrency`, each cache setting of `--caches` (the
decode server's KV cache uncapped, or capped to three requests' worth, the
one server then capped alike), run and reported as
`benchmarks/pd_decode_reuse.py` runs its cells: `vllm bench serve`
`prefix_repetition`, every arm started afresh per round and cache setting,
arms interleaved, every ratio the median over rounds of each round's ratio
with its min-max.

Usage: python -m benchmarks.investigations.pd_confine [RELEASE] [--rounds N]
    [--concurrency C ...] [--prompts N] [--caches capped uncapped]
(the release's test environment must exist: tools/test.sh RELEASE)
"""

import sys
from collections.abc import Sequence

from benchmarks.pd_decode_reuse import (
    CACHES,
    ONE_SERVER,
    Arm,
    Results,
    arm_table,
    cell_workloads,
    measure,
    ratio,
    rounds_parser,
    throughput,
    ttft,
)
from ci.suites.pd.bench import Workload
from ci.suites.pd.pair import PATCHED, UNPATCHED
from vllm_overlay.common.errors import OverlayError, report_error

NIXL, MULTI = "NixlConnector", "MultiConnector"
CONFINED, UNCONFINED = "confined", "unconfined"
ARMS = (
    Arm(ONE_SERVER, UNPATCHED),
    *(
        Arm(f"{decode}, {placement}", PATCHED, key, placement == CONFINED)
        for placement in (CONFINED, UNCONFINED)
        for decode, key in ((NIXL, "hybrid-nixl"), (MULTI, "hybrid-multi"))
    ),
)


def report(results: Results, rounds: int, cells: Sequence[Workload]) -> None:
    arm_table(results, rounds, cells)
    print("\nRatios (median over rounds, min-max):")
    print(
        "| decode cache | concurrency | decode side | TTFT unconfined / confined | "
        "tok/s confined / unconfined | TTFT confined / one server | "
        "tok/s one server / confined |"
    )
    print("|---|---|---|---|---|---|---|")
    for (cache, c), cell in results.items():
        for decode in (NIXL, MULTI):
            confined = cell[f"{decode}, {CONFINED}"]
            unconfined = cell[f"{decode}, {UNCONFINED}"]
            one = cell[ONE_SERVER]
            cells = [
                ratio(unconfined, confined, ttft),
                ratio(confined, unconfined, throughput),
                ratio(confined, one, ttft),
                ratio(one, confined, throughput),
            ]
            print(f"| {cache} | {c} | {decode} | " + " | ".join(cells) + " |")
    print("\nTTFT MultiConnector / NixlConnector:")
    for (cache, c), cell in results.items():
        confined, unconfined = (
            ratio(cell[f"{MULTI}, {p}"], cell[f"{NIXL}, {p}"], ttft)
            for p in (CONFINED, UNCONFINED)
        )
        print(
            f"  {cache}, concurrency {c}: confined {confined}, unconfined {unconfined}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = rounds_parser(__doc__, concurrency=(4, 12))
    parser.add_argument(
        "--caches", nargs="+", choices=CACHES, default=["capped", "uncapped"]
    )
    args = parser.parse_args(argv)
    cells = cell_workloads("cpu", args.concurrency, args.prompts)
    try:
        results = measure(args.release, args.rounds, cells, ARMS, args.caches)
    except OverlayError as exc:
        report_error(exc)
        return 1
    print(f"vLLM {args.release}, tiny Qwen3.5 hybrid, patched build")
    report(results, args.rounds, cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
