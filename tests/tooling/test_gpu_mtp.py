"""The GPU driver's speculative-decoding cases (`ci/suites/gpu_mtp.py`)
without a GPU: the tiny MTP checkpoint's recipe, the servers' arguments,
the speculative counters read from `/metrics`, and the verdicts
(`ci/suites/pd/mtp_verdicts.py`) on hand-written results. The servers
themselves need a GPU runner."""

import hashlib
import json
from pathlib import Path

import pytest

from ci.fixtures import tiny_model
from ci.fixtures.tiny_configs import CONFIGS
from ci.fixtures.tiny_mtp import COPY, EMBEDDING_HALF, ZERO, mtp_recipe
from ci.suites import gpu_e2e, gpu_mtp
from ci.suites.pd.cases import Run, connector_name
from ci.suites.pd.completions import Completion
from ci.suites.pd.metrics import DecodeCounts, decode_counts, parse_metrics
from ci.suites.pd.mtp_verdicts import (
    MTP,
    MTP_MULTI,
    MTP_NIXL,
    NO_SPECULATION,
    PLAIN_NIXL,
    Served,
    judge_mtp,
)
from ci.suites.pd.pair import PATCHED, UNPATCHED, Layout, serve_command
from vllm_overlay.series.loader import release_series

ANSWER = Completion((5, 6, 7), (-1.0, -1.0, -1.0), (1.0, 0.05, 1.0))
ANSWERS = [ANSWER] * 4
# The main model's tensors of tiny-qwen3.5's full-attention layer (layer 3).
LAYER_3 = [
    f"model.layers.3.{suffix}"
    for suffix in (
        "input_layernorm.weight",
        "mlp.down_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "post_attention_layernorm.weight",
        "self_attn.k_norm.weight",
        "self_attn.k_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_norm.weight",
        "self_attn.q_proj.weight",
        "self_attn.v_proj.weight",
    )
]
MAIN = ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"]


def test_the_mtp_checkpoint_is_the_hybrid_with_one_mtp_layer() -> None:
    mtp = dict(CONFIGS["tiny-qwen3.5-mtp"])
    assert mtp.pop("mtp_num_hidden_layers") == 1
    assert mtp == CONFIGS["tiny-qwen3.5"]


def test_the_mtp_head_copies_the_last_attention_layer_silenced() -> None:
    names = [*MAIN, *(n.replace(".3.", ".2.") for n in LAYER_3), *LAYER_3]
    recipe = mtp_recipe(CONFIGS["tiny-qwen3.5-mtp"], names)
    assert recipe["mtp.fc.weight"] == (EMBEDDING_HALF, "model.embed_tokens.weight")
    for norm in ("norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        assert recipe[f"mtp.{norm}.weight"] == (ZERO, "model.norm.weight")
    layer = {k: v for k, v in recipe.items() if k.startswith("mtp.layers.")}
    assert sorted(layer) == sorted(
        n.replace("model.layers.3.", "mtp.layers.0.") for n in LAYER_3
    )
    zeroed = sorted(k for k, (how, _) in layer.items() if how == ZERO)
    assert zeroed == [
        "mtp.layers.0.mlp.down_proj.weight",
        "mtp.layers.0.self_attn.o_proj.weight",
    ]
    assert all(how == COPY for k, (how, _) in layer.items() if k not in zeroed)
    assert all(source.startswith("model.layers.3.") for _, source in layer.values())


def test_only_the_mtp_checkpoint_digest_keys_on_the_head() -> None:
    """The other checkpoints' digests are what they were, so cached models
    are not rewritten; the MTP one changes with the head's recipe."""
    old = json.dumps(
        [CONFIGS["tiny-qwen3.5"], repr(tiny_model.VOCABULARY)], sort_keys=True
    )
    assert (
        tiny_model.model_digest("tiny-qwen3.5")
        == hashlib.sha256(old.encode()).hexdigest()
    )
    assert tiny_model.model_digest("tiny-qwen3.5-mtp") != tiny_model.model_digest(
        "tiny-qwen3.5"
    )


def test_the_cases_and_their_servers_arguments(tmp_path, monkeypatch) -> None:
    assert gpu_mtp.mtp_cases("0.22.1", gpu_e2e.NIXL_GPU, gpu_e2e.OFFLOADING) == ()
    cases = gpu_mtp.mtp_cases("0.30.0", gpu_e2e.NIXL_GPU, gpu_e2e.OFFLOADING)
    assert [(c.key, c.model, c.upstream, c.prefix_caching) for c in cases] == [
        (MTP_NIXL, MTP, "", True),
        (MTP_MULTI, MTP, MTP_NIXL, True),
        (PLAIN_NIXL, NO_SPECULATION, "", True),
    ]
    assert connector_name(cases[1].decode) == (
        "MultiConnector[NixlConnector, OffloadingConnector]"
    )
    assert cases[0].decode["kv_buffer_device"] == "cuda"
    monkeypatch.setattr(
        gpu_mtp, "ensure_tiny_model", lambda name, models, python: models / name
    )
    base = Layout({PATCHED: tmp_path}, {}, tmp_path, tmp_path, tmp_path, ("--x",))
    layout = gpu_mtp.mtp_layout(base, tmp_path / "models", tmp_path / "python")
    spec = serve_command(layout, PATCHED, MTP, 8000, None)
    plain = serve_command(layout, PATCHED, NO_SPECULATION, 8000, None)
    assert spec[2] == plain[2] == str(tmp_path / "models" / "tiny-qwen3.5-mtp")
    assert "--enable-prefix-caching" in spec and "--x" in spec
    config = json.loads(spec[spec.index("--speculative-config") + 1])
    assert config == {"method": "mtp", "num_speculative_tokens": 2}
    assert "--speculative-config" not in plain


def test_the_speculative_counters_come_from_metrics() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            'vllm:spec_decode_num_drafts_total{engine="0"} 40.0',
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
            'vllm:spec_decode_num_draft_tokens_total{engine="0"} 80.0',
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
            'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 30.0',
            "",
        ]
    )
    counts = decode_counts([], parse_metrics(text))
    assert (counts.drafts, counts.draft_tokens, counts.accepted_tokens) == (40, 80, 30)
    assert counts.acceptance_rate == 0.375
    assert (
        decode_counts([], []).acceptance_rate != decode_counts([], []).acceptance_rate
    )


