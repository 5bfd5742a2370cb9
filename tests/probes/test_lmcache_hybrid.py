"""Probe: hybrid models start with LMCacheConnectorV1, which loads and saves
nothing for them; every other model keeps upstream's behaviour.

Upstream `LMCacheConnectorV1` does not implement `SupportsHMA`, so vLLM turns
the hybrid KV cache manager (HMA) off whenever it is configured, and a model
mixing recurrent-state (Mamba, GatedDeltaNet) and attention layers then fails
at start-up ("Failed to promote local KV cache specs to one unified type"),
alone or as a MultiConnector child. LMCache's in-process adapter cannot serve
such a model (it takes every layer as paged attention KV and restores no
recurrent state; attention KV without that state garbles the output), so the
patched connector keeps HMA on for hybrid models only, and there never builds
the adapter: zero hits, nothing saved, one warning naming LMCacheMPConnector.
Every other model, sliding-window and pure Mamba ones included, keeps HMA off
and the adapter exactly as upstream: the patch asks whether the model is
hybrid, not whether its KV cache holds Mamba state.

The configs are vLLM's own, for tiny local model configs of the real
architectures (Qwen3.5, or Qwen3-Next where the release has no text-only
Qwen3.5; Gemma 3; Llama; Mamba and Mamba2). The LMCache adapter is
`lmcache_fake_adapter`, which records what the connector builds and hands it;
`test_lmcache_real_adapter.py` drives the real lmcache package.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    MakeRequest,
    MakeVllmConfig,
)
from hybrid_scheduler import (
    BLOCK_SIZE,
    NUM_GPU_BLOCKS,
    start_scheduler,
    text_hybrid_config,
)
from lmcache_fake_adapter import install_fake_adapter
from vllm.config import KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import (
    LMCacheConnectorV1,
)
from vllm.model_executor.models import ModelRegistry
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
)
from vllm.v1.request import RequestStatus

from ci.fixtures.tiny_configs import qwen3_5_text

try:  # 0.33.0 moved KV cache planning out of kv_cache_utils.
    from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
except ImportError:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups

RECURRENT_LAYER = "model.layers.0.linear_attn"
ATTENTION_LAYER = "model.layers.3.self_attn.attn"

# Two layer kinds with one 128-byte page, as the engine core plans them for a
# Qwen3.5-like model (recurrent layers first).
ATTENTION = FullAttentionSpec(
    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
)
RECURRENT = MambaSpec(
    block_size=BLOCK_SIZE,
    shapes=((32,),),
    dtypes=(torch.float32,),
    mamba_cache_mode="align",
)
HYBRID_LAYERS: dict[str, KVCacheSpec] = {
    RECURRENT_LAYER: RECURRENT,
    ATTENTION_LAYER: ATTENTION,
}

_COMMON_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "num_hidden_layers": 4,
    "vocab_size": 256,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
# Qwen3.5's layout: three GatedDeltaNet (linear attention) layers per
# full-attention layer.
QWEN3_5_CONFIG = qwen3_5_text(_COMMON_CONFIG, key_heads=1, value_heads=1, head_dim=32)
HYBRID_CONFIG = text_hybrid_config(QWEN3_5_CONFIG)
# Gemma 3's layout: sliding-window layers with a global one.
GEMMA3_CONFIG = {
    **_COMMON_CONFIG,
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "sliding_window": 2 * BLOCK_SIZE,
    "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
}

# Pure recurrent models: every layer a Mamba (Mamba2) mixer, no attention.
# vLLM declares them attention-free, not hybrid.
_PURE_RECURRENT_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "state_size": 16,
    "expand": 2,
    "conv_kernel": 4,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
PURE_RECURRENT_CONFIGS: dict[str, dict[str, Any]] = {
    "mamba": {
        **_PURE_RECURRENT_CONFIG,
        "architectures": ["MambaForCausalLM"],
        "model_type": "mamba",
    },
    "mamba2": {
        **_PURE_RECURRENT_CONFIG,
        "architectures": ["Mamba2ForCausalLM"],
        "model_type": "mamba2",
        "num_heads": 8,
        "head_dim": 16,
        "n_groups": 1,
    },
}
MAMBA_TYPES = {
    "mamba": MambaAttentionBackendEnum.MAMBA1,
    "mamba2": MambaAttentionBackendEnum.MAMBA2,
}

LMCACHE = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}

# The hybrid model has linear-attention layers, whose config depends on the
# host CPU's AMX support (see conftest.HOST_AMX): every probe here runs once
# per answer.
pytestmark = pytest.mark.usefixtures("host_amx")


def write_model(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def hybrid_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("models") / "hybrid", HYBRID_CONFIG)


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("models") / "gemma3", GEMMA3_CONFIG)


def hybrid_lmcache_config(
    make_vllm_config: MakeVllmConfig,
    model_dir: Path,
    kv_transfer_config: KVTransferConfig | None = None,
) -> VllmConfig:
    """`vllm serve <model> --kv-transfer-config <LMCacheConnectorV1>`, with
    prefix caching in the recurrent-state mode hybrid models use where the
    host allows it (see `make_vllm_config`)."""
    vllm_config = make_vllm_config(
        kv_transfer_config or KVTransferConfig(**LMCACHE),
        mamba_cache_mode="align",
        model_dir=model_dir,
    )
    # The engine core resolves the layout before it plans the KV cache.
    vllm_config.cache_config.kv_cache_layout = "LBNHC"
    return vllm_config


def hybrid_kv_cache_config() -> KVCacheConfig:
    """The groups the engine core plans for `HYBRID_LAYERS` under HMA."""
    return KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec([RECURRENT_LAYER], RECURRENT),
            KVCacheGroupSpec([ATTENTION_LAYER], ATTENTION),
        ],
    )


def lmcache_mp_warnings(records: list[logging.LogRecord]) -> list[str]:
    return [
        record.getMessage()
        for record in records
        if record.levelno == logging.WARNING
        and "LMCacheMPConnector" in record.getMessage()
    ]


def test_hybrid_model_starts_with_lmcache(
    make_vllm_config: MakeVllmConfig, hybrid_model_dir: Path
) -> None:
    """A hybrid model with LMCacheConnectorV1 keeps the hybrid KV cache
    manager and gets one group per layer kind, where upstream turns the
    manager off and then fails to unify the layers."""
    vllm_config = hybrid_lmcache_config(make_vllm_config, hybrid_model_dir)
    assert vllm_config.model_config.is_hybrid
    assert vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is False, (
        "LMCacheConnectorV1 turned the hybrid KV cache manager off"
    )
    groups = get_kv_cache_groups(vllm_config, dict(HYBRID_LAYERS))
    assert [group.layer_names for group in groups] == [
        [RECURRENT_LAYER],
        [ATTENTION_LAYER],
    ]


def test_hybrid_model_starts_with_lmcache_as_multi_connector_child(
    make_vllm_config: MakeVllmConfig, hybrid_model_dir: Path
) -> None:
    """MultiConnector[HMA-capable child, LMCacheConnectorV1], e.g. P/D next
    to a CPU tier, keeps the manager for a hybrid model too."""
    config = KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "connectors": [
                {
                    "kv_connector": "RecordingHMAChild",
                    "kv_role": "kv_both",
                    "kv_connector_module_path": "scheduler_side_connector",
                },
                LMCACHE,
            ]
        },
    )
    vllm_config = hybrid_lmcache_config(make_vllm_config, hybrid_model_dir, config)
    assert vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is False, (
        "a MultiConnector with an LMCacheConnectorV1 child turned the hybrid KV "
        "cache manager off"
    )


def test_hybrid_model_never_builds_the_lmcache_adapter(
    make_vllm_config: MakeVllmConfig,
    hybrid_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    vllm_log_records: list[logging.LogRecord],
) -> None:
    """Both roles of the connector, on the groups of a hybrid model: the
    adapter is never built (so nothing is looked up, loaded or saved), and
    the scheduler's connector says once what to use instead, with the
    settings for this block size."""
    adapter_cls = install_fake_adapter(monkeypatch, matched_tokens=4 * BLOCK_SIZE)
    vllm_config = hybrid_lmcache_config(make_vllm_config, hybrid_model_dir)
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        LMCacheConnectorV1(vllm_config, role, hybrid_kv_cache_config())

    assert adapter_cls.instances == []
    block_size = vllm_config.cache_config.block_size
    assert lmcache_mp_warnings(vllm_log_records) == [
        "LMCacheConnectorV1 loads and saves nothing for this hybrid model: "
        "LMCache's in-process adapter restores attention KV but not the recurrent "
        "(Mamba/linear-attention) state, and attention KV without it garbles the "
        "output. For LMCache with a hybrid model use LMCacheMPConnector and an "
        "LMCache server, with --mamba-cache-mode align, the server's --chunk-size "
        f"a multiple of the block size ({block_size}), and --max-num-batched-tokens "
        f"of at least {block_size} (below {2 * block_size} unless the server runs "
        "with --separate-object-groups)."
    ]


def test_hybrid_model_serves_requests_with_zero_lmcache_hits(
    make_vllm_config: MakeVllmConfig,
    make_request: MakeRequest,
    hybrid_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real scheduler over a hybrid model's groups schedules a request
    that LMCache's adapter would report a 4-block hit for from the start (no
    external tokens), and finishes it through the HMA path (upstream asserts
    a single group there)."""
    install_fake_adapter(monkeypatch, matched_tokens=4 * BLOCK_SIZE)
    vllm_config = hybrid_lmcache_config(make_vllm_config, hybrid_model_dir)
    scheduler = start_scheduler(vllm_config, hybrid_kv_cache_config())
    request = make_request("hybrid", 6 * BLOCK_SIZE)
    scheduler.add_request(request)

    output = scheduler.schedule()
    assert output.scheduled_new_reqs[0].num_computed_tokens == 0
    scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)


