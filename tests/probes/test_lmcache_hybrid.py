"""Probe: LMCacheConnectorV1 runs hybrid models under the hybrid KV cache manager.

Upstream `LMCacheConnectorV1` does not implement `SupportsHMA`, so vLLM turns
the hybrid memory allocator (HMA) off whenever it is configured, and a model
mixing recurrent-state (Mamba) and attention layers then fails at start-up
("Failed to promote local KV cache specs to one unified type"). With the patch
HMA stays on and LMCache serves one attention KV cache group: the adapter sees
only that group's layers and blocks, and may choose the group itself. Cached KV
is loaded only if nothing else needs restoring: a model with recurrent-state
groups gets external hits only from an adapter that declares
`restores_recurrent_state`, since attention KV next to stale recurrent state
silently garbles the output, and a model with another attention group (e.g.
sliding window, which HMA no longer merges into full attention) gets none.

The connector is the real one; its LMCache adapter is `lmcache_fake_adapter`.
"""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import (
    BLOCK_SIZE,
    NUM_GPU_BLOCKS,
    MakeRequest,
    MakeVllmConfig,
    start_scheduler,
)
from lmcache_fake_adapter import (
    FakeLMCacheAdapter,
    FakeLMCacheMetadata,
    install_fake_adapter,
)
from vllm.config import KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import (
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import (
    LMCacheConnectorV1,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import RequestStatus

try:  # 0.33.0 moved KV cache planning out of kv_cache_utils.
    from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
except ImportError:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups

RECURRENT_LAYER = "model.layers.0.linear_attn"
ATTENTION_LAYER = "model.layers.1.self_attn.attn"
SLIDING_LAYER = "model.layers.0.self_attn.attn"

# Three layer kinds with one 128-byte page, so the HMA can put each in its own
# group: full attention, a recurrent (GatedDeltaNet/Mamba) state, and sliding
# window attention.
ATTENTION = FullAttentionSpec(
    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
)
RECURRENT = MambaSpec(
    block_size=BLOCK_SIZE,
    shapes=((32,),),
    dtypes=(torch.float32,),
    mamba_cache_mode="align",
)
SLIDING = SlidingWindowSpec(
    block_size=BLOCK_SIZE,
    num_kv_heads=1,
    head_size=1,
    dtype=torch.float32,
    sliding_window=2 * BLOCK_SIZE,
)
# A Qwen3.5-like layer order: the recurrent layer first, so that group 0 is
# not the attention group LMCache serves.
HYBRID_LAYERS: dict[str, KVCacheSpec] = {
    RECURRENT_LAYER: RECURRENT,
    ATTENTION_LAYER: ATTENTION,
}
SLIDING_WINDOW_LAYERS: dict[str, KVCacheSpec] = {
    SLIDING_LAYER: SLIDING,
    ATTENTION_LAYER: ATTENTION,
}
RECURRENT_GID, ATTENTION_GID = 0, 1


def lmcache_vllm_config(make_vllm_config: MakeVllmConfig) -> VllmConfig:
    """The `VllmConfig` of `vllm serve --kv-transfer-config
    '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'`, with prefix
    caching in the recurrent-state mode that hybrid models use."""
    vllm_config = make_vllm_config(
        KVTransferConfig(kv_connector="LMCacheConnectorV1", kv_role="kv_both"),
        mamba_cache_mode="align",
    )
    # The engine core resolves the layout before it plans the KV cache.
    vllm_config.cache_config.kv_cache_layout = "LBNHC"
    return vllm_config


def plan_kv_cache(
    vllm_config: VllmConfig, layers: dict[str, KVCacheSpec]
) -> KVCacheConfig:
    """Group the layers as the engine core does; upstream's error for a hybrid
    model without HMA is raised here."""
    groups = get_kv_cache_groups(vllm_config, dict(layers))
    return KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups
    )


def start_lmcache_scheduler(
    make_vllm_config: MakeVllmConfig, layers: dict[str, KVCacheSpec]
) -> Scheduler:
    """Start-up as the engine core does it: config, KV cache planning, and the
    real `Scheduler`, which creates the connector and with it the adapter."""
    vllm_config = lmcache_vllm_config(make_vllm_config)
    kv_cache_config = plan_kv_cache(vllm_config, layers)
    return start_scheduler(vllm_config, kv_cache_config)


def hybrid_kv_cache_config() -> KVCacheConfig:
    """The groups the HMA plans for `HYBRID_LAYERS` (see the first probe)."""
    return KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec([RECURRENT_LAYER], RECURRENT),
            KVCacheGroupSpec([ATTENTION_LAYER], ATTENTION),
        ],
    )


