"""Probe: a P/D decode request of a hybrid model keeps its local
full-attention prefix with NixlConnector, alone or as a MultiConnector child.

On a decode instance the recurrent (Mamba) group of a hybrid model holds no
per-block state checkpoints of a prompt: the prefill instance sends only the
final state. Up to 0.26 the scheduler takes the common hit over all groups
(`HybridKVCacheCoordinator.find_longest_cache_hit`, a fixed-point minimum),
which is then 0 even when full attention caches most of the prompt, so NIXL
pulls the whole prompt again into freshly allocated blocks. Patched (upstream
0.27/0.28's divergent-hit capability), a connector that restores the
recurrent state (NixlConnector) gets the full-attention hit and pulls the
rest; when it has nothing to load, the request falls back to the common hit.
A MultiConnector with a child that cannot complete such a divergent hit (an
offloading tier, `StoreChild`) answers the capability per request
(multi-connector-pd-decode-hybrid-hit): a P/D decode request whose hit
diverged is loaded by NIXL alone, in a nested MultiConnector too. The other
parts are real (see `nixl_sides.py`).
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import MakeScheduler, MakeVllmConfig
from hybrid_scheduler import (
    cache_prefix_without_recurrent_state,
    generation_request,
    hybrid_kv_cache_config,
    start_scheduler,
)
from nixl_sides import (
    NIXL_CHILD,
    decode_request,
    multi_connector,
    nixl_config,
    nixl_worker,
    prefill_side_block_ids,
    prompt,
    store_tier,
)
from scheduler_side_connector import child_connectors
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiConnector,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

CACHED_BLOCKS = 4
PROMPT_BLOCKS = 7


@pytest.fixture(autouse=True)
def _fixed_block_hash_seed() -> None:
    init_none_hash(sha256)


def recv_block_ids(output: SchedulerOutput) -> tuple[list[int], ...]:
    """The local block ids NixlConnector's decode side hands its worker."""
    metadata: Any = output.kv_connector_metadata
    return metadata.reqs_to_recv["decode"].local_block_ids


def reused(scheduler: Scheduler, cached_ids: list[int]) -> int:
    """How many of the cached full-attention blocks the decode request holds."""
    attention_ids = scheduler.kv_cache_manager.get_block_ids("decode")[0]
    return len(set(attention_ids) & set(cached_ids))


