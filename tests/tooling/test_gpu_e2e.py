"""The GPU driver (`ci/suites/gpu_e2e.py`) on a machine without a GPU, and its
verdicts on single-server LMCache runs (`ci/suites/pd/gpu_verdicts.py`). Its
servers need a GPU runner."""

import shutil

import pytest

from ci.suites import gpu_e2e
from ci.suites.gpu_e2e import hybrid_block_size
from ci.suites.pd.cases import UNIFY_REFUSAL, Run, checks
from ci.suites.pd.completions import Completion
from ci.suites.pd.gpu_verdicts import HYBRID, SLIDING, Single, judge_mp, judge_single
from ci.suites.pd.metrics import DecodeCounts
from ci.suites.pd.pair import PATCHED, UNPATCHED
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.loader import release_series

ANSWERS = [Completion((1, 2), (-1.0, -1.0), (1.0, 1.0))] * 2


def counts(external_hits: int) -> DecodeCounts:
    return DecodeCounts(0, 0, 100, 100, 0, 100, external_hits, 0, 0.05, 1)


def single(external_hits: int = 0, answers=ANSWERS) -> Single:
    return Single(list(answers), counts(0), counts(external_hits))


@pytest.mark.parametrize("require", [False, True])
def test_without_a_gpu_nothing_runs_and_nothing_passes(
    monkeypatch, capsys, require
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    code = gpu_e2e.main(["0.33.0", *(["--require-gpu"] if require else [])])
    assert code == (1 if require else 0)
    assert "skipped: no nvidia-smi on PATH; no GPU case ran" in capsys.readouterr().out


def test_an_inert_lmcache_on_a_hybrid_passes() -> None:
    runs = {
        (UNPATCHED, HYBRID, True): f"ValueError: {UNIFY_REFUSAL}",
        (PATCHED, HYBRID, False): single(),
        (PATCHED, HYBRID, True): single(),
    }
    results = judge_single(HYBRID, runs)
    assert [r.ok for r in results] == [True, True, True], results


def test_lmcache_hits_on_a_hybrid_fail() -> None:
    runs = {
        (UNPATCHED, HYBRID, True): f"ValueError: {UNIFY_REFUSAL}",
        (PATCHED, HYBRID, False): single(),
        (PATCHED, HYBRID, True): single(external_hits=256),
    }
    failed = [r.name for r in judge_single(HYBRID, runs) if not r.ok]
    assert failed == [f"gpu: {HYBRID}: zero LMCache hits (inert)"]


def test_a_sliding_window_model_must_hit_and_count_as_upstream() -> None:
    other = [Completion((1, 3), (-1.0, -1.0), (1.0, 1.0))] * 2
    runs = {
        (UNPATCHED, SLIDING, True): single(external_hits=256, answers=other),
        (PATCHED, SLIDING, False): single(),
        (PATCHED, SLIDING, True): single(external_hits=256),
    }
    failed = [r.name for r in judge_single(SLIDING, runs) if not r.ok]
    assert failed == [f"gpu: {SLIDING}: LMCache counts as upstream (scope)"]


def test_a_failed_run_is_reported_with_its_log() -> None:
    runs = {
        (UNPATCHED, SLIDING, True): single(external_hits=256),
        (PATCHED, SLIDING, False): single(),
        (PATCHED, SLIDING, True): "Traceback ...\nCUDA error: out of memory",
    }
    [result] = judge_single(SLIDING, runs)
    assert not result.ok
    assert "out of memory" in result.detail


def test_the_hybrid_block_size_comes_from_vllms_log(tmp_path) -> None:
    log = tmp_path / "plain.log"
    log.write_text(
        "(Worker pid=1) INFO [interface.py:1097] Setting attention block size to "
        "528 tokens to ensure that attention page size is >= mamba page size.\n"
    )
    assert hybrid_block_size(log) == 528
    log.write_text("nothing about blocks\n")
    with pytest.raises(OverlayError, match="does not say the hybrid's attention"):
        hybrid_block_size(log)


def test_lmcache_mp_must_hit_answer_alike_and_count_as_upstream() -> None:
    runs = {(PATCHED, HYBRID, False): single()}
    mp = {UNPATCHED: single(external_hits=528), PATCHED: single(external_hits=528)}
    assert all(r.ok for r in judge_mp(runs, mp))
    mp[PATCHED] = single(external_hits=0)
    failed = [r.name for r in judge_mp(runs, mp) if not r.ok]
    assert failed == [
        f"gpu: {HYBRID}: LMCacheMPConnector hits on the repeat",
        f"gpu: {HYBRID}: LMCacheMPConnector counts as upstream (scope)",
    ]


def test_0_22_1_runs_the_seed_decode_side_reuse_case() -> None:
    """Before 0.23.0 the series carries the seed's NIXL backports; their reuse
    case needs prefix caching, which Qwen3-Next only has in "align" mode
    (where upstream 0.22.1's decode worker dies), so it runs on the Mamba2
    hybrid in "all" mode."""
    seed = gpu_e2e.pd_cases("0.22.1")
    assert [case.key for case in seed] == ["seed-nixl", "seed-multi"]
    assert {case.model for case in seed} == {"tiny-nemotron-h"}
    assert all(case.prefix_caching for case in seed)
    assert gpu_e2e.SEED_MODEL_ARGS["tiny-nemotron-h"] == ("--mamba-cache-mode", "all")
    assert gpu_e2e.pd_env("0.22.1") == {"VLLM_SSM_CONV_STATE_LAYOUT": "DS"}
    assert gpu_e2e.pd_env("0.32.0") == {}
    assert [case.key for case in gpu_e2e.pd_cases("0.31.0")] == [
        "hybrid-nixl",
        "hybrid-multi",
    ]


def test_seed_reuse_verdicts_fail_an_unpatched_reuse_and_a_patched_re_pull() -> None:
    by_case = {case.key: case for case in gpu_e2e.pd_cases("0.22.1")}

    def run(build, key, reused):
        return Run(
            build,
            by_case[key],
            DecodeCounts(
                reused,
                6000 - reused,
                4,
                6000,
                reused,
                6000 - reused,
                6000 - reused,
                0,
                1.0,
                4,
            ),
            list(ANSWERS),
        )

    good = [
        run(UNPATCHED, "seed-nixl", 0),
        run(PATCHED, "seed-nixl", 3456),
        run(UNPATCHED, "seed-multi", 0),
        run(PATCHED, "seed-multi", 3456),
    ]
    assert all(check.ok for check in checks(good)), checks(good)
    bad = [*good[:3], run(PATCHED, "seed-multi", 0)]
    assert [c.name for c in checks(bad) if not c.ok] == [
        "patched: 0.22.1's MultiConnector reuses as its NixlConnector does"
    ]


def test_the_layouts_give_each_role_its_model_and_the_pairs_their_settings(
    tmp_path, monkeypatch
) -> None:
    """0.22.1: the hybrid role is Qwen3-Next, the seed's Mamba2 model is
    made for its pairs, and only the pairs serve long prompts in Mamba "all"
    mode with the conv state dim-first; LMCache's settings reach both."""
    made = []

    def tiny_model(name, models, python):
        made.append(name)
        return models / name

    monkeypatch.setattr(gpu_e2e, "ensure_tiny_model", tiny_model)
    monkeypatch.setattr(gpu_e2e, "fetch_sdist_tree", lambda pin, cache: tmp_path)
    venv = tmp_path / "venv"
    single, pairs = gpu_e2e.layouts(release_series("0.22.1"), tmp_path, venv)
    models = tmp_path / "gpu-e2e" / "models"
    assert single.models == {
        HYBRID: models / "tiny-qwen3-next",
        SLIDING: models / SLIDING,
        "tiny-nemotron-h": models / "tiny-nemotron-h",
    }
    assert sorted(made) == ["tiny-gemma3", "tiny-nemotron-h", "tiny-qwen3-next"]
    assert single.logs == tmp_path / "gpu-e2e" / "logs" / "0.22.1"
    assert single.logs.is_dir() and single.envs == {PATCHED: venv, UNPATCHED: venv}
    assert single.serve_args == gpu_e2e.GPU_SERVE_ARGS and single.model_args == {}
    assert pairs.serve_args == gpu_e2e.PD_SERVE_ARGS
    assert pairs.model_args == gpu_e2e.SEED_MODEL_ARGS
    assert pairs.extra_env == {**gpu_e2e.LMCACHE_ENV, **gpu_e2e.SEED_ENV}
    assert single.extra_env == gpu_e2e.LMCACHE_ENV
