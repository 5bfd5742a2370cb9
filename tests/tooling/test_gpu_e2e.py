"""The GPU driver (`ci/gpu_e2e.py`) on a machine without a GPU, and its
verdicts on single-server LMCache runs. Its servers need a GPU runner."""

import shutil

import pytest

from ci import gpu_e2e
from ci.gpu_e2e import (
    HYBRID,
    SLIDING,
    Single,
    hybrid_block_size,
    judge_mp,
    judge_single,
)
from ci.pd.cases import UNIFY_REFUSAL
from ci.pd.completions import Completion
from ci.pd.metrics import DecodeCounts
from ci.pd.pair import PATCHED, UNPATCHED
from vllm_overlay.errors import OverlayError

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
