"""Fill the facts from the installed vLLM, without starting an engine.

Everything is asked of vLLM itself, so that doctor judges what this release
would do: its `serve` parser reads the arguments (any flag `vllm serve`
accepts is accepted), `EngineArgs.create_engine_config` builds the
`VllmConfig` (which decides on the hybrid KV cache manager), its model
registry says whether the model is hybrid, and its connector factory resolves
the connector classes. Building the config reads the model's config and
tokenizer but loads no weights and starts no process. The other server of
a prefill/decode pair (`--peer`) is built the same way.
"""

import argparse
import copy
import dataclasses
import importlib
import inspect
import os
from typing import Any
from unittest import mock

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.doctor.compat import compatibility_factors, differences
from vllm_overlay.doctor.facts import (
    LMCACHE,
    MULTI,
    NIXL,
    NO_SPECULATION,
    BuildFacts,
    ConnectorFacts,
    DependencyFacts,
    FactorDifference,
    Facts,
    LaunchFacts,
    ModelFacts,
    PeerFacts,
    SpeculativeFacts,
)
from vllm_overlay.doctor.hf_config import model_from_config_json
from vllm_overlay.doctor.installed_sources import (
    conv_state_forced_sd,
    cpu_requires_triton,
    cpu_speculation_kernels,
    mamba_kernel_launch,
)

LMCACHE_ADAPTER = "lmcache.integration.vllm.vllm_v1_adapter"
NATIVE_LMCACHE_ADAPTER = (
    "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_integration.vllm_v1_adapter"
)
# Where nixl-decode-confirms-reads keeps the values of `declined_reads`: the
# pull scheduler's module (0.30.0 on), else NIXL's one scheduler module
# (0.22.1).
NIXL_DECLINED_READS_MODULES = (
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler",
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl.scheduler",
)
# Speculative methods whose draft has layers with a KV cache of their own,
# besides the EAGLE-style ones (`SpeculativeConfig.uses_draft_kv_cache`,
# 0.30.0 on; 0.22.1 allocates the same).
DRAFT_KV_METHODS = ("draft_model", "extract_hidden_states")
PEER = "the --peer arguments"


def gather(
    serve_args: list[str], build: BuildFacts, peer_args: list[str] | None = None
) -> Facts:
    """The facts of `vllm serve SERVE_ARGS` on the installed vLLM, and of
    the other server of its P/D pair when `peer_args` names it."""
    # The report replaces vLLM's start-up log; keep its INFO lines out of it.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    platform = _platform()
    if platform[0] is None:
        # vLLM's own parser needs a platform: `vllm serve` stops right here.
        return Facts(build=build, launch=LaunchFacts(platform=None))
    engine_args = _engine_args(serve_args, "these arguments")
    model, model_config = model_facts(engine_args)
    config, error = _engine_config(engine_args)
    kv_transfer = (config or engine_args).kv_transfer_config
    connectors = connector_facts(
        kv_transfer, config.model_config if config else model_config
    )
    selected = {c.name for c in connectors}
    return Facts(
        build=build,
        model=model,
        launch=launch_facts(engine_args, config, error, platform),
        connectors=connectors,
        lmcache=lmcache_facts(_extra_config_of(kv_transfer, LMCACHE))
        if LMCACHE in selected
        else None,
        nixl=nixl_facts() if NIXL in selected else None,
        declined_reads_values=declined_reads_values() if NIXL in selected else None,
        peer=None if peer_args is None else peer_facts(peer_args, config, platform),
    )


def peer_facts(
    peer_args: list[str], config: Any, platform: tuple[str | None, bool | None]
) -> PeerFacts:
    """The other server of the pair, built as this launch is, and where the
    two differ in NIXL's compatibility hash (`config`: this launch's)."""
    engine_args = _engine_args(peer_args, PEER)
    peer_config, error = _engine_config(engine_args)
    kv_transfer = (peer_config or engine_args).kv_transfer_config
    model_config = peer_config.model_config if peer_config else None
    return PeerFacts(
        model=engine_args.model,
        hybrid=model_config.is_hybrid if model_config else None,
        launch=launch_facts(engine_args, peer_config, error, platform),
        connectors=connector_facts(kv_transfer, model_config),
        hash_differences=(
            hash_differences(config, peer_config) if config and peer_config else None
        ),
    )


def hash_differences(config: Any, peer: Any) -> tuple[FactorDifference, ...] | None:
    """Where the two configs differ in what NIXL's compatibility hash covers;
    each with the attention backend vLLM's selector picks for it, as the
    worker names its layers' backend."""
    try:
        backends = [_attention_backend(c).get_name() for c in (config, peer)]
    except Exception:  # private internals: any failure means "not known"
        return None
    mine = compatibility_factors(config, backends[0])
    theirs = compatibility_factors(peer, backends[1])
    if mine is None or theirs is None:
        return None
    return differences(mine, theirs)


