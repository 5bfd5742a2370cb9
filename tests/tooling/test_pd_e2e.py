"""The pure parts of the P/D end-to-end suite (`ci/suites/pd_e2e.py`, `ci/suites/pd/`):
reading a decode server's `/metrics`, reading completions, comparing them
with the reference, and the verdicts. The servers themselves run in
`tools/test.sh`."""

import http.server
import json
import math
import os
import subprocess
import sys
import threading
from http.client import IncompleteRead
from pathlib import Path
from types import SimpleNamespace

import pytest

from ci.suites.pd import pair as pair_module
from ci.suites.pd import receive
from ci.suites.pd.cases import (
    CASE_BY_KEY,
    CASES,
    FLOAT32_MODELS,
    HYBRID,
    MTP,
    SPECULATING_MODELS,
    UNIFY_REFUSAL,
    Run,
    cases_named,
    checks,
    compare_with_references,
    connector_name,
)
from ci.suites.pd.completions import (
    Completion,
    HTTPStatusError,
    compare,
    make_prompts,
    parse_completion,
    streamed_tokens,
)
from ci.suites.pd.hosts import NO_AMX, PINS_VARIABLE, QWEN3_NEXT_MOE, pinned
from ci.suites.pd.metrics import DecodeCounts, decode_counts, metric_sum, parse_metrics
from ci.suites.pd.pair import DROP_IN, PATCHED, UNPATCHED, Layout, Pair, serve_command
from ci.suites.serve_e2e import HOST_PINS
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.facts import gdn_hybrid, pd_core_cases

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
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.5
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 3.0
process_open_fds 31.0
"""


def test_metrics_are_read_with_their_labels() -> None:
    samples = parse_metrics(METRICS)
    assert len(samples) == 14
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
    assert labels == {"a": 'x"y,z', "b": "2"}
    assert value == 5.0


def test_a_line_without_a_value_is_refused() -> None:
    with pytest.raises(OverlayError, match="unreadable /metrics"):
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
    assert counts.requests == 0
    later = parse_metrics(
        METRICS.replace("} 1.5", "} 2.5").replace(
            '_count{engine="0",model_name="m"} 3.0',
            '_count{engine="0",model_name="m"} 5.0',
        )
    )
    assert decode_counts(before, later).mean_ttft_s == pytest.approx(0.5)


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


def counts(reused: int, pulled: int, computed: int = 4) -> DecodeCounts:
    return DecodeCounts(
        reused, pulled, computed, 6000, reused, 6000 - reused, pulled, 0, 1.0, 4
    )


REFERENCE = [completion(1, 2), completion(3, 4)]
# The non-hybrid and the Mamba2 hybrid: float32, where P/D equals one server.
OTHER_REFERENCE = [completion(5, 6), completion(7, 8)]


def runs(**changes: Run) -> list[Run]:
    """Every run of a clean suite, keyed `build/case` in `changes` to replace
    one; compared with the references. The unpatched MultiConnector run
    differs from its single server in request 1 (reported, not failed on:
    that is upstream's P/D on a bfloat16 hybrid)."""
    hybrid_multi = CASE_BY_KEY["hybrid-multi"]
    made = {
        "unpatched/hybrid-nixl": Run(
            UNPATCHED, CASE_BY_KEY["hybrid-nixl"], counts(3456, 2540), list(REFERENCE)
        ),
        "patched/hybrid-nixl": Run(
            PATCHED, CASE_BY_KEY["hybrid-nixl"], counts(3456, 2540), list(REFERENCE)
        ),
        "unpatched/hybrid-multi": Run(
            UNPATCHED,
            hybrid_multi,
            counts(0, 5996),
            [REFERENCE[0], completion(3, 5)],
        ),
        "patched/hybrid-multi": Run(
            PATCHED, hybrid_multi, counts(3456, 2540), list(REFERENCE)
        ),
        "drop-in/hybrid-multi": Run(
            DROP_IN, hybrid_multi, counts(3456, 2540), list(REFERENCE)
        ),
        "unpatched/hybrid-lmcache": Run(
            UNPATCHED,
            CASE_BY_KEY["hybrid-lmcache"],
            error="decode never became ready",
            log=f"ValueError: {UNIFY_REFUSAL}.",
        ),
        "patched/hybrid-lmcache": Run(
            PATCHED, CASE_BY_KEY["hybrid-lmcache"], counts(3456, 2540), list(REFERENCE)
        ),
    }
    for key in ("dense-multi", "mamba2-multi"):
        for build in (UNPATCHED, PATCHED):
            made[f"{build}/{key}"] = Run(
                build, CASE_BY_KEY[key], counts(0, 5996), list(OTHER_REFERENCE)
            )
    made.update(changes)
    compare_with_references(
        {
            "tiny-qwen3.5": REFERENCE,
            "tiny-llama": OTHER_REFERENCE,
            "tiny-nemotron-h": OTHER_REFERENCE,
        },
        list(made.values()),
    )
    return list(made.values())


def failed(made: list[Run]) -> list[str]:
    return [check.name for check in checks(made) if not check.ok]


def test_a_clean_suite_passes_with_every_verdict() -> None:
    made = runs()
    results = checks(made)
    assert all(r.ok for r in results), [str(r) for r in results if not r.ok]
    names = [r.name for r in results]
    assert "unpatched: MultiConnector re-pulls the local prefix (control)" in names
    assert "drop-in: vllm-overlay serve counts what the patched build counts" in names
    assert (
        "unpatched: tiny-qwen3.5: MultiConnector[NixlConnector, LMCacheConnectorV1] "
        "refused at start-up (control)"
    ) in names
    assert not any(n.startswith("unpatched") and "output" in n for n in names)
    # Every build that is not upstream is compared with upstream's P/D.
    assert sum("output = upstream P/D" in n for n in names) == 6
    assert made[2].differing == (1,)


def test_a_patched_multi_connector_that_re_pulls_fails() -> None:
    made = runs(
        **{
            "patched/hybrid-multi": Run(
                PATCHED, CASE_BY_KEY["hybrid-multi"], counts(0, 5996), list(REFERENCE)
            )
        }
    )
    assert failed(made) == [
        "patched: MultiConnector reuses the local prefix as NixlConnector does",
        "drop-in: vllm-overlay serve counts what the patched build counts",
    ]


def test_an_unpatched_multi_connector_that_reuses_fails_the_control() -> None:
    made = runs(
        **{
            "unpatched/hybrid-multi": Run(
                UNPATCHED, CASE_BY_KEY["hybrid-multi"], counts(3456, 2540), REFERENCE
            )
        }
    )
    assert failed(made) == [
        "unpatched: MultiConnector re-pulls the local prefix (control)"
    ]


def test_a_patched_output_difference_fails() -> None:
    changed = [completion(1, 2), completion(3, 9)]
    made = runs(
        **{
            "drop-in/hybrid-multi": Run(
                DROP_IN, CASE_BY_KEY["hybrid-multi"], counts(3456, 2540), changed
            )
        }
    )
    results = [r for r in checks(made) if not r.ok]
    assert [r.name for r in results] == [
        "drop-in: tiny-qwen3.5: MultiConnector[NixlConnector, "
        "DecodeBenchConnector]: output = upstream P/D"
    ]
    assert "differs in requests [1]" in results[0].detail


def test_an_out_of_scope_model_that_counts_otherwise_fails() -> None:
    made = runs(
        **{
            "patched/dense-multi": Run(
                PATCHED, CASE_BY_KEY["dense-multi"], counts(0, 5995, 5), OTHER_REFERENCE
            )
        }
    )
    assert failed(made) == [
        "patched: the non-hybrid counts what upstream counts (scope)"
    ]


def test_an_lmcache_case_that_upstream_starts_fails_the_control() -> None:
    made = runs(
        **{
            "unpatched/hybrid-lmcache": Run(
                UNPATCHED,
                CASE_BY_KEY["hybrid-lmcache"],
                error="decode never became ready",
                log="RuntimeError: something else",
            )
        }
    )
    [result] = [r for r in checks(made) if not r.ok]
    assert result.name.endswith("refused at start-up (control)")
    assert "failed otherwise: decode never became ready" in result.detail


def test_without_an_upstream_run_a_patched_run_cannot_pass() -> None:
    made = runs(
        **{
            "unpatched/hybrid-nixl": Run(
                UNPATCHED, CASE_BY_KEY["hybrid-nixl"], error="decode never became ready"
            )
        }
    )
    results = [r for r in checks(made) if not r.ok]
    assert [r.detail for r in results] == ["decode never became ready"] + [
        "no unpatched hybrid-nixl run to compare with"
    ] * 4
    assert math.isnan(made[0].min_gap)


def test_every_case_names_its_connectors_and_has_its_upstream_run() -> None:
    assert connector_name(CASE_BY_KEY["hybrid-lmcache"].decode) == (
        "MultiConnector[NixlConnector, LMCacheConnectorV1]"
    )
    runs = {(build, case.key) for case in CASES for build in case.builds}
    assert all(PATCHED in case.builds for case in CASES)
    assert all((UNPATCHED, case.upstream_key) in runs for case in CASES)
    assert len({case.key for case in CASES}) == len(CASES)


def test_the_load_runs_are_those_a_verdict_reads() -> None:
    """Every shipped build of a load case runs under load, and of upstream's
    runs only the one the bfloat16 hybrid's output is held to: the float32
    models' oracle is their reference server, the speculating one has none."""
    runs = {(build, case.key) for case in CASES for build in case.builds}
    loaded = {(build, case.key) for case in CASES for build in case.load}
    assert loaded <= runs
    for case in CASES:
        if case.load:
            assert set(case.builds) - {UNPATCHED} <= set(case.load), case.key
    oracles = {
        (UNPATCHED, case.upstream_key)
        for case in CASES
        if case.load and case.model not in (*FLOAT32_MODELS, *SPECULATING_MODELS)
    }
    assert {run for run in loaded if run[0] == UNPATCHED} == oracles
    assert oracles == {(UNPATCHED, "hybrid-nixl")}


def test_the_drop_in_runs_vllm_overlay_serve_and_the_others_vllm_serve(
    tmp_path,
) -> None:
    layout = Layout(
        envs={b: tmp_path / b for b in (UNPATCHED, PATCHED, DROP_IN)},
        models={"m": tmp_path / "m"},
        proxy=tmp_path / "proxy.py",
        logs=tmp_path,
        vllm_cache=tmp_path,
    )
    drop_in = serve_command(layout, DROP_IN, "m", 8000, None, prefix_caching=False)
    assert drop_in[:2] == [str(tmp_path / DROP_IN / "bin" / "vllm-overlay"), "serve"]
    assert "--no-enable-prefix-caching" in drop_in
    assert "--kv-transfer-config" not in drop_in
    patched = serve_command(layout, PATCHED, "m", 8000, {"kv_connector": "X"})
    assert patched[:2] == [str(tmp_path / PATCHED / "bin" / "vllm"), "serve"]
    assert patched[-2:] == ["--kv-transfer-config", '{"kv_connector": "X"}']


def fake_pair(tmp_path) -> Pair:
    server = SimpleNamespace(log=tmp_path / "decode.log")
    return Pair(server, 1, server, 2, server, 3)  # type: ignore[arg-type]


def test_a_slow_first_handshake_is_retried(monkeypatch, tmp_path) -> None:
    answers = iter([IncompleteRead(b""), OSError("HTTP 500"), None])

    def complete(port, model, prompt):
        answer = next(answers)
        if answer is not None:
            raise answer
        assert (port, prompt) == (3, pair_module.HANDSHAKE_PROMPT)

    monkeypatch.setattr(pair_module, "complete", complete)
    monkeypatch.setattr(pair_module.time, "sleep", lambda s: None)
    pair_module.shake_hands(fake_pair(tmp_path), tmp_path)
    assert next(answers, "done") == "done"


def test_a_pair_whose_handshake_keeps_failing_is_an_error(
    monkeypatch, tmp_path
) -> None:
    def complete(port, model, prompt):
        raise IncompleteRead(b"")

    monkeypatch.setattr(pair_module, "complete", complete)
    monkeypatch.setattr(pair_module.time, "sleep", lambda s: None)
    with pytest.raises(OverlayError, match="first request failed 3 times"):
        pair_module.shake_hands(fake_pair(tmp_path), tmp_path)


def test_the_handshake_prompt_shares_no_block_with_the_suite() -> None:
    prompts = make_prompts()
    assert all(pair_module.HANDSHAKE_PROMPT[:16] != prompt[:16] for prompt in prompts)


def qwen3_next_runs(**changes: Run) -> list[Run]:
    """The runs of 0.22.1's Qwen3-Next cases, keyed as `runs`: the whole
    prompt pulled on every build."""
    made = {
        f"{build}/{key}": Run(
            build, CASE_BY_KEY[key], counts(0, 5996), list(OTHER_REFERENCE)
        )
        for key in ("qwen3-next-nixl", "qwen3-next-multi")
        for build in (UNPATCHED, PATCHED)
    }
    made.update(changes)
    compare_with_references({"tiny-qwen3-next": OTHER_REFERENCE}, list(made.values()))
    return list(made.values())


def test_the_qwen3_next_cases_pass_when_every_build_counts_alike() -> None:
    results = checks(qwen3_next_runs())
    assert all(r.ok for r in results), [str(r) for r in results if not r.ok]
    assert [r.name for r in results if "upstream counts" in r.name] == [
        "patched: 0.22.1's Gated DeltaNet hybrid counts what upstream counts",
        "patched: its MultiConnector counts what upstream counts (scope)",
    ]


def test_a_patched_qwen3_next_multi_connector_that_counts_otherwise_fails() -> None:
    made = qwen3_next_runs(
        **{
            "patched/qwen3-next-multi": Run(
                PATCHED,
                CASE_BY_KEY["qwen3-next-multi"],
                counts(2048, 3948),
                list(OTHER_REFERENCE),
            )
        }
    )
    assert failed(made) == [
        "patched: its MultiConnector counts what upstream counts (scope)"
    ]


def test_the_qwen3_next_cases_are_not_the_e2e_releases_and_pin_their_host() -> None:
    for key in ("qwen3-next-nixl", "qwen3-next-multi"):
        case = CASE_BY_KEY[key]
        assert case not in CASES
        assert not case.prefix_caching
        assert case.env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
        assert (Path(case.env["PYTHONPATH"]) / "sitecustomize.py").is_file()
    # The e2e release's bfloat16 hybrids run on a host without AMX too (their
    # load runs' outputs vary with the batch on one with AMX); the float32
    # models on the host as it is.
    for case in CASES:
        if case.model in (HYBRID, MTP):
            assert case.env == NO_AMX, case.key
            assert (Path(case.env["PYTHONPATH"]) / "sitecustomize.py").is_file()
        else:
            assert not case.env, case.key


def fake_torch(root: Path, amx: bool) -> Path:
    """A stand-in `torch` package whose `torch.cpu` answers `amx`: the
    function vLLM 0.22.1 asks (torch/cpu/__init__.py in torch 2.11)."""
    package = root / "torch"
    (package / "cpu").mkdir(parents=True)
    (package / "__init__.py").write_text("from torch import cpu\n")
    (package / "cpu" / "__init__.py").write_text(
        f"def _is_amx_tile_supported():\n    return {amx}\n"
    )
    return root


ASK_TORCH = (
    "import sys; imported = 'torch' in sys.modules; import torch; "
    "print(imported, torch.cpu._is_amx_tile_supported())"
)


def run_pinned(
    code: str, path: list[str], pins: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh Python whose path starts with `path`, with the
    variables of `pins` (a host pin's environment) set."""
    pins = pins or {}
    pins_path = [pins["PYTHONPATH"]] if "PYTHONPATH" in pins else []
    env = {
        **{k: v for k, v in os.environ.items() if k != PINS_VARIABLE},
        **pins,
        "PYTHONPATH": os.pathsep.join([*path, *pins_path]),
    }
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )


def test_the_host_pin_hides_amx_tiles_without_importing_torch(tmp_path) -> None:
    torch_root = str(fake_torch(tmp_path, amx=True))
    pin = CASE_BY_KEY["qwen3-next-nixl"].env
    assert run_pinned(ASK_TORCH, [torch_root]).stdout.strip() == "False True"
    assert run_pinned(ASK_TORCH, [torch_root], pin).stdout.strip() == "False False"


def fake_cpu_fused_moe(root: Path) -> Path:
    """A stand-in for vLLM 0.22.1's CPU MoE module, as much of it as the
    pin reads: its activation table, whose SiLU entry builds `SiluAndMul`
    at every call (model_executor/layers/fused_moe/cpu_fused_moe.py:52-56),
    which outside a vLLM config raises as CustomOp.__init__ does there
    (custom_op.py:133, config/vllm.py:2215)."""
    package = root / "vllm" / "model_executor" / "layers" / "fused_moe"
    package.mkdir(parents=True)
    for level in (package, *list(package.parents)[:3]):
        (level / "__init__.py").write_text("")
    (package / "cpu_fused_moe.py").write_text(
        "import enum\n"
        "class MoEActivation(enum.Enum):\n"
        "    SILU = 'silu'\n"
        "class SiluAndMul:\n"
        "    def __init__(self, compile_native=True):\n"
        "        raise AssertionError('Current vLLM config is not set.')\n"
        "    @staticmethod\n"
        "    def forward_native(x):\n"
        "        return ('silu and mul', x)\n"
        "_CPU_MOE_ACT_FN = {\n"
        "    MoEActivation.SILU: lambda x: SiluAndMul(compile_native=False)"
        ".forward_native(x),\n"
        "}\n"
    )
    return root


ASK_MOE = (
    "from vllm.model_executor.layers.fused_moe import cpu_fused_moe as m; "
    "print(m._CPU_MOE_ACT_FN[m.MoEActivation.SILU](3))"
)


def test_the_qwen3_next_pins_mend_the_moe_activation_of_0_22_1(tmp_path) -> None:
    vllm_root = str(fake_cpu_fused_moe(tmp_path))
    unpinned = run_pinned(ASK_MOE, [vllm_root])
    assert "Current vLLM config is not set" in unpinned.stderr
    for pins in (QWEN3_NEXT_MOE, CASE_BY_KEY["qwen3-next-multi"].env):
        assert run_pinned(ASK_MOE, [vllm_root], pins).stdout.strip() == (
            "('silu and mul', 3)"
        )
    # The serve suite's 0.22.1 hybrid starts on such a host too.
    assert HOST_PINS[gdn_hybrid("0.22.1")] == QWEN3_NEXT_MOE


@pytest.mark.parametrize("names", ["", "no-amx-tiles no-such-pin"])
def test_a_host_pin_that_names_no_known_pin_stops_the_server(names) -> None:
    ran = run_pinned("print('served')", [], {**pinned(), PINS_VARIABLE: names})
    assert ran.returncode == 2
    assert "served" not in ran.stdout
    assert f"{PINS_VARIABLE}={names!r}: name host pins of" in ran.stderr


def bare_layout(root: Path) -> Layout:
    """A layout whose every path is `root`: enough for a command line."""
    return Layout(
        envs={UNPATCHED: root},
        models={"m": root / "m"},
        proxy=root / "proxy.py",
        logs=root,
        vllm_cache=root,
    )


def test_a_cases_host_pin_reaches_its_servers(monkeypatch, tmp_path) -> None:
    started = []
    monkeypatch.setattr(
        pair_module, "start", lambda stack, command, env, log: started.append(env)
    )
    layout = bare_layout(tmp_path)
    pin = CASE_BY_KEY["qwen3-next-nixl"].env
    pair_module.start_vllm(None, layout, UNPATCHED, "m", "a", None, host_env=pin)  # type: ignore[arg-type]
    pair_module.start_vllm(None, layout, UNPATCHED, "m", "b", None)  # type: ignore[arg-type]
    assert {k: started[0][k] for k in pin} == pin
    assert "PYTHONPATH" not in started[1]


def test_a_confined_server_runs_whole_on_its_cores(monkeypatch, tmp_path) -> None:
    """The pair's servers run under `taskset -c <cores>`: the API server and
    the engine core too, not only the model's OpenMP threads; a server that
    is not confined (the one-server yardstick) starts as vLLM starts it."""
    started = []
    monkeypatch.setattr(
        pair_module, "start", lambda stack, command, env, log: started.append(command)
    )
    monkeypatch.setattr(pair_module.shutil, "which", lambda name: f"/bin/{name}")
    layout = bare_layout(tmp_path)
    pair_module.start_vllm(None, layout, UNPATCHED, "m", "a", None, "1", confine=True)  # type: ignore[arg-type]
    pair_module.start_vllm(None, layout, UNPATCHED, "m", "b", None, "1")  # type: ignore[arg-type]
    assert started[0][:3] == ["/bin/taskset", "-c", "1"]
    assert (
        started[0][3:5] == started[1][:2] == [str(tmp_path / "bin" / "vllm"), "serve"]
    )


def test_confining_without_taskset_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(pair_module.shutil, "which", lambda name: None)
    with pytest.raises(OverlayError, match=r"taskset \(util-linux\) is not on PATH"):
        pair_module.taskset()


def test_the_release_facts_name_known_cases_and_an_unknown_one_is_refused() -> None:
    for release, keys in pd_core_cases().items():
        assert [case.key for case in cases_named(keys, release)] == list(keys)
    with pytest.raises(OverlayError, match="facts names unknown P/D cases: nope"):
        cases_named(["hybrid-nixl", "nope"], "facts")


@pytest.mark.parametrize(
    ("outcome", "as_required"),
    [
        ("HTTP 400: kv_transfer_params['remote_port'] must be a port number", True),
        ("HTTP 400: kv_transfer_params['remote_host'] must be a string", False),
        ("HTTP 500: EngineCore encountered an issue", False),
        (receive.CLEAN, False),
        ("no answer within 60s", False),
    ],
)
def test_a_malformed_row_must_be_refused_naming_its_field(
    outcome: str, as_required: bool
) -> None:
    """A malformed reference's row passes only on HTTP 400 naming its field:
    an answer (even the clean one), another status or another field fails
    it. A well-formed row still needs the clean answer."""
    row = receive.Row("malformed: a negative remote_port", outcome, "remote_port")
    assert row.as_required is as_required
    assert receive.Row("a row", outcome).as_required is (outcome == receive.CLEAN)


def test_upstream_receive_rows_run_only_when_asked(monkeypatch) -> None:
    """The suite runs the receive-path rows on the patched build's two
    layouts and judges them; upstream's pair, printed and never judged, runs
    only with `--upstream-receive`."""
    ran = []

    def attacked(layout, build, name):
        ran.append((build, name))
        return [receive.Row("a row", receive.CLEAN)], []

    monkeypatch.setattr(receive, "attacked_pair", attacked)
    checks, printed = receive.run_receive_faults(SimpleNamespace())
    assert ran == [(PATCHED, "MultiConnector"), (PATCHED, "NixlConnector")]
    assert [c.ok for c in checks] == [True, True]
    ran.clear()
    checks, printed = receive.run_receive_faults(SimpleNamespace(), upstream=True)
    assert ran[-1] == (UNPATCHED, "NixlConnector")
    assert len(checks) == 2 and len(printed) == 3


def _answer(tokens: tuple[int, ...]) -> dict[str, object]:
    """A `/v1/completions` answer of `tokens`, as `parse_completion` reads it."""
    return {
        "choices": [
            {
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t in tokens],
                    "token_logprobs": [-1.0] * len(tokens),
                    "top_logprobs": [{"a": -1.0, "b": -2.0}] * len(tokens),
                }
            }
        ]
    }