def lmcache_adapter(connector: object) -> FakeLMCacheAdapter:
    assert isinstance(connector, LMCacheConnectorV1)
    adapter = connector._lmcache_engine
    assert isinstance(adapter, FakeLMCacheAdapter)
    return adapter


def recurrent_state_warnings(records: list[logging.LogRecord]) -> list[str]:
    return [
        record.getMessage()
        for record in records
        if record.levelno == logging.WARNING
        and "restores_recurrent_state" in record.getMessage()
    ]


def test_hybrid_model_keeps_hma_with_two_kv_cache_groups(
    make_vllm_config: MakeVllmConfig,
) -> None:
    """Start-up planning for a hybrid model keeps the HMA: one KV cache group
    per layer kind, where upstream fails to unify them."""
    vllm_config = lmcache_vllm_config(make_vllm_config)
    assert vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is False, (
        "LMCacheConnectorV1 turned the hybrid KV cache manager off"
    )
    groups = plan_kv_cache(vllm_config, HYBRID_LAYERS).kv_cache_groups
    assert [group.layer_names for group in groups] == [
        [RECURRENT_LAYER],
        [ATTENTION_LAYER],
    ]
    assert isinstance(groups[RECURRENT_GID].kv_cache_spec, MambaSpec)
    assert isinstance(groups[ATTENTION_GID].kv_cache_spec, FullAttentionSpec)


