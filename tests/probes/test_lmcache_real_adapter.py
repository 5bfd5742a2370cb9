"""LMCacheConnectorV1 against the real lmcache 0.5.6, as far as a CPU drives it.

`test_lmcache_hybrid.py` drives the connector with a stand-in adapter; these
tests run lmcache's own vLLM integration, on the layer count and layer kinds of
real models. What lmcache 0.5.6 does with the layers it is handed (paths under
`lmcache/`):

- its service factory sizes everything by `model_config.get_num_layers()`
  (integration/vllm/vllm_service_factory.py:97-109), and the GPU connector it
  creates for a vLLM worker, `VLLMPagedMemGPUConnectorV2` unless layerwise or
  V3 is configured (v1/gpu_connector/__init__.py:182-199), keeps one pointer
  slot per layer (v1/gpu_connector/gpu_connectors.py:174, :229);
- its adapter keeps the dict `register_kv_caches` gets
  (integration/vllm/vllm_v1_adapter.py:747-753), and every save hands all of
  it (:1137-1138, :1227-1236) through `LMCacheEngine.store`
  (v1/cache_engine.py:569) to `from_gpu`, whose pointer setup copies one
  address per registered tensor into those slots (gpu_connectors.py:362, :372,
  :257). A tensor count other than the layer count raises there, uncaught, on
  the first save.

Without CUDA, lmcache has no GPU connector ("No supported cpu connector
found", v1/gpu_connector/__init__.py:247), and its adapter runs degraded: no
engine, and saves return at once (v1/manager.py:104-111,
vllm_v1_adapter.py:1108-1109). The tests then create the GPU connector with
lmcache's own `CreateGPUConnector`, from the adapter's own metadata, as the
service factory does on a CUDA worker (vllm_service_factory.py:203-208), and
run its pointer setup on the tensors the adapter was handed. For that CUDA is
stood in for (`cuda_standin`): lmcache's device type reads "cuda", the tensors
vLLM's allocator placed in CPU memory report a CUDA device, what lmcache
allocates on CUDA lands in CPU memory, and CUDA streams are inert. Each test
says what else, if anything, is not the real thing.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import (
    MAX_MODEL_LEN,
    MakeRequest,
    MakeVllmConfig,
)
from hybrid_scheduler import BLOCK_SIZE, start_scheduler, text_hybrid_config
from torch.overrides import TorchFunctionMode
from vllm.config import (
    KVTransferConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.distributed import (
    destroy_distributed_environment,
    destroy_model_parallel,
    ensure_model_parallel_initialized,
    init_distributed_environment,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.model_executor.models import ModelRegistry
from vllm.platforms import current_platform
from vllm.v1.attention.backends.registry import (
    AttentionBackendEnum,
    MambaAttentionBackendEnum,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import RequestStatus

from ci.fixtures.tiny_configs import qwen3_5_text

try:
    from vllm.v1.worker.utils import allocate_kv_cache
except ImportError:  # 0.22.1: allocation is GPUModelRunner's own (see `allocate`)
    allocate_kv_cache = None
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

try:  # 0.33.0 moved KV cache planning out of kv_cache_utils.
    from vllm.v1.core.kv_cache_planning import (
        get_global_kv_cache_groups,
        get_kv_cache_configs,
    )
except ImportError:
    get_global_kv_cache_groups = None
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

ADAPTER_MODULE = "lmcache.integration.vllm.vllm_v1_adapter"
needs_lmcache = pytest.mark.skipif(
    importlib.util.find_spec("lmcache") is None,
    reason="lmcache is not installed (the release environments get it from "
    "ci/envs/lmcache-requirements.txt)",
)

# Enough KV cache for a few full-length requests of either model.
KV_CACHE_BYTES = 8 << 20
# Widths small enough for a CPU; no weights are needed.
TINY_WIDTHS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "vocab_size": 256,
    "max_position_embeddings": MAX_MODEL_LEN,
    "torch_dtype": "float32",
}
# Qwen/Qwen3.5-0.8B's layers: 24, three Gated DeltaNet (linear attention)
# layers to one full-attention layer.
QWEN3_5 = qwen3_5_text({**TINY_WIDTHS, "eos_token_id": 2}, groups=6, head_dim=16)
HYBRID = text_hybrid_config(QWEN3_5)
# google/gemma-3-1b-it's layers: 26, five sliding-window (512 tokens) layers
# to one global layer.
GEMMA3 = {
    **TINY_WIDTHS,
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "num_hidden_layers": 26,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "layer_types": [
        "full_attention" if i % 6 == 5 else "sliding_attention" for i in range(26)
    ],
    "query_pre_attn_scalar": 32,
    "rope_theta": 1_000_000,
    "rope_local_base_freq": 10_000,
    "eos_token_id": 1,
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Local model directories, so `ModelConfig` never asks a model hub."""
    dirs = {}
    for name, config in (("qwen3.5", HYBRID), ("gemma3", GEMMA3)):
        model_dir = tmp_path_factory.mktemp(name)
        (model_dir / "config.json").write_text(json.dumps(config))
        dirs[name] = model_dir
    return dirs


