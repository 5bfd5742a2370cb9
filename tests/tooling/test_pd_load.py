"""The pure parts of the P/D load runs (`ci/suites/pd/bench.py`, `ci/suites/pd/load.py`,
the streamed requests of `ci/suites/pd/faults.py`): reading `vllm bench serve`'s
results JSON, the verdicts, and what became of a streamed request. The
servers and `vllm bench serve` itself run in `tools/test.sh`."""

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ci.suites.pd.bench import BenchResult, Workload, percentile
from ci.suites.pd.cases import CASE_BY_KEY, FLOAT32_MODELS
from ci.suites.pd.completions import MAX_TOKENS
from ci.suites.pd.faults import FirstToken, stream, tally
from ci.suites.pd.load import (
    LoadRun,
    checks,
    compare_with_yardsticks,
    negative_counters,
)
from ci.suites.pd.metrics import DecodeCounts
from ci.suites.pd.pair import DROP_IN, PATCHED, UNPATCHED
from vllm_overlay.common.errors import OverlayError

# Shaped like vLLM 0.32.0's `--save-detailed` results (serve.py:1280-1299),
# trimmed to what is read.
RESULTS = {
    "duration": 10.0,
    "completed": 2,
    "failed": 1,
    "output_throughput": 4.8,
    "output_lens": [4, 4, 0],
    "ttfts": [0.5, 1.5, 0.0],
    "itls": [[0.1, 0.2, 0.3], [0.2, 0.2, 0.2], []],
    "generated_texts": ["a b c d", "e f g h", ""],
    "errors": ["", "", "Traceback ... ServerDisconnectedError"],
}


def test_results_give_per_request_times_texts_and_errors() -> None:
    result = BenchResult.from_json(RESULTS)
    assert (result.completed, result.failed) == (2, 1)
    assert result.texts == ("a b c d", "e f g h", "")
    assert result.tpots[:2] == pytest.approx((0.2, 0.2))
    assert math.isnan(result.tpots[2])
    assert result.median_tpot_s == pytest.approx(0.2)
    assert result.median_ttft_s == 0.5
    assert result.failures == ["2: Traceback ... ServerDisconnectedError"]


def test_results_without_the_detailed_fields_are_refused() -> None:
    plain = {k: v for k, v in RESULTS.items() if k != "generated_texts"}
    with pytest.raises(OverlayError, match="unexpected vllm bench serve results"):
        BenchResult.from_json(plain)


def test_percentiles_interpolate_as_numpy_does() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 99) == pytest.approx(3.97)
    assert percentile([2.0], 99) == 2.0
    assert math.isnan(percentile([], 50))


def test_the_workload_is_greedy_and_asks_every_output_token() -> None:
    args = Workload().args()
    assert args[args.index("--temperature") + 1] == "0"
    assert "--ignore-eos" in args
    assert args[args.index("--dataset-name") + 1] == "prefix_repetition"


def test_only_a_negative_counter_is_named() -> None:
    samples = [
        ("vllm:prompt_tokens_total", {"engine": "0"}, 5.0),
        ("vllm:prefix_cache_hits_total", {"engine": "0"}, -16.0),
        ("vllm:kv_cache_usage_perc", {"engine": "0"}, -1.0),
    ]
    assert negative_counters(samples) == [
        "vllm:prefix_cache_hits_total{'engine': '0'} = -16.0"
    ]


def bench(texts: tuple[str, ...] = ("x", "y"), failed: int = 0) -> BenchResult:
    return BenchResult(
        completed=len(texts) - failed,
        failed=failed,
        output_throughput=10.0,
        ttfts=(0.1,) * len(texts),
        tpots=(0.01,) * len(texts),
        texts=texts,
        errors=("",) * (len(texts) - failed) + ("timeout",) * failed,
    )


def reused(tokens: int) -> DecodeCounts:
    return DecodeCounts(tokens, 1000, 4, 0, 0, 0, 0, 0, 0.0, 2)


HYBRID_P_D = ("z", "y")


def load_runs(**changes: LoadRun) -> list[LoadRun]:
    """A clean set of load runs, keyed `build/case` in `changes` to replace
    one; compared with the yardsticks (the hybrid's first output differs
    from its one server's on every P/D run alike, as a P/D pair of the
    bfloat16 hybrid computes the prompt otherwise)."""
    nixl, multi = CASE_BY_KEY["hybrid-nixl"], CASE_BY_KEY["hybrid-multi"]
    dense = CASE_BY_KEY["dense-multi"]
    made = {
        "unpatched/hybrid-nixl": LoadRun(
            UNPATCHED, nixl, bench(HYBRID_P_D), reused(900)
        ),
        "patched/hybrid-nixl": LoadRun(PATCHED, nixl, bench(HYBRID_P_D), reused(1000)),
        "patched/hybrid-multi": LoadRun(PATCHED, multi, bench(HYBRID_P_D), reused(950)),
        "drop-in/hybrid-multi": LoadRun(DROP_IN, multi, bench(HYBRID_P_D), reused(990)),
        "patched/dense-multi": LoadRun(PATCHED, dense, bench(), reused(0)),
    }
    made.update(changes)
    compare_with_yardsticks(
        {"tiny-qwen3.5": bench(("w", "y")), "tiny-llama": bench()},
        list(made.values()),
    )
    return list(made.values())


def failing(made: list[LoadRun]) -> list[str]:
    return [check.name for check in checks(made, FLOAT32_MODELS) if not check.ok]