def test_sliding_window_model_keeps_upstream_lmcache(
    make_vllm_config: MakeVllmConfig, gemma3_dir: Path
) -> None:
    """Scope: a sliding-window model is not hybrid; vLLM turns the manager
    off for LMCacheConnectorV1 as upstream does, so all its attention layers
    share the one group LMCache stores and it keeps its hits."""
    vllm_config = make_vllm_config(KVTransferConfig(**LMCACHE), model_dir=gemma3_dir)
    assert not vllm_config.model_config.is_hybrid
    assert vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is True


def test_single_group_model_drives_the_adapter_as_upstream(
    make_vllm_config: MakeVllmConfig,
    make_request: MakeRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scope: a plain decoder keeps the manager off, the adapter is built
    and asked, its hit loads, and a finished request hands it the one
    group's blocks, as upstream."""
    adapter_cls = install_fake_adapter(monkeypatch, matched_tokens=4 * BLOCK_SIZE)
    vllm_config = make_vllm_config(KVTransferConfig(**LMCACHE))
    assert vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is True
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([ATTENTION_LAYER], ATTENTION)],
    )
    scheduler = start_scheduler(vllm_config, kv_cache_config)
    (adapter,) = adapter_cls.instances
    request = make_request("plain", 6 * BLOCK_SIZE)
    scheduler.add_request(request)

    output = scheduler.schedule()
    (block_ids,) = scheduler.kv_cache_manager.get_block_ids(request.request_id)
    scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)

    assert adapter.lookups == [request.request_id]
    assert output.scheduled_new_reqs[0].num_computed_tokens == 4 * BLOCK_SIZE
    assert adapter.finished == [(request.request_id, list(block_ids))]