def lmcache_vllm_config(
    make_vllm_config: MakeVllmConfig, model_dir: Path
) -> VllmConfig:
    """The `VllmConfig` of `vllm serve MODEL --kv-transfer-config
    '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'`, in which
    vLLM itself decides whether the hybrid KV cache manager stays on."""
    vllm_config = make_vllm_config(
        KVTransferConfig(kv_connector="LMCacheConnectorV1", kv_role="kv_both"),
        model_dir=model_dir,
    )
    # The engine core resolves the layout before it plans the KV cache; this
    # is the one CUDA's attention backends allocate (lmcache calls it NHD).
    vllm_config.cache_config.kv_cache_layout = "LBNHC"
    return vllm_config


def layer_specs(vllm_config: VllmConfig) -> dict[str, KVCacheSpec]:
    """Each layer's KV cache spec, as the model's layers report them to the
    engine core: attention layers by their window, Gated DeltaNet layers by
    the state the model class declares."""
    model_config = vllm_config.model_config
    text_config = model_config.hf_text_config
    attention: dict[str, Any] = {
        "block_size": vllm_config.cache_config.block_size,
        "num_kv_heads": model_config.get_num_kv_heads(vllm_config.parallel_config),
        "head_size": model_config.get_head_size(),
        "dtype": model_config.dtype,
    }
    specs: dict[str, KVCacheSpec] = {}
    for index, kind in enumerate(text_config.layer_types):
        if kind == "linear_attention":
            specs[f"model.layers.{index}.linear_attn"] = gated_delta_net_spec(
                vllm_config
            )
        elif kind == "sliding_attention":
            specs[f"model.layers.{index}.self_attn.attn"] = SlidingWindowSpec(
                sliding_window=text_config.sliding_window, **attention
            )
        else:
            specs[f"model.layers.{index}.self_attn.attn"] = FullAttentionSpec(
                **attention
            )
    return specs


def gated_delta_net_spec(vllm_config: VllmConfig) -> MambaSpec:
    """A Gated DeltaNet layer's spec (`MambaBase.get_kv_cache_spec`), from the
    state shapes and dtypes its model class computes from the config."""
    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    model_cls, _ = ModelRegistry.resolve_model_cls(
        model_config.architectures, model_config=model_config
    )
    return MambaSpec(
        shapes=tuple(model_cls.get_mamba_state_shape_from_config(vllm_config)),
        dtypes=tuple(model_cls.get_mamba_state_dtype_from_config(vllm_config)),
        block_size=cache_config.mamba_block_size,
        page_size_padded=cache_config.mamba_page_size_padded,
        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
        mamba_cache_mode=cache_config.mamba_cache_mode,
    )


def plan_kv_cache(vllm_config: VllmConfig) -> KVCacheConfig:
    """Group and size the KV cache as the engine core does at start-up, and
    record the block count in the config, as it does before it creates the
    scheduler."""
    if allocate_kv_cache is None and vllm_config.model_config.is_hybrid:
        # 0.22.1 aligns a hybrid model's attention block and Mamba page sizes
        # in the worker, with the loaded model's attention backend
        # (`Platform.update_block_size_for_backend`,
        # vllm/platforms/interface.py:470-505), before the engine core plans
        # the KV cache; the CPU platform's backend is CPU_ATTN
        # (vllm/platforms/cpu.py:86).
        current_platform._align_hybrid_block_size(
            vllm_config, AttentionBackendEnum.CPU_ATTN.get_class()
        )
    specs = [layer_specs(vllm_config)]
    if get_global_kv_cache_groups is None:
        [config] = get_kv_cache_configs(vllm_config, specs, [KV_CACHE_BYTES])
    else:
        groups = get_global_kv_cache_groups(vllm_config, specs)
        [config] = get_kv_cache_configs(vllm_config, specs, [KV_CACHE_BYTES], groups)
    vllm_config.cache_config.num_gpu_blocks = config.num_blocks
    return config


