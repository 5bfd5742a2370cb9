"""What the P/D decode-side patch changes for a hybrid model, measured end
to end: a prefill and a decode `vllm serve` of the tiny Qwen3.5 hybrid
behind upstream's toy proxy (`ci/pd/pair.py`), the decode side behind
MultiConnector[NixlConnector, DecodeBenchConnector], unpatched vs patched,
with plain NixlConnector on the unpatched build as the yardstick.

Each arm is a fresh pair per round, the arms alternating round by round;
every round sends the same prompts (sharing a prefix of several hybrid
blocks) one after the other. From the decode server's `/metrics`: tokens
reused from its local prefix cache, tokens pulled from the prefill server,
NIXL bytes, and the time to first token at the decode server (the pull and
the rest of the prefill, per request). The script prints each arm's numbers
(TTFT: the median over every request of every round) and the ratios patched
/ unpatched, all from this one run, and whether every arm's greedy output
equals the unpatched plain-NIXL run's.

The model is tiny and the machine a CPU: the pulled KV is megabytes, so the
times say how the transfer and the scheduling compare here, not what a GPU
deployment of a real model gains (there the re-pulled prefix is gigabytes).

Usage: python benchmarks/pd_decode_reuse.py [RELEASE] [--rounds N] [--prompts N]
(the release's test environment must exist: tools/test.sh RELEASE)
"""

import argparse
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ci.pd.cases import CASE_BY_KEY, Run
from ci.pd.completions import compare, make_prompts
from ci.pd.pair import PATCHED, UNPATCHED
from ci.pd_e2e import make_layout, run_case
from vllm_overlay.errors import OverlayError, report_error
from vllm_overlay.locations import cache_root
from vllm_overlay.series.facts import e2e_release

ARMS = (
    ("unpatched NixlConnector", UNPATCHED, "hybrid-nixl"),
    ("unpatched MultiConnector", UNPATCHED, "hybrid-multi"),
    ("patched MultiConnector", PATCHED, "hybrid-multi"),
)


def measure(release: str, rounds: int, prompts: int) -> dict[str, list[Run]]:
    cases = [CASE_BY_KEY["hybrid-nixl"], CASE_BY_KEY["hybrid-multi"]]
    layout = make_layout(release, cache_root(), cases)
    texts = make_prompts(count=prompts)
    runs: dict[str, list[Run]] = {name: [] for name, _, _ in ARMS}
    for _ in range(rounds):
        for name, build, key in ARMS:
            run, _ = run_case(layout, build, CASE_BY_KEY[key], texts)
            if run.counts is None:
                raise OverlayError(f"{name}: {run.error}")
            runs[name].append(run)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("release", nargs="?", default=e2e_release())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    args = parser.parse_args(argv)
    try:
        runs = measure(args.release, args.rounds, args.prompts)
    except OverlayError as exc:
        report_error(exc)
        return 1
    yardstick = runs[ARMS[0][0]][0].completions
    ttft = {
        name: statistics.median(t for r in arm for t in r.ttfts)
        for name, arm in runs.items()
    }
    print(
        f"vLLM {args.release}, tiny Qwen3.5 hybrid, {args.prompts} prompts per "
        f"round, {args.rounds} rounds; decode side, per round:"
    )
    print(
        f"  {'arm':26} {'reused':>8} {'pulled':>8} {'NIXL MB':>8} "
        f"{'TTFT ms':>8}  output = unpatched NixlConnector"
    )
    for name, arm in runs.items():
        c = arm[0].counts
        same = all(not compare(yardstick, r.completions)[0] for r in arm)
        print(
            f"  {name:26} {c.reused:8,} {c.pulled:8,} {c.nixl_bytes / 1e6:8.2f} "
            f"{ttft[name] * 1e3:8.1f}  {'yes' if same else 'NO'}"
        )
    unpatched, patched = runs[ARMS[1][0]][0].counts, runs[ARMS[2][0]][0].counts
    print(
        "  patched / unpatched MultiConnector: "
        f"pulled x{patched.pulled / unpatched.pulled:.2f}, "
        f"NIXL bytes x{patched.nixl_bytes / unpatched.nixl_bytes:.2f}, "
        f"decode TTFT x{ttft[ARMS[2][0]] / ttft[ARMS[1][0]]:.2f}; "
        f"patched MultiConnector / unpatched NixlConnector: decode TTFT "
        f"x{ttft[ARMS[2][0]] / ttft[ARMS[0][0]]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