def test_finished_request_hands_lmcache_the_attention_group_blocks(
    make_vllm_config: MakeVllmConfig,
    make_request: MakeRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler finishes a hybrid request through
    `request_finished_all_groups`; the adapter gets the blocks of the first
    full-attention group, not those of group 0 (recurrent state)."""
    install_fake_adapter(monkeypatch)
    scheduler = start_lmcache_scheduler(make_vllm_config, HYBRID_LAYERS)
    adapter = lmcache_adapter(scheduler.connector)
    request = make_request("finished", 3 * BLOCK_SIZE)
    scheduler.add_request(request)
    scheduler.schedule()
    block_ids = scheduler.kv_cache_manager.get_block_ids_for_computed_tokens(
        request_id=request.request_id,
        num_computed_tokens=request.num_computed_tokens,
    )
    assert block_ids[ATTENTION_GID] != block_ids[RECURRENT_GID]

    scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)

    assert adapter.finished == [(request.request_id, block_ids[ATTENTION_GID])]


@pytest.mark.parametrize("chosen", [None, 2], ids=["default", "adapter-choice"])
def test_adapter_may_choose_the_group_lmcache_serves(
    make_request: MakeRequest,
    monkeypatch: pytest.MonkeyPatch,
    make_vllm_config: MakeVllmConfig,
    chosen: int | None,
) -> None:
    """With two full-attention groups, the adapter's `kv_cache_group_id`
    decides whose blocks it is handed; without it, the first one. The adapter
    reads the groups from the connector's `kv_cache_config`."""
    install_fake_adapter(monkeypatch, kv_cache_group_id=chosen)
    kv_cache_config = hybrid_kv_cache_config()
    kv_cache_config.kv_cache_groups.append(
        KVCacheGroupSpec(["model.layers.2.self_attn.attn"], ATTENTION)
    )
    connector = LMCacheConnectorV1(
        lmcache_vllm_config(make_vllm_config),
        KVConnectorRole.SCHEDULER,
        kv_cache_config,
    )
    adapter = lmcache_adapter(connector)
    assert adapter.parent.kv_cache_config is kv_cache_config
    request = make_request("chosen", BLOCK_SIZE)

    result = connector.request_finished_all_groups(request, ([10], [20], [30]))

    assert result == (False, None)
    served = ATTENTION_GID if chosen is None else chosen
    assert adapter.finished == [(request.request_id, [[10], [20], [30]][served])]


@pytest.mark.parametrize(
    "chosen",
    [2, -1, RECURRENT_GID, "1", True],
    ids=["out-of-range", "negative", "recurrent-group", "str", "bool"],
)
def test_invalid_group_choice_fails_at_startup(
    monkeypatch: pytest.MonkeyPatch,
    make_vllm_config: MakeVllmConfig,
    chosen: object,
) -> None:
    """A group LMCache cannot serve is a clear error when the connector is
    built, not an IndexError or a corrupt save when the first request ends."""
    install_fake_adapter(monkeypatch, kv_cache_group_id=chosen)
    with pytest.raises(ValueError, match="kv_cache_group_id"):
        LMCacheConnectorV1(
            lmcache_vllm_config(make_vllm_config),
            KVConnectorRole.SCHEDULER,
            hybrid_kv_cache_config(),
        )


def test_load_restores_only_the_served_group(
    make_request: MakeRequest,
    monkeypatch: pytest.MonkeyPatch,
    make_vllm_config: MakeVllmConfig,
) -> None:
    """The groups a load writes are the served one, not every prefix-cacheable
    group (the base default, which includes the recurrent-state group)."""
    if not hasattr(KVConnectorBase_V1, "get_loaded_kv_cache_group_ids"):
        pytest.skip("this release has no get_loaded_kv_cache_group_ids hook")
    install_fake_adapter(monkeypatch, restores_recurrent_state=True)
    connector = LMCacheConnectorV1(
        lmcache_vllm_config(make_vllm_config),
        KVConnectorRole.SCHEDULER,
        hybrid_kv_cache_config(),
    )
    request = make_request("loaded", BLOCK_SIZE)
    assert connector.get_loaded_kv_cache_group_ids(request) == (ATTENTION_GID,)


def test_adapter_is_shown_only_the_served_group_layers(
    monkeypatch: pytest.MonkeyPatch, make_vllm_config: MakeVllmConfig
) -> None:
    """A worker registers every layer's cache, and a recurrent-state layer's is
    several tensors; the adapter gets the served attention group's layers only.
    A model with one group registers all of its layers, as upstream."""
    install_fake_adapter(monkeypatch)
    vllm_config = lmcache_vllm_config(make_vllm_config)
    kv_caches = {
        RECURRENT_LAYER: [torch.zeros(4, 32), torch.zeros(4, 32)],
        ATTENTION_LAYER: torch.zeros(2, 4, BLOCK_SIZE, 1, 1),
    }
    connector = LMCacheConnectorV1(
        vllm_config, KVConnectorRole.WORKER, hybrid_kv_cache_config()
    )
    connector.register_kv_caches(kv_caches)  # type: ignore[arg-type]
    assert lmcache_adapter(connector).registered_layers == [ATTENTION_LAYER]

    one_group = KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([ATTENTION_LAYER, SLIDING_LAYER], ATTENTION)],
    )
    kv_caches = {
        ATTENTION_LAYER: torch.zeros(2, 4, BLOCK_SIZE, 1, 1),
        SLIDING_LAYER: torch.zeros(2, 4, BLOCK_SIZE, 1, 1),
        "model.layers.2.self_attn.attn": torch.zeros(2, 4, BLOCK_SIZE, 1, 1),
    }
    connector = LMCacheConnectorV1(vllm_config, KVConnectorRole.WORKER, one_group)
    connector.register_kv_caches(kv_caches)  # type: ignore[arg-type]
    assert lmcache_adapter(connector).registered_layers == sorted(kv_caches)