def counts(reused: int = 0, accepted: int = 10) -> DecodeCounts:
    return DecodeCounts(
        reused, 3000 - reused, 4, 3000, reused, 3000, 3000, 0, 1.0, 4, 20, 40, accepted
    )


def results(**changes):
    """Every MTP run as it should be, with `changes` (a key, or a (build,
    role) of a single server, to a replacement)."""
    cases = {
        c.key: c
        for c in gpu_mtp.mtp_cases("0.33.0", gpu_e2e.NIXL_GPU, gpu_e2e.OFFLOADING)
    }
    reuse = {MTP_NIXL: 1056, MTP_MULTI: 1056, PLAIN_NIXL: 1056}
    runs = {
        (build, key): Run(
            build,
            case,
            counts(reuse[key] if (build, key) != (UNPATCHED, MTP_MULTI) else 0),
            list(ANSWERS),
        )
        for build in (UNPATCHED, PATCHED)
        for key, case in cases.items()
    }
    served = {
        (build, role): Served(list(ANSWERS), ANSWER, counts())
        for build in (UNPATCHED, PATCHED)
        for role in (MTP, NO_SPECULATION)
    }
    for key, value in changes.items():
        target = runs if key in (MTP_NIXL, MTP_MULTI, PLAIN_NIXL) else served
        build_key = (PATCHED, key) if target is runs else (UNPATCHED, MTP)
        target[build_key] = value
    return list(runs.values()), served


def failed(checks) -> list[str]:
    return [c.name for c in checks if not c.ok]


def test_mtp_runs_as_they_should_pass_and_report_the_rate() -> None:
    checks, notes = judge_mtp(*results())
    assert failed(checks) == []
    names = [c.name for c in checks]
    assert (
        "patched: MTP: MultiConnector reuses the local prefix as NixlConnector does"
        in names
    )
    assert "unpatched: MTP: MultiConnector re-pulls the local prefix (control)" in names
    rate = next(c for c in checks if c.name.endswith("NixlConnector: drafts accepted"))
    assert rate.detail == "10 of 40 draft tokens (25%) in 20 drafts"
    assert len(notes) == 4 and all("same answer" in note for note in notes)


def test_a_patched_multiconnector_that_re_pulls_fails() -> None:
    cases = {
        c.key: c
        for c in gpu_mtp.mtp_cases("0.33.0", gpu_e2e.NIXL_GPU, gpu_e2e.OFFLOADING)
    }
    checks, _ = judge_mtp(
        *results(
            **{MTP_MULTI: Run(PATCHED, cases[MTP_MULTI], counts(0), list(ANSWERS))}
        )
    )
    assert failed(checks) == [
        "patched: MTP: MultiConnector reuses the local prefix as NixlConnector does"
    ]


