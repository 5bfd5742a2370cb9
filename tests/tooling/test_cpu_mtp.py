"""The CPU suite's speculative-decoding cases (case 7 of
`ci/suites/pd/cases.py`) without servers: how they are served, and the
verdicts of `ci/suites/pd/mtp_verdicts.judge_cpu_mtp` on hand-written runs.
`python -m ci.suites.pd_e2e` runs them for real."""

from dataclasses import replace

from ci.suites.pd import load
from ci.suites.pd.bench import BenchResult
from ci.suites.pd.cases import (
    CASE_BY_KEY,
    CASES,
    CHECKPOINTS,
    CONTROLS,
    FLOAT32_MODELS,
    MODEL_ARGS,
    MTP,
    MTP_MULTI,
    MTP_NIXL,
    NO_SPECULATION,
    SPECULATING_MODELS,
    Run,
    checks,
)
from ci.suites.pd.completions import Completion
from ci.suites.pd.load import LoadRun
from ci.suites.pd.metrics import DecodeCounts
from ci.suites.pd.mtp_verdicts import judge_cpu_mtp
from ci.suites.pd.pair import PATCHED, UNPATCHED

ANSWERS = [
    Completion((1, 2, 3), (-1.0,) * 3, (2.0, 0.05, 2.0)),
    Completion((4, 5, 6), (-1.0,) * 3, (2.0, 2.0, 2.0)),
]
REFERENCES = {MTP: ANSWERS, NO_SPECULATION: ANSWERS}


def pulled_all(accepted: int = 21) -> DecodeCounts:
    """A decode server's counts of a run that pulled every prompt (no prefix
    caching) and verified 90 draft tokens."""
    return DecodeCounts(
        0, 5996, 4, 0, 0, 6000, 5996, 0, 1.0, 4, 45, 90, accepted_tokens=accepted
    )


def mtp_runs(**changes: Run) -> list[Run]:
    """Both MTP cases on both builds, clean, keyed `build/case` in `changes`
    to replace one."""
    made = {
        f"{build}/{key}": Run(build, CASE_BY_KEY[key], pulled_all(), list(ANSWERS))
        for build in (UNPATCHED, PATCHED)
        for key in (MTP_NIXL, MTP_MULTI)
    }
    made.update(changes)
    return list(made.values())


def failed(made: list[Run], references=REFERENCES) -> list[str]:
    results = checks(made) + judge_cpu_mtp(made, references)
    return [check.name for check in results if not check.ok]


def test_the_mtp_cases_speculate_on_both_servers_without_prefix_caching() -> None:
    for key in (MTP_NIXL, MTP_MULTI):
        case = CASE_BY_KEY[key]
        assert case in CASES and case.model == MTP and not case.prefix_caching
    assert "--speculative-config" in MODEL_ARGS[MTP]
    assert "--speculative-config" not in MODEL_ARGS[NO_SPECULATION]
    assert CHECKPOINTS[MTP] == CHECKPOINTS[NO_SPECULATION] == "tiny-qwen3.5-mtp"
    assert CONTROLS == {MTP: NO_SPECULATION}


def test_clean_mtp_runs_pass_every_verdict() -> None:
    made = mtp_runs()
    results = judge_cpu_mtp(made, REFERENCES)
    assert failed(made) == []
    names = [r.name for r in results]
    assert sum(n.endswith("drafts accepted") for n in names) == 4
    assert sum("= one MTP server (greedy" in n for n in names) == 2
    assert sum("= one server (greedy" in n for n in names) == 2
    assert any("MultiConnector counts what NixlConnector counts" in n for n in names)


def test_an_mtp_run_that_accepted_no_draft_fails() -> None:
    case = CASE_BY_KEY[MTP_MULTI]
    made = mtp_runs(
        **{
            "patched/mtp-multi": Run(
                PATCHED, case, pulled_all(accepted=0), list(ANSWERS)
            )
        }
    )
    assert failed(made) == [f"{PATCHED}: {case.label}: drafts accepted"]


def test_an_answer_that_parts_from_one_server_off_a_near_tie_fails() -> None:
    parted = Completion((1, 9, 3), (-1.0,) * 3, (2.0, 2.0, 2.0))
    label = CASE_BY_KEY[MTP_NIXL].label
    made = mtp_runs()
    assert failed(made, {MTP: ANSWERS, NO_SPECULATION: [parted, ANSWERS[1]]}) == [
        f"{PATCHED}: {label}: output = one server (greedy, up to near ties)",
        f"{PATCHED}: {CASE_BY_KEY[MTP_MULTI].label}: output = one server "
        "(greedy, up to near ties)",
    ]
    # Parting where the reference's best two tokens were within a near tie
    # (a gap of 0.05 nats at token 1) is allowed.
    near = [replace(parted, gaps=(2.0, 0.05, 2.0)), ANSWERS[1]]
    assert failed(made, {MTP: ANSWERS, NO_SPECULATION: near}) == []


def test_a_patched_multi_connector_that_counts_otherwise_fails() -> None:
    case = CASE_BY_KEY[MTP_MULTI]
    made = mtp_runs(
        **{
            "patched/mtp-multi": Run(
                PATCHED, case, replace(pulled_all(), computed=5), list(ANSWERS)
            )
        }
    )
    assert failed(made) == [
        f"{PATCHED}: MTP, no prefix caching: MultiConnector counts what "
        "NixlConnector counts"
    ]


def mtp_load_run(build: str, texts: tuple[str, ...]) -> LoadRun:
    """A load run of the speculating NixlConnector case that completed
    every request cleanly with `texts`."""
    bench = BenchResult(
        completed=len(texts),
        failed=0,
        output_throughput=10.0,
        ttfts=(0.1,) * len(texts),
        tpots=(0.01,) * len(texts),
        texts=texts,
        errors=("",) * len(texts),
    )
    return LoadRun(build, CASE_BY_KEY[MTP_NIXL], bench, pulled_all())


def test_a_speculating_load_run_is_judged_on_everything_but_its_output() -> None:
    """Under load the speculating hybrid's answers part from its P/D path's
    at bfloat16 near ties the text cannot show (`ci/suites/pd/load.py`)."""
    parted = [mtp_load_run(UNPATCHED, ("a", "b")), mtp_load_run(PATCHED, ("a", "c"))]
    names = [c.name for c in load.checks(parted, FLOAT32_MODELS, SPECULATING_MODELS)]
    assert all(c.ok for c in load.checks(parted, FLOAT32_MODELS, SPECULATING_MODELS))
    assert not any("output" in name for name in names)
    assert any(name.endswith("no read of released blocks") for name in names)
    parted[1].invalid_reads = 1
    failed_now = [
        c.name
        for c in load.checks(parted, FLOAT32_MODELS, SPECULATING_MODELS)
        if not c.ok
    ]
    assert failed_now == [
        f"load: {PATCHED}: {CASE_BY_KEY[MTP_NIXL].label}: no read of released blocks"
    ]