def allocate(
    vllm_config: VllmConfig, kv_cache_config: KVCacheConfig
) -> dict[str, torch.Tensor]:
    """The tensors a worker registers with its connector, from vLLM's own
    allocator (as `GPUModelRunner.initialize_kv_cache_tensors`), in CPU
    memory. 0.22.1 has no allocator outside the runner, whose reshaping needs
    the attention backends of a loaded model: there these are the runner's
    own raw per-layer buffers, its first step
    (`GPUModelRunner._allocate_kv_cache_tensors`), which is enough for a
    connector that must not hand them to lmcache at all."""
    if allocate_kv_cache is None:
        runner = SimpleNamespace(device=torch.device("cpu"), runner_only_attn_layers=())
        return GPUModelRunner._allocate_kv_cache_tensors(runner, kv_cache_config)
    return allocate_kv_cache(
        kv_cache_config,
        torch.device("cpu"),
        vllm_config.cache_config.get_resolved_kv_cache_layout(),
    )


@contextmanager
def worker_process(vllm_config: VllmConfig, tmp_path: Path) -> Iterator[None]:
    """A one-rank distributed environment, as a vLLM worker has when it
    creates its KV connector: lmcache's worker side asks for the
    tensor-parallel group before it picks a GPU connector."""
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"file://{tmp_path / 'dist-init'}",
            local_rank=0,
            backend="gloo",
        )
        try:
            ensure_model_parallel_initialized(1, 1)
            yield
        finally:
            destroy_model_parallel()
            destroy_distributed_environment()


class _CudaLabelled(torch.Tensor):
    """A tensor in CPU memory that reports a CUDA device: lmcache's pointer
    setup refuses any other (gpu_connectors.py:248)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


class _CudaAllocationsOnCpu(TorchFunctionMode):
    """Serves the tensors lmcache creates on CUDA from CPU memory."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


@contextmanager
def cuda_standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """CUDA for lmcache's GPU connector, on a CPU (see the module docstring)."""
    import lmcache.v1.gpu_connector

    monkeypatch.setattr(lmcache.v1.gpu_connector, "torch_device_type", "cuda")
    monkeypatch.setattr(torch.cuda, "Stream", lambda *args, **kwargs: None)
    with _CudaAllocationsOnCpu():
        yield


def lmcache_gpu_connector(
    lmcache_config: Any, metadata: Any, vllm_config: VllmConfig
) -> Any:
    """The GPU connector lmcache's service factory creates for a vLLM worker
    (vllm_service_factory.py:203-208); needs `cuda_standin` on a CPU."""
    from lmcache.integration.vllm.utils import vllm_layout_hints
    from lmcache.utils import EngineType
    from lmcache.v1.gpu_connector import CreateGPUConnector

    return CreateGPUConnector(
        lmcache_config,
        metadata,
        EngineType.VLLM,
        layout_hints=vllm_layout_hints(vllm_config),
    )


def set_up_pointers(gpu_connector: Any, kv_caches: list[torch.Tensor]) -> None:
    """What the first save does in `from_gpu` before it copies anything
    (gpu_connectors.py:362, :372), with the adapter's tensors."""
    gpu_connector.initialize_kvcaches_ptr(
        kvcaches=[tensor.as_subclass(_CudaLabelled) for tensor in kv_caches]
    )
    gpu_connector._initialize_pointers(gpu_connector.kvcaches)