def test_adapter_saves_from_the_served_group_blocks(
    make_vllm_config: MakeVllmConfig,
    make_request: MakeRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler output the adapter builds its saves from carries, for
    every request, only the served group's block ids: adapters read
    `block_ids[0]`, which here is the recurrent-state group, and would save
    its blocks as attention KV."""
    install_fake_adapter(monkeypatch)
    scheduler = start_lmcache_scheduler(make_vllm_config, HYBRID_LAYERS)
    adapter = lmcache_adapter(scheduler.connector)
    request = make_request("saved", 3 * BLOCK_SIZE)
    scheduler.add_request(request)
    scheduler.schedule()
    block_ids = scheduler.kv_cache_manager.get_block_ids(request.request_id)

    assert adapter.scheduled_block_ids == {
        request.request_id: [(list(block_ids[ATTENTION_GID]),)]
    }


def test_hybrid_model_gets_no_external_hits_without_recurrent_state_restore(
    make_vllm_config: MakeVllmConfig,
    make_request: MakeRequest,
    monkeypatch: pytest.MonkeyPatch,
    vllm_log_records: list[logging.LogRecord],
) -> None:
    """An adapter that does not declare `restores_recurrent_state` would load
    attention KV next to stale recurrent state. The connector reports no
    external tokens without asking it, so it never records, arms or emits a
    load, and says why once, at start-up. A model with one attention group
    keeps upstream behaviour with the same adapter."""
    num_prompt_tokens = 4 * BLOCK_SIZE
    install_fake_adapter(monkeypatch, matched_tokens=2 * BLOCK_SIZE)
    scheduler = start_lmcache_scheduler(make_vllm_config, HYBRID_LAYERS)
    adapter = lmcache_adapter(scheduler.connector)
    LMCacheConnectorV1(
        scheduler.vllm_config, KVConnectorRole.WORKER, scheduler.kv_cache_config
    )
    requests = [make_request(f"hybrid-{i}", num_prompt_tokens) for i in range(3)]
    for request in requests:
        scheduler.add_request(request)

    output = scheduler.schedule()

    assert [r.num_computed_tokens for r in output.scheduled_new_reqs] == [0, 0, 0]
    assert adapter.lookups == []
    assert adapter.allocated == {r.request_id: 0 for r in requests}
    assert output.kv_connector_metadata == FakeLMCacheMetadata({})
    [warning] = recurrent_state_warnings(vllm_log_records)
    assert "garble" in warning and "NixlConnector" in warning

    plain = start_lmcache_scheduler(make_vllm_config, {ATTENTION_LAYER: ATTENTION})
    request = make_request("plain", num_prompt_tokens)
    plain.add_request(request)
    output = plain.schedule()
    assert [r.num_computed_tokens for r in output.scheduled_new_reqs] == [
        2 * BLOCK_SIZE
    ]
    assert output.kv_connector_metadata == FakeLMCacheMetadata(
        {request.request_id: 2 * BLOCK_SIZE}
    )
    assert len(recurrent_state_warnings(vllm_log_records)) == 1


def test_hybrid_model_uses_hits_of_an_adapter_that_restores_recurrent_state(
    make_vllm_config: MakeVllmConfig,
    make_request: MakeRequest,
    monkeypatch: pytest.MonkeyPatch,
    vllm_log_records: list[logging.LogRecord],
) -> None:
    """An adapter declaring `restores_recurrent_state` is asked, and its hit
    is scheduled and loaded as for any other model."""
    install_fake_adapter(
        monkeypatch, matched_tokens=2 * BLOCK_SIZE, restores_recurrent_state=True
    )
    scheduler = start_lmcache_scheduler(make_vllm_config, HYBRID_LAYERS)
    adapter = lmcache_adapter(scheduler.connector)
    request = make_request("restored", 4 * BLOCK_SIZE)
    scheduler.add_request(request)

    output = scheduler.schedule()

    assert [r.num_computed_tokens for r in output.scheduled_new_reqs] == [
        2 * BLOCK_SIZE
    ]
    assert adapter.lookups == [request.request_id]
    assert output.kv_connector_metadata == FakeLMCacheMetadata(
        {request.request_id: 2 * BLOCK_SIZE}
    )
    assert recurrent_state_warnings(vllm_log_records) == []


def test_unserved_attention_group_gets_no_external_hits(
    make_vllm_config: MakeVllmConfig,
    make_request: MakeRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keeping the HMA on also splits sliding-window and full attention into
    groups, and LMCache restores only the one it serves: loading it alone
    would garble the output, so such a model gets no external hits either."""
    install_fake_adapter(
        monkeypatch, matched_tokens=2 * BLOCK_SIZE, restores_recurrent_state=True
    )
    scheduler = start_lmcache_scheduler(make_vllm_config, SLIDING_WINDOW_LAYERS)
    assert len(scheduler.kv_cache_config.kv_cache_groups) == 2, (
        "the hybrid KV cache manager is off: one group for both layer kinds"
    )
    adapter = lmcache_adapter(scheduler.connector)
    request = make_request("sliding", 4 * BLOCK_SIZE)
    scheduler.add_request(request)

    output = scheduler.schedule()

    assert [r.num_computed_tokens for r in output.scheduled_new_reqs] == [0]
    assert adapter.lookups == []
    assert output.kv_connector_metadata == FakeLMCacheMetadata({})