def test_clean_load_runs_pass_with_every_verdict() -> None:
    made = load_runs()
    assert failing(made) == []
    names = [check.name for check in checks(made, FLOAT32_MODELS)]
    assert sum("output = one server (float32)" in name for name in names) == 1
    assert sum("output = its P/D path under load" in name for name in names) == 3
    assert not any(name.startswith("load: unpatched: tiny") for name in names)
    assert made[0].differing == (0,)


def test_an_unpatched_run_that_fails_is_reported_not_judged() -> None:
    run = LoadRun(UNPATCHED, CASE_BY_KEY["hybrid-nixl"], bench(HYBRID_P_D), reused(9))
    run.tracebacks = ["unpatched-proxy-hybrid-nixl.log"]
    assert failing(load_runs(**{"unpatched/hybrid-nixl": run})) == []


def test_an_unpatched_run_that_read_released_blocks_is_no_oracle() -> None:
    """As in a CI run: upstream's pair read released blocks four times and
    answered one request otherwise than every other P/D run."""
    run = LoadRun(UNPATCHED, CASE_BY_KEY["hybrid-nixl"], bench(("z", "!")), reused(9))
    run.invalid_reads = 4
    made = load_runs(**{"unpatched/hybrid-nixl": run})
    assert failing(made) == []
    details = [c.detail for c in checks(made, FLOAT32_MODELS) if "P/D path" in c.name]
    assert details == [
        "2 of 2 equal against patched hybrid-multi "
        "(the unpatched run read released blocks)",
        "2 of 2 equal against patched hybrid-nixl "
        "(the unpatched run read released blocks)",
        "2 of 2 equal against patched hybrid-nixl "
        "(the unpatched run read released blocks)",
    ]


def test_a_hybrid_output_that_differs_from_upstream_p_d_fails() -> None:
    run = LoadRun(PATCHED, CASE_BY_KEY["hybrid-multi"], bench(("z", "q")), reused(950))
    assert failing(load_runs(**{"patched/hybrid-multi": run})) == [
        "load: patched: tiny-qwen3.5: MultiConnector[NixlConnector, "
        "DecodeBenchConnector]: output = its P/D path under load"
    ]


@pytest.mark.parametrize(
    ("change", "verdict"),
    [
        ({"bench": bench(failed=1)}, "every request completed"),
        ({"tracebacks": ["patched-decode-dense-multi.log"]}, "no traceback"),
        ({"busy_after_idle": ["prefill at 12.5%"]}, "KV cache empty once idle"),
        ({"negative_counters": ["x_total = -1"]}, "no negative counter"),
        ({"invalid_reads": 2}, "no read of released blocks"),
        ({"bench": bench(("x", "other"))}, "output = one server (float32)"),
    ],
)
def test_each_load_fault_fails_its_verdict(change: dict, verdict: str) -> None:
    run = LoadRun(PATCHED, CASE_BY_KEY["dense-multi"], bench(), reused(0))
    for name, value in change.items():
        setattr(run, name, value)
    assert failing(load_runs(**{"patched/dense-multi": run})) == [
        f"load: patched: tiny-llama: MultiConnector[NixlConnector, "
        f"DecodeBenchConnector]: {verdict}"
    ]


def test_a_patched_multi_connector_that_re_pulls_under_load_fails() -> None:
    run = LoadRun(PATCHED, CASE_BY_KEY["hybrid-multi"], bench(HYBRID_P_D), reused(100))
    assert failing(load_runs(**{"patched/hybrid-multi": run})) == [
        "load: patched: MultiConnector reuses as unpatched NixlConnector does",
        "load: patched: MultiConnector reuses as patched NixlConnector does",
    ]


def test_a_load_run_without_results_fails() -> None:
    run = LoadRun(DROP_IN, CASE_BY_KEY["hybrid-multi"], error="bench ran past 900s")
    assert (
        "load: drop-in: tiny-qwen3.5: MultiConnector[NixlConnector, "
        "DecodeBenchConnector]" in failing(load_runs(**{"drop-in/hybrid-multi": run}))
    )


class _Streamer(BaseHTTPRequestHandler):
    """Answers a completion as vLLM streams one: a `data:` line per token,
    then `data: [DONE]`; `tokens` of them, or HTTP 500 if `tokens` is -1."""

    tokens = MAX_TOKENS

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.tokens < 0:
            self.send_error(500, "Internal Server Error")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = {"choices": [{"text": "x", "logprobs": {"tokens": ["token_id:5"]}}]}
        for _ in range(self.tokens):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("tokens", "abort", "want"),
    [
        (MAX_TOKENS, False, "completed"),
        (MAX_TOKENS, True, "aborted"),
        (3, False, "failed: ended after 3 tokens"),
        (-1, False, "failed: HTTP 500"),
    ],
)
def test_a_streamed_request_says_what_became_of_it(
    tokens: int, abort: bool, want: str
) -> None:
    handler = type("Streamer", (_Streamer,), {"tokens": tokens})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        first = FirstToken()
        got = stream(server.server_address[1], Path("m"), [5, 6], abort, first)
    finally:
        server.shutdown()
        server.server_close()
    assert got.startswith(want)
    assert (first.at is not None) == (tokens > 0)


def test_the_tally_counts_outcomes_and_names_failures() -> None:
    ended = ["completed", "aborted", "completed", "failed: HTTP 500 oops", "hung"]
    assert tally(ended) == (
        "1 aborted, 2 completed, 1 failed, 1 hung (failed: HTTP 500 oops)"
    )