def _engine_args(serve_args: list[str], who: str) -> Any:
    """The `AsyncEngineArgs` `vllm serve SERVE_ARGS` starts from; `who`
    names the arguments in a refusal."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = parse_serve_args(serve_args, who)
    try:
        return AsyncEngineArgs.from_cli_args(args)
    except Exception as exc:  # e.g. a model name the hub refuses
        raise OverlayError(f"vllm serve rejects {who}: {_describe(exc)}") from None


def launch_facts(
    engine_args: Any,
    config: Any,
    error: str | None,
    platform: tuple[str | None, bool | None],
) -> LaunchFacts:
    """The launch as vLLM resolved it in `config`; without a config, only the
    flags as given."""
    if config is None:
        return LaunchFacts(
            platform=platform[0],
            platform_supports_hma=platform[1],
            hma_flag=engine_args.disable_hybrid_kv_cache_manager,
            config_error=error,
            prefix_caching=engine_args.enable_prefix_caching,
            chunked_prefill=engine_args.enable_chunked_prefill,
            block_size=engine_args.block_size,
        )
    return LaunchFacts(
        platform=platform[0],
        platform_supports_hma=platform[1],
        hma_flag=engine_args.disable_hybrid_kv_cache_manager,
        hma_enabled=not config.scheduler_config.disable_hybrid_kv_cache_manager,
        speculative=speculative_facts(config.speculative_config),
        prefix_caching=config.cache_config.enable_prefix_caching,
        chunked_prefill=config.scheduler_config.enable_chunked_prefill,
        mamba_cache_mode=config.cache_config.mamba_cache_mode,
        block_size=engine_args.block_size,
        max_num_batched_tokens=config.scheduler_config.max_num_batched_tokens,
        hybrid_block_size=hybrid_block_size(config),
        mamba_kernel_launch=mamba_kernel_launch(),
        cpu_speculation_kernels=cpu_speculation_kernels(),
        cpu_requires_triton=cpu_requires_triton(),
        **_forced_sd(),
    )


def _forced_sd() -> dict[str, Any]:
    """The check after which the CPU platform forces the conv state layout
    SD, and whether this host passes it."""
    check = conv_state_forced_sd()
    if check is None:
        return {}
    import torch

    passes = getattr(torch.cpu, check, None)
    host = None if passes is None else bool(passes())
    return {"conv_state_forced_sd": check, "host_forces_sd": host}


def speculative_facts(speculative: Any) -> SpeculativeFacts:
    """The built `SpeculativeConfig` (None: off), as the rules need it."""
    if speculative is None:
        return NO_SPECULATION
    has_draft_kv = speculative.use_eagle() or speculative.method in DRAFT_KV_METHODS
    draft = speculative.draft_model_config
    return SpeculativeFacts(
        method=speculative.method,
        num_speculative_tokens=speculative.num_speculative_tokens,
        draft_model=draft.model if has_draft_kv and draft is not None else None,
    )


def hybrid_block_size(config: Any) -> int | None:
    """N, the attention block size a hybrid model runs with: vLLM raises it
    only at engine start, in every worker (`WorkerProc.__init__` calls
    `update_block_size_for_backend`, v1/executor/multiproc_executor.py),
    from the attention backends of the model's layers. Doctor builds no
    layers, so it runs that same platform method on a copy of the config with
    the backend vLLM's selector picks for a decoder attention layer of this
    model standing in for them. None for a model that is not hybrid, or when
    vLLM's internals do not allow it (the rules then describe N instead of
    naming it)."""
    if not config.model_config.is_hybrid:
        return None
    from vllm.platforms import current_platform

    platform = type(current_platform)
    try:
        scratch = copy.deepcopy(config)
        backend = _attention_backend(scratch)
        with _layers_backed_by(platform, backend):
            platform.update_block_size_for_backend(scratch)
    except Exception:  # private internals: any failure means "not known"
        return None
    return scratch.cache_config.block_size


def _attention_backend(config: Any) -> Any:
    """The backend vLLM's selector picks for a decoder attention layer of
    the model of `config`."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    model = config.model_config
    with set_current_vllm_config(config):
        return get_attn_backend(
            model.get_head_size(),
            model.dtype,
            config.cache_config.cache_dtype,
            use_mla=model.use_mla,
        )


