"""The doctor's rules for LMCache's two connectors, registered in `rules.RULES`.

LMCacheConnectorV1 (in-process) and LMCacheMPConnector (an LMCache
multi-process server) meet a hybrid model in ways of their own: the first
starts only with this project's series and then loads and saves nothing, the
second restores the recurrent state but checks the launch's numbers against
LMCache's own rules as it starts. Those rules, and the advice the general
HMA rule gives for LMCache (`lmcache_hma_remedy`), read LMCache's sources as
well as vLLM's, so they live apart from the rules about vLLM alone. Line
numbers are those of the LMCache version each docstring names.
"""

from collections.abc import Iterator

from vllm_overlay.doctor.facts import LMCACHE, LMCACHE_MP, ConnectorFacts, Facts
from vllm_overlay.doctor.findings import Finding, Severity
from vllm_overlay.doctor.hma import hma_enabled

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


def lmcache_hma_remedy(facts: Facts) -> str:
    """For a hybrid model: LMCacheConnectorV1 starts only with this
    project's series, and gets LMCache hits only as LMCacheMPConnector."""
    build = facts.build
    if build.pinned_series and not build.active_series:
        starts = (
            f"with the series {build.pinned_series} (`vllm-overlay serve` or the "
            "patched wheel)"
        )
    else:
        starts = (
            "only in a patched build of a pinned release "
            f"({', '.join(build.pinned_releases)})"
        )
    return (
        f"{LMCACHE} starts {starts} but gets no LMCache hits for a hybrid "
        f"model; for hits, {_mp_advice(facts)}"
    )


def _mp_advice(facts: Facts) -> str:
    """How to get LMCache hits on a hybrid model."""
    return (
        f"use {LMCACHE_MP} with an LMCache multi-process server (`lmcache "
        f'server`): --kv-transfer-config \'{{"kv_connector":"{LMCACHE_MP}",'
        f'"kv_role":"kv_both"}}\', {_mp_settings(facts)}'
    )


def _mp_settings(facts: Facts) -> str:
    """What LMCacheMPConnector needs with a hybrid model, with this launch's
    numbers where doctor knows them (see `lmcache_mp_settings`)."""
    launch = facts.launch
    n = launch.hybrid_block_size if launch else None
    batched = launch.max_num_batched_tokens if launch else None
    if n is None:
        chunk, budget = "a multiple of N", "from N to 2N-1"
        where = (
            ", where N is the attention block size vLLM raises to at start-up "
            "(its log: 'Setting attention block size to N tokens'; at least "
            "--block-size)"
        )
    else:
        default = "is" if 256 % n == 0 else "is not"
        chunk = f"a multiple of {n} (its default, 256, {default} one)"
        budget = f"from {n} to {2 * n - 1}"
        where = f" ({n} tokens: this launch's attention block size N)"
    now = f" (this launch: {batched})" if batched is not None else ""
    return (
        f"--mamba-cache-mode align, the server's --chunk-size {chunk}, and "
        f"--max-num-batched-tokens {budget}{now}; 2N or more only with the "
        f"server's --separate-object-groups{where}"
    )


def lmcache_importable(facts: Facts) -> Iterator[Finding]:
    """LMCacheConnectorV1.__init__ imports its adapter, from `lmcache` (or,
    with `use_native`, vLLM's in-tree adapter, which imports `lmcache` too)
    (kv_connector/v1/lmcache_connector.py). The series' connector
    skips that on a hybrid model, where it loads and saves nothing
    (`lmcache_on_hybrid`)."""
    lmcache = facts.lmcache
    if lmcache is None or lmcache.importable or _inert_lmcache(facts) is not None:
        return
    yield Finding(
        ERROR,
        f"{LMCACHE} imports its LMCache adapter when the engine creates the "
        f"connector, and that import fails here ({lmcache.error}): start-up "
        "stops with that error",
        "install LMCache into this environment (pip install lmcache)",
    )


def _inert_lmcache(facts: Facts) -> ConnectorFacts | None:
    """The selected LMCacheConnectorV1 when it runs inert: the series'
    connector keeps HMA on for a hybrid model only (its
    `supports_hma_for_model`), and there never builds LMCache's adapter."""
    connector = next((c for c in facts.connectors if c.name == LMCACHE), None)
    model = facts.model
    if connector is None or not connector.supports_hma:
        return None
    if model is None or not model.hybrid or not hma_enabled(facts):
        return None
    return connector