@pytest.mark.parametrize(
    ("got", "ties", "outcome"),
    [
        ((1, 2, 3), False, receive.CLEAN),
        ((1, 9, 9), False, "wrong answer"),
        ((1, 9, 9), True, f"{receive.CLEAN}, up to a near tie at token 1 (gap 0.05)"),
        ((1, 2, 9), True, "wrong answer"),
        ((1, 9), True, "wrong answer"),
    ],
)
def test_an_answer_is_clean_up_to_a_near_tie_only_where_asked(got, ties, outcome):
    """The fleet's rows (`ties`) take an answer that first parts from the
    clean one where its best two tokens were within NEAR_TIE (the bfloat16
    hybrid's tokens move with the batch and the path); a parting elsewhere,
    or another length, is a wrong answer, and the receive rows stay exact."""
    clean = Completion((1, 2, 3), (-1.0,) * 3, (1.0, 0.05, 2.0))
    assert receive.judged(lambda: _answer(got), clean, 60, ties) == outcome
    assert receive.Row("a row", outcome).as_required is (outcome != "wrong answer")


class _Streamer(http.server.BaseHTTPRequestHandler):
    """Answers a completion request as vLLM streams one: two chunks of token
    ids and [DONE], or HTTP 500 for a body asking for `fail`."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("fail"):
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"engine dead")
            return
        self.send_response(200)
        self.end_headers()
        for tokens in (["token_id:5"], [], ["token_id:6", "token_id:7"]):
            chunk = {"choices": [{"logprobs": {"tokens": tokens}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: object) -> None:
        pass


def test_streamed_tokens_yields_each_chunks_ids_and_names_a_failed_status():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Streamer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        assert list(streamed_tokens(port, {})) == [[5], [], [6, 7]]
        with pytest.raises(HTTPStatusError, match="HTTP 500 engine dead"):
            list(streamed_tokens(port, {"fail": True}))
    finally:
        server.shutdown()
        server.server_close()