def _layers_backed_by(platform: type, backend: Any) -> Any:
    """Stand `backend` in for the model's attention layers where the
    platform looks them up: `_find_non_ssm_backends` (a list, 0.31.0 on) or,
    in older releases (0.22.1, 0.30.0), `_find_non_ssm_backend` (the first
    one)."""
    if hasattr(platform, "_find_non_ssm_backends"):
        found = classmethod(lambda cls, vllm_config: [backend])
        return mock.patch.object(platform, "_find_non_ssm_backends", found)
    first = classmethod(lambda cls, vllm_config: backend)
    return mock.patch.object(platform, "_find_non_ssm_backend", first)


def parse_serve_args(
    serve_args: list[str], who: str = "these arguments"
) -> argparse.Namespace:
    """The arguments as `vllm serve` parses and validates them: with its own
    subcommand parser, the positional model taking precedence; `who` names
    them in a refusal."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    try:
        args = parser.parse_args(["serve", *serve_args])
    except SystemExit as exc:
        if exc.code:
            raise OverlayError(
                f"vLLM's `serve` parser rejects {who} (see above)"
            ) from None
        raise
    if args.model_tag is not None:
        args.model = args.model_tag
    try:
        command.validate(args)
    except (TypeError, ValueError) as exc:
        raise OverlayError(f"vllm serve rejects {who}: {exc}") from None
    return args


def _platform() -> tuple[str | None, bool | None]:
    """The resolved device platform and whether it supports HMA."""
    from vllm.platforms import current_platform

    if current_platform.is_unspecified():
        return None, None
    return current_platform.device_type, current_platform.support_hybrid_kv_cache()


def _engine_config(engine_args: Any) -> tuple[Any, str | None]:
    """The `VllmConfig` `vllm serve` builds, or vLLM's reason for refusing."""
    from vllm.usage.usage_lib import UsageContext

    try:
        config = engine_args.create_engine_config(
            usage_context=UsageContext.OPENAI_API_SERVER
        )
    except Exception as exc:  # vLLM's validation raises many types
        return None, _describe(exc)
    return config, None


def model_facts(engine_args: Any) -> tuple[ModelFacts, Any]:
    """Whether the model is hybrid, by vLLM's model registry
    (`ModelConfig.is_hybrid`), or by its config.json when vLLM cannot build
    the model's config; and that `ModelConfig` (None: it cannot be built)."""
    name = engine_args.model
    try:
        model_config = engine_args.create_model_config()
    except Exception as exc:  # an unknown model fails in many ways
        why = f"vLLM could not build its config: {_describe(exc)}"
        return model_from_config_json(name, why), None
    kinds = set(getattr(model_config.hf_text_config, "layer_types", None) or ())
    detail = model_config.architecture
    if kinds:
        detail += f"; layer types: {', '.join(sorted(kinds))}"
    facts = ModelFacts(
        name=name,
        hybrid=model_config.is_hybrid,
        source="vLLM's model registry",
        detail=detail,
        mixed_attention={"sliding_attention", "full_attention"} <= kinds,
    )
    return facts, model_config


def connector_facts(kv_transfer: Any, model_config: Any) -> tuple[ConnectorFacts, ...]:
    """The selected connector, then a MultiConnector's children, each with
    vLLM's factory's verdict on HMA for this model
    (`KVConnectorFactory.supports_hma_config`, which `VllmConfig` asks too)."""
    if kv_transfer is None or kv_transfer.kv_connector is None:
        return ()
    top = _connector(kv_transfer, None, model_config)
    if kv_transfer.kv_connector != MULTI:
        return (top,)
    children = kv_transfer.kv_connector_extra_config.get("connectors") or []
    return (top, *(_child(kv_transfer, child, model_config) for child in children))


def _child(parent: Any, entry: dict[str, Any], model_config: Any) -> ConnectorFacts:
    """A MultiConnector child, from the fields KVTransferConfig knows (the
    series' `load_weight` is MultiConnector's own key)."""
    from vllm.config import KVTransferConfig

    known = {f.name for f in dataclasses.fields(KVTransferConfig)}
    fields = {"engine_id": parent.engine_id}
    fields.update({k: v for k, v in entry.items() if k in known})
    try:
        config = KVTransferConfig(**fields)
    except Exception as exc:  # pydantic validation
        name = str(entry.get("kv_connector"))
        return ConnectorFacts(name, None, parent=MULTI, error=_describe(exc))
    return _connector(config, MULTI, model_config)


