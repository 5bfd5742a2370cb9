"""The verdicts on the GPU driver's speculative-decoding cases
(`ci/suites/gpu_mtp.py` runs them; its docstring says what each is for).

Two kinds of comparison, named in each verdict:
- exact: the patched build against the unpatched one on the same path (the
  same P/D layout, or the same single server), which compute the same things;
- greedy, up to near ties: a P/D decode against one MTP server, or a
  speculating P/D against one that does not. The tiny hybrid is bfloat16 and
  its random logits are close, and a decode that verifies drafts computes its
  logits in other batches than one that does not, so the answers may part
  where the reference's best two tokens were within `NEAR_TIE` of each other
  (rounding picks either); parting anywhere else is a wrong answer.

Beside the P/D cases' verdicts (`cases.py`), whose runs and checks they
reuse, so that they are tested without a GPU.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ci.suites.pd.cases import (
    MTP,
    MTP_MULTI,
    MTP_NIXL,
    NO_SPECULATION,
    Check,
    Run,
    checks,
    counts_as,
    re_pulls,
    reuses_as,
)
from ci.suites.pd.completions import Completion, compare
from ci.suites.pd.metrics import DecodeCounts
from ci.suites.pd.pair import PATCHED, UNPATCHED

# The GPU driver's P/D case without speculation (the roles of the MTP
# checkpoint and the speculating cases are the CPU suite's: `cases.py`).
PLAIN_NIXL = "mtp-off-nixl"
# A top-two logprob gap under which greedy may pick either token (nats).
NEAR_TIE = 0.1
ISSUE_53912 = "vllm#53912 (upstream, no patch of ours claims it)"


@dataclass
class Served:
    """One server with prefix caching: every prompt one after the other,
    then the first again, and what its `/metrics` counted."""

    answers: list[Completion]
    repeat: Completion
    counts: DecodeCounts


def parting(reference: Completion, got: Completion) -> tuple[int, float] | None:
    """Where `got` first leaves `reference` and the reference's top-two gap
    there; None when they are the same tokens."""
    for index, (want, have) in enumerate(
        zip(reference.token_ids, got.token_ids, strict=False)
    ):
        if want != have:
            return index, reference.gaps[index]
    return None


def greedy_agrees(
    reference: Sequence[Completion], got: Sequence[Completion]
) -> tuple[bool, str]:
    """Whether every answer of `got` is the reference's or first leaves it at
    a near tie; what each parting was."""
    if len(reference) != len(got):
        return False, f"{len(got)} answers for {len(reference)} prompts"
    ok, partings = True, []
    for index, (want, have) in enumerate(zip(reference, got, strict=True)):
        found = parting(want, have)
        if found is None:
            continue
        token, gap = found
        tie = gap < NEAR_TIE
        ok = ok and tie
        kind = "a near tie" if tie else "not a tie"
        partings.append(
            f"request {index} parts at token {token}, gap {gap:.2g} ({kind})"
        )
    return ok, "; ".join(partings) or f"{len(got)} of {len(got)} identical"


def accepted(label: str, counts: DecodeCounts) -> Check:
    """Drafts were accepted, so the accepted-token path ran; the rate."""
    rate = counts.acceptance_rate
    shown = "no draft" if math.isnan(rate) else f"{rate:.0%}"
    return Check(
        f"{label}: drafts accepted",
        counts.accepted_tokens > 0,
        f"{counts.accepted_tokens:,} of {counts.draft_tokens:,} draft tokens "
        f"({shown}) in {counts.drafts:,} drafts",
    )


def _relations(by_key: dict[tuple[str, str], Run]) -> list[Check]:
    """The patched MultiConnector reuses as the patched NixlConnector; the
    unpatched one re-pulls (control)."""
    results = []
    for name, build, relation in (
        (
            "MultiConnector reuses the local prefix as NixlConnector does",
            PATCHED,
            reuses_as,
        ),
        ("MultiConnector re-pulls the local prefix (control)", UNPATCHED, re_pulls),
    ):
        got, want = by_key.get((build, MTP_MULTI)), by_key.get((build, MTP_NIXL))
        if got is None or want is None or got.counts is None or want.counts is None:
            continue
        g, w = got.counts, want.counts
        results.append(
            Check(
                f"{build}: MTP: {name}",
                relation(g, w),
                f"reused {g.reused:,} (against {w.reused:,}), "
                f"pulled {g.pulled:,} (against {w.pulled:,})",
            )
        )
    return results


def fill_table(
    runs: Sequence[Run], served: dict[tuple[str, str], Served | str]
) -> None:
    """Fill in the table's comparison of each completed P/D run with the
    server of its build and role (which tokens differ, the margins)."""
    for run in runs:
        reference = served.get((run.build, run.case.model))
        if run.counts is not None and isinstance(reference, Served):
            run.differing, run.min_gap, run.max_delta = compare(
                reference.answers, run.completions
            )


def judge_mtp(
    runs: Sequence[Run], served: dict[tuple[str, str], Served | str]
) -> tuple[list[Check], list[str]]:
    """The verdicts on the MTP cases and the lines only reported (vLLM
    #53912's symptom, upstream's behaviour): see the module docstring."""
    fill_table(runs, served)
    results = checks(runs)
    by_key = {(run.build, run.case.key): run for run in runs}
    results += _relations(by_key)
    for run in runs:
        if run.case.model == MTP and run.counts is not None:
            results.append(accepted(f"{run.build}: {run.case.label}", run.counts))
    for key, run in served.items():
        if isinstance(run, str):
            results.append(Check(f"{key[0]}: one server, {key[1]}", False, run[-300:]))
    patched_mtp = served.get((PATCHED, MTP))
    unpatched_mtp = served.get((UNPATCHED, MTP))
    if isinstance(patched_mtp, Served):
        results.append(accepted(f"{PATCHED}: one server, {MTP}", patched_mtp.counts))
        if isinstance(unpatched_mtp, Served):
            same = [*patched_mtp.answers, patched_mtp.repeat] == [
                *unpatched_mtp.answers,
                unpatched_mtp.repeat,
            ]
            results.append(
                Check(
                    f"{PATCHED}: one server, {MTP}: output = upstream (exact, scope)",
                    same,
                    "identical" if same else "differs from the unpatched server",
                )
            )
    plain = by_key.get((PATCHED, PLAIN_NIXL))
    for key in (MTP_NIXL, MTP_MULTI):
        run = by_key.get((PATCHED, key))
        if run is None or run.counts is None:
            continue
        label = f"{PATCHED}: {run.case.label}: output"
        if isinstance(patched_mtp, Served):
            ok, detail = greedy_agrees(patched_mtp.answers, run.completions)
            name = f"{label} = one MTP server (greedy, up to near ties)"
            results.append(Check(name, ok, detail))
        if plain is not None and plain.counts is not None:
            ok, detail = greedy_agrees(plain.completions, run.completions)
            name = f"{label} = P/D without speculation (greedy, up to near ties)"
            results.append(Check(name, ok, detail))
    return results, repeat_notes(served)


def repeat_notes(served: dict[tuple[str, str], Served | str]) -> list[str]:
    """Whether one server's repeated prompt, answered from its prefix
    cache, gives the first answer again (greedy, up to near ties), with
    speculation and without: reported, not judged."""
    notes = []
    for (build, role), run in served.items():
        if isinstance(run, str):
            continue
        ok, detail = greedy_agrees(run.answers[:1], [run.repeat])
        verdict = "same answer" if ok else "DIFFERENT answer"
        tag = ISSUE_53912 if role == MTP else "its control, no speculation"
        notes.append(
            f"{tag}: {build}, one server, {role}, prefix caching, "
            f"the first prompt again: {verdict} ({detail})"
        )
    return notes


def judge_cpu_mtp(
    runs: Sequence[Run], references: dict[str, Sequence[Completion]]
) -> list[Check]:
    """The CPU suite's verdicts on its MTP cases (case 7 of `cases.py`,
    prefix caching off), beside `cases.checks`' (each served, each patched
    output the unpatched run's of the same path): drafts were accepted on
    every run; each patched decode answers as one MTP server and as one
    server without speculation (greedy, up to near ties: the references of
    the MTP and the NO_SPECULATION roles); and, nothing being cached
    locally, the patched MultiConnector counts what its NixlConnector
    counts (here, not in `cases.RELATIONS`: the GPU driver's MTP cases have
    the same keys and prefix caching, and `judge_mtp` judges their reuse)."""
    results = [
        accepted(f"{run.build}: {run.case.label}", run.counts)
        for run in runs
        if run.case.model == MTP and run.counts is not None
    ]
    for run in runs:
        if run.case.model != MTP or run.build != PATCHED or run.counts is None:
            continue
        for role, what in ((MTP, "one MTP server"), (NO_SPECULATION, "one server")):
            if role not in references:
                continue
            ok, detail = greedy_agrees(references[role], run.completions)
            name = f"{PATCHED}: {run.case.label}: output = {what}"
            results.append(Check(f"{name} (greedy, up to near ties)", ok, detail))
    by_key = {(run.build, run.case.key): run for run in runs}
    multi, nixl = by_key.get((PATCHED, MTP_MULTI)), by_key.get((PATCHED, MTP_NIXL))
    if multi and nixl and multi.counts is not None and nixl.counts is not None:
        g, w = multi.counts, nixl.counts
        results.append(
            Check(
                f"{PATCHED}: MTP, no prefix caching: MultiConnector counts "
                "what NixlConnector counts",
                counts_as(g, w),
                f"pulled {g.pulled:,} (against {w.pulled:,}), computed "
                f"{g.computed:,} (against {w.computed:,})",
            )
        )
    return results