@needs_lmcache
def test_sliding_window_model_hands_lmcache_every_layer(
    make_vllm_config: MakeVllmConfig,
    model_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Gemma 3 1B is not hybrid, so vLLM turns the hybrid KV cache manager off
    as for any connector without HMA support: one KV cache group with all 26
    layers. lmcache's adapter gets every layer, and the pointer setup of its
    GPU connector, sized by the model's layer count, takes them.

    Real: vLLM's HMA decision, KV cache planning and allocation; the
    connector from vLLM's factory in both roles, over lmcache's adapter
    (constructed, degraded on a CPU, for the worker; constructed for the
    scheduler, whose lookups would go to the lookup server a degraded worker
    does not start); `register_kv_caches` and `wait_for_save`; lmcache's
    metadata, its choice of GPU connector and that connector's pointer setup.
    Stand-in: CUDA (`cuda_standin`)."""
    from lmcache.integration.vllm.vllm_v1_adapter import (
        LMCacheConnectorMetadata,
        LMCacheConnectorV1Impl,
    )
    from lmcache.v1.gpu_connector.gpu_connectors import VLLMPagedMemGPUConnectorV2

    vllm_config = lmcache_vllm_config(make_vllm_config, model_dirs["gemma3"])
    assert not vllm_config.model_config.is_hybrid
    assert vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is True, (
        "LMCacheConnectorV1 kept the hybrid KV cache manager on for a model "
        "that is not hybrid"
    )
    kv_cache_config = plan_kv_cache(vllm_config)
    assert [len(group.layer_names) for group in kv_cache_config.kv_cache_groups] == [26]
    kv_caches = allocate(vllm_config, kv_cache_config)

    with worker_process(vllm_config, tmp_path):
        worker = KVConnectorFactory.create_connector(
            vllm_config, KVConnectorRole.WORKER, kv_cache_config
        )
        adapter = worker._lmcache_engine
        assert isinstance(adapter, LMCacheConnectorV1Impl)
        worker.register_kv_caches(kv_caches)
        worker.bind_connector_metadata(LMCacheConnectorMetadata())
        worker.wait_for_save()
        worker.clear_connector_metadata()
        adapter.shutdown()

    scheduler = KVConnectorFactory.create_connector(
        vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config
    )
    scheduler_adapter = scheduler._lmcache_engine
    assert isinstance(scheduler_adapter, LMCacheConnectorV1Impl)
    assert scheduler_adapter.lookup_client is not None
    scheduler_adapter.shutdown()

    assert list(adapter.kv_caches) == list(kv_caches), (
        "lmcache's adapter was not handed every layer, in vLLM's order"
    )
    metadata = adapter.lmcache_engine_metadata
    assert metadata.kv_shape[0] == 26
    assert adapter.lmcache_engine is None, "lmcache found a GPU connector on a CPU"
    assert "No supported cpu connector found" in adapter._manager._init_failed_reason

    with cuda_standin(monkeypatch):
        gpu_connector = lmcache_gpu_connector(adapter.config, metadata, vllm_config)
        assert type(gpu_connector) is VLLMPagedMemGPUConnectorV2
        set_up_pointers(gpu_connector, list(adapter.kv_caches.values()))

    assert gpu_connector.kv_cache_pointers.tolist() == [
        tensor.data_ptr() for tensor in kv_caches.values()
    ]
    assert gpu_connector.num_blocks == kv_cache_config.num_blocks
    assert gpu_connector.block_size == BLOCK_SIZE


@needs_lmcache
@pytest.mark.usefixtures("host_amx")
def test_lmcache_0_5_6_cannot_take_a_subset_of_layers(
    make_vllm_config: MakeVllmConfig,
    model_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Characterizes lmcache 0.5.6, and fails when lmcache changes this: its
    GPU connector must be handed every layer of the model.

    A hybrid model under the hybrid KV cache manager has a full-attention
    group of 6 of Qwen3.5's 24 layers; the previous LMCache patch handed the
    adapter that group's layers only. lmcache sized its pointer table by all
    24 layers, so the first save raised out of `wait_for_save`.

    Real: vLLM's KV cache planning (with the hybrid KV cache manager on,
    whatever this build's connector makes vLLM decide) and allocation;
    lmcache's metadata from its service factory in the worker role, its
    choice of GPU connector and that connector's pointer setup. Stand-ins:
    CUDA (`cuda_standin`), and the old patch's choice of layers, made here
    as it made it (the first full-attention group's)."""
    from lmcache.integration.vllm.utils import lmcache_get_or_create_config
    from lmcache.integration.vllm.vllm_service_factory import VllmServiceFactory

    vllm_config = lmcache_vllm_config(make_vllm_config, model_dirs["qwen3.5"])
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = False
    kv_cache_config = plan_kv_cache(vllm_config)
    [attention] = [
        group
        for group in kv_cache_config.kv_cache_groups
        if isinstance(group.kv_cache_spec, FullAttentionSpec)
    ]
    kv_caches = allocate(vllm_config, kv_cache_config)
    handed = [kv_caches[name] for name in attention.layer_names]
    assert len(handed) == 6
    lmcache_config = lmcache_get_or_create_config()
    metadata = VllmServiceFactory(
        lmcache_config, vllm_config, "worker"
    ).get_or_create_metadata()
    assert metadata.kv_shape[0] == 24

    with cuda_standin(monkeypatch):
        gpu_connector = lmcache_gpu_connector(lmcache_config, metadata, vllm_config)
        with pytest.raises(
            ValueError,
            match=r"could not broadcast input array from shape \(6,\) into shape "
            r"\(24,\)",
        ):
            set_up_pointers(gpu_connector, handed)


class _ImportRecorder(MetaPathFinder):
    """Notes every lmcache module that an import looks for, and finds none
    itself (the normal finders after it do)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname.partition(".")[0] == "lmcache":
            self.names.append(fullname)
        return None


@pytest.fixture
def lmcache_imports() -> Iterator[list[str]]:
    """The lmcache modules imported during the test. lmcache's adapter module
    is taken out of `sys.modules` meanwhile, so that importing it again is
    seen even when an earlier test already had."""
    saved = sys.modules.pop(ADAPTER_MODULE, None)
    recorder = _ImportRecorder()
    sys.meta_path.insert(0, recorder)
    try:
        yield recorder.names
    finally:
        sys.meta_path.remove(recorder)
        sys.modules.pop(ADAPTER_MODULE, None)
        if saved is not None:
            sys.modules[ADAPTER_MODULE] = saved


def lmcache_mp_mentions(records: list[logging.LogRecord]) -> list[str]:
    return [
        record.getMessage()
        for record in records
        if "LMCacheMPConnector" in record.getMessage()
    ]


@pytest.mark.usefixtures("host_amx")
def test_hybrid_model_never_reaches_lmcache(
    make_vllm_config: MakeVllmConfig,
    model_dirs: dict[str, Path],
    make_request: MakeRequest,
    vllm_log_records: list[logging.LogRecord],
    lmcache_imports: list[str],
    tmp_path: Path,
) -> None:
    """The redesigned patch, on Qwen3.5 0.8B's 24 layers: the hybrid KV cache
    manager stays on, and LMCacheConnectorV1 never imports lmcache's adapter
    (a no-op takes its place, so lmcache neither sees 6 of 24 layers nor
    saves anything): no external hits, every finished request's blocks freed
    at once, and one line at start-up pointing to LMCacheMPConnector.

    Real: vLLM's config, KV cache planning and allocation, the scheduler
    with the connector it creates, the worker's connector from vLLM's
    factory with `register_kv_caches` and the save path; lmcache as
    installed, or absent, for the adapter must not be imported either way.
    Stand-in: none."""
    vllm_config = lmcache_vllm_config(make_vllm_config, model_dirs["qwen3.5"])
    assert vllm_config.model_config.is_hybrid
    assert vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is False, (
        "LMCacheConnectorV1 turned the hybrid KV cache manager off for a hybrid "
        "model, which then cannot start"
    )
    kv_cache_config = plan_kv_cache(vllm_config)
    assert any(
        isinstance(group.kv_cache_spec, MambaSpec)
        for group in kv_cache_config.kv_cache_groups
    )

    scheduler = start_scheduler(vllm_config, kv_cache_config, planned=True)
    assert ADAPTER_MODULE not in lmcache_imports, (
        "the scheduler's LMCacheConnectorV1 imported lmcache's adapter"
    )
    assert len(lmcache_mp_mentions(vllm_log_records)) == 1, (
        "start-up did not say once to use LMCacheMPConnector"
    )
    request = make_request("hybrid", 4 * BLOCK_SIZE)
    assert scheduler.connector is not None
    assert scheduler.connector.get_num_new_matched_tokens(request, 0) == (0, False)
    scheduler.add_request(request)
    output = scheduler.schedule()
    assert [r.num_computed_tokens for r in output.scheduled_new_reqs] == [0]

    with worker_process(vllm_config, tmp_path):
        worker = KVConnectorFactory.create_connector(
            vllm_config, KVConnectorRole.WORKER, kv_cache_config
        )
        logged = len(vllm_log_records)
        worker.register_kv_caches(allocate(vllm_config, kv_cache_config))
        worker.bind_connector_metadata(output.kv_connector_metadata)
        worker.wait_for_save()
        worker.clear_connector_metadata()
        assert lmcache_mp_mentions(vllm_log_records[logged:]) == []

    scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)
    assert request.request_id not in scheduler.requests, (
        "the connector held the finished request's blocks for a save"
    )
    assert ADAPTER_MODULE not in lmcache_imports, (
        "the worker's LMCacheConnectorV1 imported lmcache's adapter"
    )