def _connector(
    kv_transfer: Any, parent: str | None, model_config: Any
) -> ConnectorFacts:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    name = kv_transfer.kv_connector
    try:
        cls = KVConnectorFactory.get_connector_class(kv_transfer)
        supports = _supports_hma(KVConnectorFactory, kv_transfer, model_config)
    except Exception as exc:  # an unknown name, a module that does not import
        return ConnectorFacts(name, None, parent=parent, error=_describe(exc))
    path = f"{cls.__module__}.{cls.__qualname__}"
    extra = (kv_transfer.kv_connector_extra_config or {}) if name == NIXL else {}
    return ConnectorFacts(
        name,
        supports,
        class_path=path,
        parent=parent,
        declined_reads=extra.get("declined_reads"),
        handshake_check=extra.get("enforce_handshake_compat"),
    )


def _supports_hma(factory: Any, kv_transfer: Any, model_config: Any) -> bool:
    """`supports_hma_config` as `VllmConfig` asks it: for this model where
    the sources ask connectors per model (the series'
    lmcache-connector-hybrid-kv.patch adds `model_config`, which
    LMCacheConnectorV1 answers True for hybrid models only), else with the
    transfer config alone, as upstream; and by the classes where the factory
    has no such method (0.22.1)."""
    if not hasattr(factory, "supports_hma_config"):
        return _supports_hma_by_class(factory, kv_transfer, model_config)
    if "model_config" in inspect.signature(factory.supports_hma_config).parameters:
        return factory.supports_hma_config(kv_transfer, model_config)
    return factory.supports_hma_config(kv_transfer)


def _supports_hma_by_class(factory: Any, kv_transfer: Any, model_config: Any) -> bool:
    """0.22.1's rule (`VllmConfig.__post_init__`, vllm/config/vllm.py:1448-1470
    there): `supports_hma` of the connector's class and, for a MultiConnector,
    of every child's class; for this model where `supports_hma` takes one (the
    0.22.1 form of lmcache-connector-hybrid-kv.patch), as `VllmConfig` asks."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma

    def supported(cls: Any) -> bool:
        if "model_config" in inspect.signature(supports_hma).parameters:
            return supports_hma(cls, model_config)
        return supports_hma(cls)

    cls = factory.get_connector_class(kv_transfer)
    if not supported(cls):
        return False
    if cls.__name__ != MULTI:
        return True
    children = kv_transfer.kv_connector_extra_config.get("connectors", [])
    return all(
        supported(factory.get_connector_class(KVTransferConfig(**child)))
        for child in children
    )


def _extra_config_of(kv_transfer: Any, name: str) -> Any:
    """The extra config of the connector (or MultiConnector entry) `name`."""
    if kv_transfer.kv_connector == name:
        return kv_transfer.kv_connector_extra_config
    for entry in kv_transfer.kv_connector_extra_config.get("connectors") or []:
        if entry.get("kv_connector") == name:
            return entry.get("kv_connector_extra_config") or {}
    return {}


def lmcache_facts(extra_config: dict[str, Any]) -> DependencyFacts:
    """Whether LMCacheConnectorV1's adapter class imports as the connector
    imports it (vLLM's in-tree one with `use_native`)."""
    module = NATIVE_LMCACHE_ADAPTER if extra_config.get("use_native") else None
    try:
        adapter = importlib.import_module(module or LMCACHE_ADAPTER)
        _ = adapter.LMCacheConnectorV1Impl
    except Exception as exc:  # a missing package, missing native ops
        return DependencyFacts("lmcache", False, error=_describe(exc))
    return DependencyFacts("lmcache", True)


def nixl_facts() -> DependencyFacts:
    """Whether NIXL's agent imports as `vllm.distributed.nixl_utils` imports
    it (`nixl._api.nixl_agent`; `nixl_rocm` on ROCm)."""
    from vllm.platforms import current_platform

    package = "nixl_rocm" if current_platform.is_rocm() else "nixl"
    try:
        agent = importlib.import_module(f"{package}._api").nixl_agent
    except Exception as exc:  # ImportError, or an API without the agent
        return DependencyFacts(package, False, error=_describe(exc))
    return DependencyFacts(package, agent is not None)


def declined_reads_values() -> tuple[str, ...] | None:
    """The `declined_reads` values the evaluated NixlConnector accepts, as
    its scheduler checks them when it is built (`DECLINED_READS`); () where
    the sources have no such option and ignore the key; None when the module
    does not import (`nixl_facts` says why)."""
    for name in NIXL_DECLINED_READS_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # The module or a package above it is not in these sources.
            if exc.name and f"{name}.".startswith(f"{exc.name}."):
                continue
            return None
        except Exception:  # a NIXL that does not import, reported by nixl_facts
            return None
        return tuple(getattr(module, "DECLINED_READS", ()))
    return ()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