def pull_only_the_uncached_suffix(
    scheduler: Scheduler, block_size: int, remote: Any
) -> Any:
    """Cache the prompt's first CACHED_BLOCKS blocks for full attention only,
    schedule the decode request of the whole prompt (the prefill side's
    blocks: `remote`), and check that it waits for NIXL with those blocks
    reused and only the rest pulled; returns its local block ids."""
    cached_ids = cache_prefix_without_recurrent_state(
        scheduler.kv_cache_manager, prompt(CACHED_BLOCKS * block_size)
    )
    scheduler.add_request(decode_request(PROMPT_BLOCKS * block_size, remote, "decode"))
    local = recv_block_ids(scheduler.schedule())

    assert scheduler.requests["decode"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    # Both counts in one comparison, so a failure reports both.
    assert {
        "full-attention blocks pulled": len(local[0]),
        "cached prefix blocks reused": reused(scheduler, cached_ids),
    } == {
        "full-attention blocks pulled": PROMPT_BLOCKS - CACHED_BLOCKS,
        "cached prefix blocks reused": CACHED_BLOCKS,
    }
    return local


@pytest.fixture
def make_all_mode_hybrid_scheduler(make_vllm_config: MakeVllmConfig) -> MakeScheduler:
    """The hybrid scheduler with Mamba prefix caching in "all" mode, where
    the scheduler runs no block-aligned split (on 0.22.1 the split rejects
    every external hit: scheduler-mamba-external-hits), so that the probe
    meets the local hit itself on the unpatched release."""

    def make(kv_transfer_config: KVTransferConfig) -> Scheduler:
        vllm_config = make_vllm_config(kv_transfer_config, mamba_cache_mode="all")
        return start_scheduler(
            vllm_config, hybrid_kv_cache_config(mamba_cache_mode="all")
        )

    return make


def test_decode_request_keeps_local_full_attention_prefix(
    make_all_mode_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """L prompt tokens, the first P cached locally for full attention only:
    the decode request reuses those P tokens' blocks and NIXL pulls the rest
    (upstream 0.22.1's common hit is 0: it pulls everything into new
    blocks)."""
    scheduler = make_all_mode_hybrid_scheduler(nixl_config())
    pull_only_the_uncached_suffix(scheduler, block_size, ([], []))


def schedule_decode_behind_store_tiers(
    make: MakeScheduler, block_size: int, config: dict[str, Any]
) -> dict[str, Any]:
    """Schedule the decode request of the whole prompt, its first
    CACHED_BLOCKS blocks cached for full attention only, under a
    MultiConnector `config` over offloading tiers and NixlConnector (each
    MultiConnector's last child). Returns what NIXL pulls, the cached blocks
    reused, and the tokens each offloading tier loads, in config order."""
    scheduler = make(KVTransferConfig(**config))
    cached_ids = cache_prefix_without_recurrent_state(
        scheduler.kv_cache_manager, prompt(CACHED_BLOCKS * block_size)
    )
    scheduler.add_request(
        decode_request(PROMPT_BLOCKS * block_size, ([], []), "decode")
    )
    metadata: Any = scheduler.schedule().kv_connector_metadata
    connector: Any = scheduler.connector
    stores = []
    while isinstance(connector, MultiConnector):
        *tiers, connector = child_connectors(connector)
        stores += tiers
        metadata = metadata.metadata[-1]
    # NIXL's part of the metadata; no local block ids when it loads nothing:
    # it only tells the prefill side to free the request's blocks.
    nixl_ids = metadata.reqs_to_recv["decode"].local_block_ids
    return {
        "full-attention blocks NIXL pulls": len(nixl_ids[0]) if nixl_ids else 0,
        "cached prefix blocks reused": reused(scheduler, cached_ids),
        "tokens the offloading tiers load": tuple(
            store.allocated_external_tokens["decode"] for store in stores
        ),
    }


def test_multi_connector_decode_request_keeps_local_full_attention_prefix(
    make_all_mode_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """MultiConnector[offloading tier, NixlConnector], the offloading tier
    listed first with a hit beyond the cached prefix: the decode request
    reuses the cached prefix and NIXL alone pulls the rest, recurrent state
    included (upstream 0.22.1: the common hit 0, so nothing cached is reused
    and the offloading tier loads its hit instead)."""
    store_hit = (CACHED_BLOCKS + 2) * block_size
    config = multi_connector(store_tier(store_hit), NIXL_CHILD)

    assert schedule_decode_behind_store_tiers(
        make_all_mode_hybrid_scheduler, block_size, config
    ) == {
        "full-attention blocks NIXL pulls": PROMPT_BLOCKS - CACHED_BLOCKS,
        "cached prefix blocks reused": CACHED_BLOCKS,
        "tokens the offloading tiers load": (0,),
    }


def test_nested_multi_connector_decode_request_is_pulled_by_nixl_alone(
    make_all_mode_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """MultiConnector[offloading tier, MultiConnector[offloading tier,
    NixlConnector]], both tiers with a hit beyond the cached prefix: the
    nested MultiConnector, chosen for the diverged hit, lets NIXL alone load
    it too, so no tier loads attention KV without the recurrent state
    (upstream 0.22.1: the common hit 0, and the first tier loads)."""
    store_hit = (CACHED_BLOCKS + 2) * block_size
    config = multi_connector(
        store_tier(store_hit),
        multi_connector(store_tier(store_hit), NIXL_CHILD),
    )

    assert schedule_decode_behind_store_tiers(
        make_all_mode_hybrid_scheduler, block_size, config
    ) == {
        "full-attention blocks NIXL pulls": PROMPT_BLOCKS - CACHED_BLOCKS,
        "cached prefix blocks reused": CACHED_BLOCKS,
        "tokens the offloading tiers load": (0, 0),
    }


def test_align_mode_decode_request_reads_only_the_suffix(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """The same in align mode, end to end: the decode request reuses the
    cached prefix, and the worker then reads the prefill side's last blocks
    into the decode side's suffix blocks and its final state into the state
    slot."""
    num_tokens = PROMPT_BLOCKS * block_size
    remote = prefill_side_block_ids(make_hybrid_scheduler(nixl_config()), num_tokens)
    scheduler = make_hybrid_scheduler(nixl_config())
    local = pull_only_the_uncached_suffix(scheduler, block_size, remote)
    _, read = nixl_worker()._apply_prefix_caching(
        [list(ids) for ids in local], [list(ids) for ids in remote], 1
    )
    assert [list(ids) for ids in read] == [remote[0][CACHED_BLOCKS:], remote[1][-1:]]


def test_nothing_to_pull_uses_no_attention_kv_without_its_state(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """Full attention caches every prompt token NIXL would pull (all but the
    last), so patched NIXL has nothing to load and no recurrent state
    arrives: the request falls back to the common hit (0) and reuses none
    of those blocks, as upstream 0.22.1 (which pulls the whole prompt from
    that common hit)."""
    num_tokens = PROMPT_BLOCKS * block_size + 1
    scheduler = make_hybrid_scheduler(nixl_config())
    cached_ids = cache_prefix_without_recurrent_state(
        scheduler.kv_cache_manager, prompt(num_tokens - 1)
    )
    scheduler.add_request(decode_request(num_tokens, ([], []), "decode"))
    scheduler.schedule()

    assert reused(scheduler, cached_ids) == 0


def test_ordinary_request_keeps_the_common_hit_and_its_stats(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """Not a P/D decode request (a kv_both instance serves both kinds): the
    common hit (0, the recurrent group holds no checkpoint), recorded once in
    the prefix cache stats, exactly as upstream."""
    num_tokens = PROMPT_BLOCKS * block_size
    scheduler = make_hybrid_scheduler(nixl_config())
    cache_prefix_without_recurrent_state(
        scheduler.kv_cache_manager, prompt(CACHED_BLOCKS * block_size)
    )
    scheduler.kv_cache_manager.make_prefix_cache_stats()
    scheduler.add_request(generation_request("plain", prompt(num_tokens)))
    output = scheduler.schedule()

    assert [(r.req_id, r.num_computed_tokens) for r in output.scheduled_new_reqs] == [
        ("plain", 0)
    ]
    stats = scheduler.kv_cache_manager.make_prefix_cache_stats()
    assert stats is not None
    assert (stats.requests, stats.queries, stats.hits) == (1, num_tokens, 0)


def test_non_hybrid_decode_request_keeps_upstream_hit(
    make_scheduler: MakeScheduler, block_size: int
) -> None:
    """A model without recurrent-state groups: the decode request's local
    hit is the cached prefix and NIXL pulls the rest, exactly as upstream."""
    scheduler = make_scheduler(nixl_config())
    manager = scheduler.kv_cache_manager
    fill = generation_request("earlier", prompt(CACHED_BLOCKS * block_size))
    manager.allocate_slots(fill, CACHED_BLOCKS * block_size)
    manager.free(fill)
    manager.make_prefix_cache_stats()
    scheduler.add_request(decode_request(PROMPT_BLOCKS * block_size, ([],), "decode"))
    local = recv_block_ids(scheduler.schedule())

    assert len(local[0]) == PROMPT_BLOCKS - CACHED_BLOCKS
    stats = manager.make_prefix_cache_stats()
    assert stats is not None
    assert (stats.requests, stats.hits) == (1, CACHED_BLOCKS * block_size)
