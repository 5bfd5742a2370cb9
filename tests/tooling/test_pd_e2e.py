"""The pure helpers of the P/D end-to-end suite (`ci/pd_e2e.py`): reading a
decode server's `/metrics`, reading completions, comparing them with the
reference, and the verdicts. The servers themselves run in `tools/test.sh`."""

import math

import pytest

from ci.pd_e2e import (
    MULTI_CASE,
    PLAIN_CASE,
    Completion,
    DecodeCounts,
    Run,
    checks,
    compare,
    compare_runs,
    decode_counts,
    make_prompts,
    metric_sum,
    parse_completion,
    parse_metrics,
)
from vllm_overlay.errors import OverlayError

# Shaped like vLLM 0.32.0's exposition: HELP/TYPE comments, counters with
# `_total` and `_created`, a histogram's `_sum`, label values with commas.
METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="/m/tiny, qwen"} 3000.0
vllm:prefix_cache_queries_created{engine="0",model_name="/m/tiny, qwen"} 1.7e+09
vllm:prefix_cache_hits_total{engine="0",model_name="/m/tiny, qwen"} 1280.0
vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 1720.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 1719.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 3000.0
vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"} 1.0
vllm:prompt_tokens_by_source_total{engine="0",source="local_cache_hit"} 1280.0
vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"} 1719.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 2.5e+06
vllm:nixl_bytes_transferred_count{engine="0",model_name="m"} 2.0
process_open_fds 31.0
"""


def test_metrics_are_read_with_their_labels() -> None:
    samples = parse_metrics(METRICS)
    assert ("process_open_fds", {}, 31.0) in samples
    name, labels, value = samples[0]
    assert name == "vllm:prefix_cache_queries_total"
    assert labels == {"engine": "0", "model_name": "/m/tiny, qwen"}
    assert value == 3000.0
    assert metric_sum(samples, "vllm:nixl_bytes_transferred_sum") == 2.5e6
    by_source = "vllm:prompt_tokens_by_source_total"
    assert metric_sum(samples, by_source) == 3000.0
    assert metric_sum(samples, by_source, source="local_cache_hit") == 1280.0
    assert metric_sum(samples, "vllm:no_such_metric") == 0


def test_escaped_quotes_stay_inside_a_label_value() -> None:
    [(_, labels, value)] = parse_metrics('m{a="x\\"y,z",b="2"} 5 1700000000\n')
    assert labels == {"a": 'x\\"y,z', "b": "2"}
    assert value == 5.0


def test_a_line_without_a_value_is_refused() -> None:
    with pytest.raises(OverlayError, match="without a value"):
        parse_metrics('vllm:prompt_tokens_total{engine="0"}\n')


def test_decode_counts_are_what_the_run_added() -> None:
    before = parse_metrics(METRICS)
    after = parse_metrics(
        METRICS.replace("} 1280.0", "} 2560.0").replace("} 1719.0", "} 2000.0")
    )
    counts = decode_counts(before, after)
    assert counts.reused == 1280
    assert counts.pulled == 281
    assert counts.prefix_hits == 1280
    assert counts.external_hits == 281
    assert counts.prefix_queries == counts.computed == counts.nixl_bytes == 0


ANSWER = {
    "choices": [
        {
            "text": "",
            "logprobs": {
                "tokens": ["token_id:17", "token_id:5"],
                "token_logprobs": [-0.5, -1.0],
                "top_logprobs": [
                    {"token_id:17": -0.5, "token_id:9": -2.0},
                    {"token_id:8": -1.25, "token_id:5": -1.0},
                ],
            },
        }
    ]
}


def test_a_completion_gives_token_ids_logprobs_and_top_two_gaps() -> None:
    completion = parse_completion(ANSWER)
    assert completion == Completion((17, 5), (-0.5, -1.0), (1.5, 0.25))


def test_an_answer_without_logprobs_is_refused() -> None:
    with pytest.raises(OverlayError, match="unexpected completion answer"):
        parse_completion({"choices": [{"text": "x", "logprobs": None}]})


def completion(*tokens: int, logprob: float = -1.0, gap: float = 2.0) -> Completion:
    n = len(tokens)
    return Completion(tokens, (logprob,) * n, (gap,) * n)


def test_identical_outputs_report_the_margin() -> None:
    reference = [completion(1, 2), completion(3, 4)]
    got = [completion(1, 2, logprob=-1.001), completion(3, 4, gap=0.5)]
    differing, min_gap, max_delta = compare(reference, got)
    assert differing == ()
    assert min_gap == 0.5
    assert max_delta == pytest.approx(0.001)


def test_a_differing_output_is_named_and_its_tail_not_compared() -> None:
    reference = [completion(1, 2, 3), completion(3, 4)]
    got = [
        Completion((1, 9, 3), (-1.0, -5.0, -9.0), (2.0, 2.0, 2.0)),
        completion(3, 4),
    ]
    differing, _, max_delta = compare(reference, got)
    assert differing == (0,)
    # Only the positions up to the first differing token count.
    assert max_delta == 0.0


def test_a_missing_completion_is_an_error() -> None:
    with pytest.raises(OverlayError, match="1 completions for 2 prompts"):
        compare([completion(1), completion(2)], [completion(1)])


def test_prompts_share_their_prefix_and_nothing_else() -> None:
    prompts = make_prompts(count=3, prefix=50, length=60, seed=1)
    assert [len(p) for p in prompts] == [60, 60, 60]
    assert prompts[0][:50] == prompts[1][:50] == prompts[2][:50]
    assert len({tuple(p[50:]) for p in prompts}) == 3
    assert min(min(p) for p in prompts) >= 3
    assert make_prompts(count=3, prefix=50, length=60, seed=1) == prompts


def counts(reused: int, pulled: int) -> DecodeCounts:
    return DecodeCounts(reused, pulled, 4, 6000, reused, 6000 - reused, pulled, 0)


REFERENCE = [completion(1, 2), completion(3, 4)]


def runs(patched_multi_reused: int = 3840, patched_multi_output=None) -> list[Run]:
    """The four runs as the suite makes them, compared with `REFERENCE`; the
    unpatched MultiConnector run differs from it in request 1 (reported, not
    failed on: that is upstream's)."""
    made = [
        Run("unpatched", PLAIN_CASE, counts(3840, 2156), list(REFERENCE)),
        Run("unpatched", MULTI_CASE, counts(0, 5996), [REFERENCE[0], completion(3, 5)]),
        Run("patched", PLAIN_CASE, counts(3840, 2156), list(REFERENCE)),
        Run(
            "patched",
            MULTI_CASE,
            counts(patched_multi_reused, 2156),
            patched_multi_output or list(REFERENCE),
        ),
    ]
    compare_runs(REFERENCE, made)
    return made


def test_patched_reuse_and_unpatched_re_pull_pass() -> None:
    made = runs()
    results = checks(made)
    assert all(r.ok for r in results), results
    names = [r.name for r in results]
    assert not any(n.startswith("unpatched") and "output" in n for n in names)
    assert "unpatched: MultiConnector re-pulls (control)" in names
    assert made[1].differing == (1,)
    assert made[3].upstream_differing == ()


def test_a_patched_multi_connector_that_re_pulls_fails() -> None:
    failed = [r for r in checks(runs(patched_multi_reused=0)) if not r.ok]
    assert [r.name for r in failed] == [
        "patched: MultiConnector reuses the local prefix"
    ]


def test_a_patched_output_difference_fails() -> None:
    changed = [completion(1, 2), completion(3, 9)]
    failed = [r for r in checks(runs(patched_multi_output=changed)) if not r.ok]
    assert [r.name for r in failed] == [f"patched: {MULTI_CASE}: output = upstream P/D"]
    assert "differs in requests [1]" in failed[0].detail


def test_without_an_upstream_run_a_patched_run_cannot_pass() -> None:
    made = runs()
    made[0] = Run("unpatched", PLAIN_CASE, error="decode never became ready")
    compare_runs(REFERENCE, made)
    failed = [r for r in checks(made) if not r.ok]
    assert [r.detail for r in failed] == ["decode never became ready"] + [
        "no unpatched NixlConnector run to compare with"
    ] * 2
    assert math.isnan(made[0].min_gap)
