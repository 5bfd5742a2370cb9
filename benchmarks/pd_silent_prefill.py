"""What one silent prefill server among four costs the requests of the other
three on a decode server (issue 57's goal: their TTFT within 10 % of a
healthy fleet's).

The fleet (`ci/suites/pd/fleet.py`): four patched prefill servers of the tiny
Qwen3.5 hybrid sharing the first core, and one patched decode server on the
second, prefix caching off. Each round runs both arms, healthy and silent, in
an order that alternates between rounds. An arm prefills `--per-prefill`
prompts of its own on each prefill server (the `kv_transfer_params` a router
forwards), then, in the silent arm, stops the fourth prefill server
(SIGSTOP: a server cut off from the network, which accepts connections and
answers nothing) and sends every reference to the decode server at once,
streamed; the fourth server resumes once every request ended. Each
request's TTFT is the client's time to its first streamed token.

Per arm and round: the median TTFT of the live three servers' requests;
the ratio silent / healthy of that median, per round, printed as its median
over rounds with its min-max. Every answer must be the decode server's own
(the prompt computed alone, greedy) or first part from it at a near tie
(`ci/suites/pd/mtp_verdicts.py`): the bfloat16 hybrid's tokens move with the
batch (in a first run 36 of 192 answers parted from it, the locally computed
ones of the silent server too). A request that fails or parts elsewhere is
printed, and makes the benchmark exit 1.

In the silent arm the fourth server's requests are not read: each waits out
the decode side's 5 s question and is computed on the decode server, after
the live servers' requests completed. The ratio therefore measures what the
silent peer's questions cost the others (threads, the scheduler's steps),
not the silent requests' own recomputation.

Usage: python -m benchmarks.pd_silent_prefill [RELEASE] [--rounds N]
    [--per-prefill N]
(the release's test environment must exist: tools/test.sh RELEASE)
"""

import http.client
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from benchmarks.pd_decode_reuse import at_least_one, rounds_parser, spread
from ci.suites.pd.cases import CASE_BY_KEY
from ci.suites.pd.completions import (
    Completion,
    completion_body,
    make_prompts,
    streamed_tokens,
)
from ci.suites.pd.fleet import DECODE, PREFILL, Fleet, Member
from ci.suites.pd.mtp_verdicts import NEAR_TIE, parting
from ci.suites.pd.pair import PATCHED
from ci.suites.pd_e2e import make_layout
from ci.suites.servers import Server
from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.common.locations import cache_root

PREFILLS = tuple(f"prefill-{i}" for i in range(4))
SILENT = PREFILLS[-1]
DECODER = "decode"
MEMBERS = (
    *(Member(name, PATCHED, PREFILL) for name in PREFILLS),
    Member(DECODER, PATCHED, DECODE),
)
HEALTHY, SILENT_ARM = "healthy", "one silent"
PROMPT_TOKENS = 512


def first_token(
    port: int, model: Path, prompt: Sequence[int], params: dict[str, object]
) -> tuple[float, tuple[int, ...]]:
    """Stream one completion with `params`: the seconds to its first token,
    and its token ids."""
    body = {
        **completion_body(model, prompt),
        "kv_transfer_params": params,
        "stream": True,
    }
    started = time.monotonic()
    ttft = None
    tokens: list[int] = []
    for chunk in streamed_tokens(port, body):
        if chunk and ttft is None:
            ttft = time.monotonic() - started
        tokens += chunk
    if ttft is None:
        raise OverlayError("the stream ended without a token")
    return ttft, tuple(tokens)