@pytest.mark.parametrize("position, gap, ok", [(1, 0.05, True), (2, 1.0, False)])
def test_a_decode_may_part_from_the_references_only_at_a_near_tie(
    position, gap, ok
) -> None:
    tokens = list(ANSWER.token_ids)
    tokens[position] = 99
    parted = Completion(tuple(tokens), ANSWER.logprobs, ANSWER.gaps)
    runs, served = results()
    reference = Completion(ANSWER.token_ids, ANSWER.logprobs, (1.0, gap, gap))
    for key in ((PATCHED, MTP), (UNPATCHED, MTP)):
        served[key] = Served([reference] * 4, reference, counts())
    for run in runs:
        if run.build == PATCHED and run.case.key == PLAIN_NIXL:
            run.completions = [reference] * 4
        elif run.case.model == MTP:
            run.completions = [ANSWER, parted, ANSWER, ANSWER]
    checks, _ = judge_mtp(runs, served)
    greedy = [c for c in checks if "greedy" in c.name]
    assert len(greedy) == 4 and all(c.ok == ok for c in greedy), greedy
    assert f"request 1 parts at token {position}" in greedy[0].detail
    # The table compares each run with the one server of its build and role.
    spec = [run for run in runs if run.case.model == MTP]
    assert all(run.differing == (1,) and run.min_gap == 0.05 for run in spec)


def test_no_accepted_draft_fails_where_it_speculates() -> None:
    runs, served = results()
    for run in runs:
        run.counts = counts(run.counts.reused, accepted=0)
    checks, _ = judge_mtp(runs, served)
    multi = "MultiConnector[NixlConnector, OffloadingConnector]"
    assert failed(checks) == [
        f"{build}: hybrid+mtp: {decode}: drafts accepted"
        for build in (UNPATCHED, PATCHED)
        for decode in ("NixlConnector", multi)
    ]


def test_upstreams_mtp_repeat_answering_otherwise_is_reported_not_judged() -> None:
    """vLLM #53912's symptom on the unpatched build is upstream's: a note,
    and the patched build answering otherwise than upstream is what fails."""
    garbage = Completion((9, 9, 9), ANSWER.logprobs, ANSWER.gaps)
    checks, notes = judge_mtp(
        *results(**{MTP: Served(list(ANSWERS), garbage, counts())})
    )
    assert failed(checks) == [
        "patched: one server, hybrid+mtp: output = upstream (exact, scope)"
    ]
    [note] = [n for n in notes if "DIFFERENT" in n]
    assert note.startswith(
        "vllm#53912 (upstream, no patch of ours claims it): unpatched"
    )
    assert "request 0 parts at token 0, gap 1 (not a tie)" in note


def test_a_failed_single_server_is_reported_with_its_log() -> None:
    checks, _ = judge_mtp(
        *results(**{MTP: "Traceback ...\nCUDA error: illegal memory access"})
    )
    [bad] = [c for c in checks if not c.ok]
    assert (
        bad.name == "unpatched: one server, hybrid+mtp"
        and "illegal memory" in bad.detail
    )


@pytest.mark.parametrize("release, ran", [("0.22.1", False), ("0.33.0", True)])
def test_the_driver_runs_the_mtp_cases_on_both_builds(
    tmp_path, monkeypatch, release, ran
) -> None:
    """From 0.30.0 every build runs them and their verdicts join the rest;
    before it the driver says they did not run."""
    calls = []
    base = Layout({}, {}, tmp_path, tmp_path, tmp_path)
    stubs = {
        "ensure_env": lambda version, cache: tmp_path,
        "layouts": lambda series, cache, venv: (base, base),
        "fetch_wheel": lambda pin, dist, cache: type("W", (), {"path": tmp_path})(),
        "build_release": lambda series, dist, out: tmp_path,
        "install": lambda venv, wheel: None,
        "pd_cases": lambda version: (),
        "single_runs": lambda layout, build, prompt: {},
        "run_lmcache_mp": lambda layout, build, prompt, log: "",
        "judge_single": lambda model, runs: [],
        "judge_mp": lambda runs, mp: [],
        "mtp_layout": lambda layout, models, python: layout,
        "run_mtp": lambda layout, build, cases, prompts: (
            calls.append((build, len(cases))) or ([], {})
        ),
        "judge_mtp": lambda runs, served: ([], ["a note"]),
    }
    for name, stub in stubs.items():
        monkeypatch.setattr(gpu_e2e, name, stub)
    found = gpu_e2e.run_gpu_cases(release_series(release), Path(tmp_path))
    assert calls == [(UNPATCHED, 3 if ran else 0), (PATCHED, 3 if ran else 0)]
    if ran:
        assert found.notes == ["a note"]
    else:
        assert found.notes == [gpu_mtp.NOT_RUN.format(release="0.22.1")]