def pure_recurrent_layers(
    vllm_config: VllmConfig, mamba_type: MambaAttentionBackendEnum
) -> dict[str, KVCacheSpec]:
    """Each layer's KV cache spec, as a pure Mamba (Mamba2) model's mixers
    report it (`MambaBase.get_kv_cache_spec`), from the state shapes and
    dtypes its model class computes from the config."""
    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    model_cls, _ = ModelRegistry.resolve_model_cls(
        model_config.architectures, model_config=model_config
    )
    spec = MambaSpec(
        shapes=tuple(model_cls.get_mamba_state_shape_from_config(vllm_config)),
        dtypes=tuple(model_cls.get_mamba_state_dtype_from_config(vllm_config)),
        block_size=cache_config.mamba_block_size,
        page_size_padded=cache_config.mamba_page_size_padded,
        mamba_type=mamba_type,
        mamba_cache_mode=cache_config.mamba_cache_mode,
    )
    num_layers = model_config.hf_text_config.num_hidden_layers
    return {f"backbone.layers.{index}.mixer": spec for index in range(num_layers)}


@pytest.mark.parametrize("model", sorted(PURE_RECURRENT_CONFIGS))
def test_pure_recurrent_model_keeps_upstream_lmcache(
    model: str,
    make_vllm_config: MakeVllmConfig,
    make_request: MakeRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    vllm_log_records: list[logging.LogRecord],
) -> None:
    """Scope: a pure Mamba or Mamba2 model (every layer recurrent, no
    attention) is not hybrid, so vLLM turns the manager off for
    LMCacheConnectorV1 as upstream does, and all its layers form one Mamba
    group. Mamba layers in the KV cache do not make the connector inert, only
    a hybrid model does: both roles build LMCache's adapter, the scheduler's
    asks it for hits, and nothing warns, as upstream.

    The fake adapter stands for lmcache's `LMCacheConnectorV1Impl`, which
    upstream builds in both roles for every model the connector serves and
    asks for every lookup; what lmcache then does with Mamba state is
    upstream's behaviour, which the patch leaves as it is."""
    adapter_cls = install_fake_adapter(monkeypatch, matched_tokens=4 * BLOCK_SIZE)
    model_dir = write_model(tmp_path / model, PURE_RECURRENT_CONFIGS[model])
    vllm_config = make_vllm_config(KVTransferConfig(**LMCACHE), model_dir=model_dir)
    assert not vllm_config.model_config.is_hybrid
    assert vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is True
    groups = get_kv_cache_groups(
        vllm_config, pure_recurrent_layers(vllm_config, MAMBA_TYPES[model])
    )
    assert [type(group.kv_cache_spec) for group in groups] == [MambaSpec]
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups
    )

    scheduler_side = LMCacheConnectorV1(
        vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config
    )
    LMCacheConnectorV1(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
    request = make_request(model, 6 * BLOCK_SIZE)
    hit = scheduler_side.get_num_new_matched_tokens(request, 0)

    assert len(adapter_cls.instances) == 2, (
        "LMCacheConnectorV1 did not build LMCache's adapter in both roles"
    )
    assert hit == (4 * BLOCK_SIZE, False)
    assert lmcache_mp_warnings(vllm_log_records) == []