def lmcache_on_hybrid(facts: Facts) -> Iterator[Finding]:
    """The series' LMCacheConnectorV1 (lmcache-connector-hybrid-kv.patch)
    starts a hybrid model but loads and saves nothing for it: LMCache's
    in-process adapter (lmcache 0.5.6 included) restores attention KV only,
    and attention KV restored without the matching recurrent state garbles
    the output. The model serves correct output with zero LMCache hits, and
    the connector logs one line naming LMCacheMPConnector. Every other model
    keeps HMA off as upstream does. Unpatched, the connector has no HMA and
    `hybrid_without_hma` applies."""
    connector = _inert_lmcache(facts)
    if connector is None:
        return
    assert facts.model is not None
    child = f" (the {connector.parent} child)" if connector.parent else ""
    others = (
        "; the MultiConnector's other children work as before"
        if connector.parent
        else ""
    )
    yield Finding(
        WARNING,
        f"{LMCACHE}{child} starts with {facts.model.name} but loads and saves "
        "nothing for it: LMCache's in-process adapter restores attention KV "
        "only, and attention KV without the matching recurrent state would "
        "garble the output. It serves correct output with zero LMCache hits, "
        f"and logs one line naming {LMCACHE_MP}{others}",
        f"for LMCache hits on a hybrid model, {_mp_advice(facts)}",
    )


def lmcache_mp_settings(facts: Facts) -> Iterator[Finding]:
    """LMCacheMPConnector with a hybrid model. vLLM 0.31-0.33 resolve the
    name to LMCache's own class when `lmcache` imports and
    LMCACHE_USE_UPSTREAM_MP is unset (`_resolve_lmcache_mp_connector`,
    kv_connector/v1/lmcache_mp_connector.py); lmcache 0.5.6's class (line
    numbers below are that version's) supports HMA
    (lmcache/integration/vllm/lmcache_mp_connector.py :535) and checks, as
    it starts:

    - every Mamba group's mamba_cache_mode is align or all
      (`validate_kv_cache_groups`, integration/vllm/kv_cache_group_edits.py
      :129-171, called at lmcache_mp_connector.py :588); vLLM uses none when
      prefix caching is off, align when it is on (0.31 also offers all);
    - in align mode, max_num_batched_tokens >= N, the Mamba block size
      (`validate_mamba_step_alignment`, lmcache_mp_connector.py :371-427,
      called at :587): a smaller step never completes a block. A step of 2N
      or more leaves null blocks behind, which it calls safe only with the
      server's --separate-object-groups (:377-386;
      v1/multiprocess/config.py :502-508), so below 2N is the setting that
      holds without it;
    - the server's chunk size (`--chunk-size`, default 256:
      v1/multiprocess/config.py :37, :381) is a multiple of N
      (integration/vllm/vllm_multi_process_adapter.py :779-785, :1499-1505),
      which doctor cannot see.
    """
    connector = next((c for c in facts.connectors if c.name == LMCACHE_MP), None)
    model, launch = facts.model, facts.launch
    if connector is None or not connector.supports_hma or launch is None:
        return
    if model is None or not model.hybrid or not hma_enabled(facts):
        return
    mode, n = launch.mamba_cache_mode, launch.hybrid_block_size
    batched = launch.max_num_batched_tokens
    if mode is not None and mode not in ("align", "all"):
        yield Finding(
            ERROR,
            f"{LMCACHE_MP} refuses {model.name} at start-up: mamba_cache_mode is "
            f"{mode} (prefix caching is off), which keeps no recurrent-state "
            "snapshots to store (`ValueError: LMCache cannot serve this model's "
            "KV cache groups`)",
            "keep prefix caching on (drop --no-enable-prefix-caching) and pass "
            "--mamba-cache-mode align",
        )
        return
    if mode == "align" and n is not None and batched is not None:
        if batched < n:
            yield Finding(
                ERROR,
                f"{LMCACHE_MP} refuses --max-num-batched-tokens {batched} at "
                f"start-up: with {model.name}'s {n}-token blocks a scheduler "
                "step would never complete a block (`ValueError: Mamba-hybrid "
                "models with LMCache require max_num_batched_tokens >= "
                "block_size`)",
                f"pass --max-num-batched-tokens from {n} to {2 * n - 1}",
            )
        elif batched >= 2 * n:
            yield Finding(
                WARNING,
                f"--max-num-batched-tokens {batched} lets one scheduler step "
                f"advance several of {model.name}'s {n}-token blocks; vLLM keeps "
                "the recurrent state of the last one only, and LMCache stores "
                "the others safely only when its server runs with "
                "--separate-object-groups, which doctor cannot see",
                f"pass --max-num-batched-tokens from {n} to {2 * n - 1}, or "
                "start the LMCache server with --separate-object-groups",
            )
    yield Finding(
        INFO,
        f"{LMCACHE_MP} restores {model.name}'s recurrent state through an "
        f"LMCache multi-process server, and needs {_mp_settings(facts)}",
    )