class Bench:
    """The fleet, its prompts (a block of `per_round` per arm and round)
    and what each arm measured."""

    def __init__(self, fleet: Fleet, per_prefill: int, pool: ThreadPoolExecutor):
        self.fleet = fleet
        self.per_prefill = per_prefill
        self.pool = pool
        self.medians: dict[str, list[float]] = {HEALTHY: [], SILENT_ARM: []}
        self.silent_ttfts: list[float] = []
        self.wrong: list[str] = []
        self.next_prompt = 0

    def arm(self, name: str) -> None:
        fleet = self.fleet
        references = []
        for prefill in PREFILLS:
            for _ in range(self.per_prefill):
                index = self.next_prompt
                self.next_prompt += 1
                references.append((prefill, index, fleet.prefill(prefill, index)))
        silent_server: Server = fleet.server(SILENT)
        if name == SILENT_ARM:
            silent_server.pause()
        try:
            calls = [
                (prefill, index, self.pool.submit(self.request, index, params))
                for prefill, index, params in references
            ]
            done = [(prefill, index, call.result()) for prefill, index, call in calls]
        finally:
            silent_server.resume()
        live = []
        for prefill, index, (ttft, outcome) in done:
            if outcome != "clean":
                self.wrong.append(f"{name}, {prefill}, prompt {index}: {outcome}")
            if prefill != SILENT:
                live.append(ttft)
            elif name == SILENT_ARM:
                self.silent_ttfts.append(ttft)
        self.medians[name].append(statistics.median(live))

    def request(self, index: int, params: dict[str, object]) -> tuple[float, str]:
        clean: Completion = self.fleet.clean[index]
        try:
            ttft, tokens = first_token(
                self.fleet.port(DECODER),
                self.fleet.model,
                self.fleet.prompts[index],
                params,
            )
        except (OSError, http.client.HTTPException, OverlayError, ValueError) as exc:
            return float("nan"), f"failed: {exc}"
        if len(tokens) != len(clean.token_ids):
            return ttft, f"{len(tokens)} tokens"
        found = parting(clean, Completion(tokens, (), ()))
        if found is None or found[1] < NEAR_TIE:
            return ttft, "clean"
        token, gap = found
        return ttft, f"parts from the answer alone at token {token}, gap {gap:.2g}"


def main(argv: list[str] | None = None) -> int:
    parser = rounds_parser(__doc__)
    parser.add_argument("--per-prefill", type=at_least_one, default=4)
    args = parser.parse_args(argv)
    arms_per_round = 2
    prompts = make_prompts(
        count=args.rounds * arms_per_round * len(PREFILLS) * args.per_prefill,
        prefix=0,
        length=PROMPT_TOKENS,
        seed=58,
    )
    try:
        layout = make_layout(args.release, cache_root(), [CASE_BY_KEY["hybrid-nixl"]])
        with ExitStack() as stack:
            pool = stack.enter_context(
                ThreadPoolExecutor(max_workers=len(PREFILLS) * args.per_prefill)
            )
            fleet = Fleet(
                stack,
                layout,
                MEMBERS,
                [(DECODER, prefill) for prefill in PREFILLS],
                prompts,
                oracle=DECODER,
            )
            bench = Bench(fleet, args.per_prefill, pool)
            for round_ in range(args.rounds):
                order = (
                    (HEALTHY, SILENT_ARM) if round_ % 2 == 0 else (SILENT_ARM, HEALTHY)
                )
                for name in order:
                    bench.arm(name)
                print(
                    f"round {round_ + 1}: live median TTFT healthy "
                    f"{bench.medians[HEALTHY][-1]:.3f}s, one silent "
                    f"{bench.medians[SILENT_ARM][-1]:.3f}s",
                    flush=True,
                )
    except OverlayError as exc:
        report_error(exc)
        return 1
    ratios = [
        s / h
        for s, h in zip(bench.medians[SILENT_ARM], bench.medians[HEALTHY], strict=True)
    ]
    print(
        f"\n{args.rounds} rounds, {args.per_prefill} requests per prefill server "
        f"per arm, {PROMPT_TOKENS}-token prompts, release {args.release}"
    )
    for name in (HEALTHY, SILENT_ARM):
        print(f"  live median TTFT, {name}: {spread(bench.medians[name])[1:]} s")
    silent = statistics.median(bench.silent_ttfts)
    print(f"  the silent server's requests: median {silent:.2f} s")
    print(f"  ratio one silent / healthy of the live median TTFT: {spread(ratios)}")
    for line in bench.wrong:
        print(f"  NOT CLEAN: {line}")
    return 1 if bench.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
