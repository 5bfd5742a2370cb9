"""Probe: a P/D decode request keeps its local full-attention prefix when a
MultiConnector pairs a P/D child with a store-backed one.

On a decode instance the recurrent (Mamba) group of a hybrid model holds no
per-block state checkpoints of a prompt: the prefill instance sends only the
final state. The common prefix hit over all groups is then 0 even when the
full-attention group caches most of the prompt, unless the connector can
restore the lagging recurrent state (`supports_divergent_local_hybrid_hits`,
NixlConnector). Upstream's MultiConnector claims that capability only when
every child has it, so NixlConnector plus an offloading child re-pulls the
whole prompt and allocates the cached prefix a second time. Patched, the
MultiConnector answers per request: a P/D decode request of a hybrid model
uses the full-attention hit, and when that hit diverged (the recurrent group
lags) it loads from the capable child alone, in a nested MultiConnector too.
Everything else, a non-hybrid model or a hit that did not diverge, keeps
upstream's selection, and the weighted one where children set
`load_weight`: an undiverged hit is the same point in every group, and any
child's load on top of it covers every group, as without a MultiConnector.

The children stand in for NixlConnector's scheduler side (`PullChild`: pulls
every prompt token not computed locally, asynchronously) and an offloading
tier (`StoreChild`: a fixed synchronous hit; it cannot complete a divergent
hit, i.e. restore a recurrent state lagging behind the local full-attention
hit).
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import LOAD_WEIGHT_KNOWN, MakeScheduler
from hybrid_scheduler import cache_prefix_without_recurrent_state, generation_request
from scheduler_side_connector import RecordingHMAChild, StoreChild, child_connectors
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiConnector,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

# Every probe prompt starts with this prefix; the decode instance caches its
# first CACHED_BLOCKS blocks before the probe request arrives.
CACHED_BLOCKS = 4
PROMPT_BLOCKS = 7


@pytest.fixture(autouse=True)
def _fixed_block_hash_seed() -> None:
    """Block hashes chain from a process-wide seed; set it once per probe so
    that every request of the probe hashes alike."""
    init_none_hash(sha256)


class PullChild(RecordingHMAChild):
    """NixlConnector's decode side: a `do_remote_prefill` request pulls every
    prompt token not computed locally, recurrent state included."""

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return True

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        params = request.kv_transfer_params or {}
        count = request.num_prompt_tokens - num_computed_tokens
        if params.get("do_remote_prefill") and count > 0:
            return count, True
        return 0, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        if request.kv_transfer_params:
            # As NixlConnector does: the remote prefill is consumed once.
            request.kv_transfer_params["do_remote_prefill"] = False


class IdleCapableChild(PullChild):
    """A P/D child that has nothing to pull for any request."""

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False


# The probe children by class name, for a MultiConnector config.
CHILDREN = {c.__name__: c for c in (PullChild, StoreChild, IdleCapableChild)}

# A MultiConnector child: a probe child as (class name, hit), or the entry of
# a nested MultiConnector (`nested_multi_connector`).
Child = tuple[str, int] | dict[str, Any]


def child_entry(child: Child) -> dict[str, Any]:
    """A child's entry in `kv_connector_extra_config["connectors"]`."""
    if isinstance(child, dict):
        return child
    name, hit = child
    return {
        "kv_connector": name,
        "kv_role": "kv_both",
        "kv_connector_module_path": CHILDREN[name].__module__,
        "kv_connector_extra_config": {"matched_tokens": hit},
    }


def nested_multi_connector(*children: Child) -> dict[str, Any]:
    """The entry of a MultiConnector over `children`, as a child of another."""
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": list(map(child_entry, children))},
    }


def multi_connector_config(
    *children: Child, weights: tuple[float, ...] = ()
) -> KVTransferConfig:
    """A MultiConnector over `children`, with a `load_weight` each where
    `weights` are given (left out on a release that rejects the key, so that
    a probe reaches the selection itself)."""
    entries = list(map(child_entry, children))
    if LOAD_WEIGHT_KNOWN:
        for entry, weight in zip(entries, weights, strict=False):
            entry["load_weight"] = weight
    return KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": entries},
    )


def make_prompt_request(
    request_id: str, num_tokens: int, do_remote_prefill: bool
) -> Request:
    """A request over the shared prompt, as a P/D decode request or not."""
    prompt = [(7 * i) % 200 + 3 for i in range(num_tokens)]
    return generation_request(request_id, prompt, do_remote_prefill)


def cache_shared_prefix(manager: KVCacheManager, block_size: int) -> list[int]:
    """The decode instance caches the shared prompt's first CACHED_BLOCKS
    blocks for full attention only (see `cache_prefix_without_recurrent_state`).
    Returns the cached full-attention block ids."""
    prefix = make_prompt_request("earlier", CACHED_BLOCKS * block_size, False)
    return cache_prefix_without_recurrent_state(manager, prefix.prompt_token_ids)


def leaf_children(connector: KVConnectorBase_V1) -> list[RecordingHMAChild]:
    """The probe children under a MultiConnector in config order, those of a
    nested MultiConnector in its place."""
    if isinstance(connector, MultiConnector):
        return [leaf for c in child_connectors(connector) for leaf in leaf_children(c)]
    assert isinstance(connector, RecordingHMAChild)
    return [connector]


def schedule_prompt(
    scheduler: Scheduler, block_size: int, do_remote_prefill: bool = True
) -> tuple[SchedulerOutput, tuple[int, ...]]:
    """Schedule one request over the whole prompt ("decode" when it is a P/D
    decode request, else "plain"). Returns the step's output and the tokens
    each child was asked to load for the request."""
    request_id = "decode" if do_remote_prefill else "plain"
    scheduler.add_request(
        make_prompt_request(request_id, PROMPT_BLOCKS * block_size, do_remote_prefill)
    )
    output = scheduler.schedule()
    loaded = tuple(
        child.allocated_external_tokens[request_id]
        for child in leaf_children(scheduler.connector)
    )
    return output, loaded


def test_decode_request_keeps_local_full_attention_prefix(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """L prompt tokens, the first P cached locally for full attention only:
    the decode request reuses those P tokens' blocks and pulls L - P (the
    upstream common hit is 0, so it pulls L and allocates P again)."""
    scheduler = make_hybrid_scheduler(
        multi_connector_config(("PullChild", 0), ("StoreChild", 0))
    )
    cached_ids = cache_shared_prefix(scheduler.kv_cache_manager, block_size)
    _, (pulled, _) = schedule_prompt(scheduler, block_size)

    attention_ids = scheduler.kv_cache_manager.get_block_ids("decode")[0]
    reused = len(set(attention_ids) & set(cached_ids))
    # Both counts in one comparison, so a failure reports both.
    assert {
        "pulled tokens": pulled,
        "cached prefix blocks reused": reused,
    } == {
        "pulled tokens": (PROMPT_BLOCKS - CACHED_BLOCKS) * block_size,
        "cached prefix blocks reused": CACHED_BLOCKS,
    }


def test_decode_request_loads_only_from_capable_child(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """The local hit diverged (full attention P tokens, recurrent state 0): a
    store child listed first, with a hit beyond P, must not load the P/D
    decode request, since its tokens would come without the matching
    recurrent state. The P/D child pulls the rest, as upstream's
    NixlConnector alone would (upstream's common hit is 0, so the store
    child loads)."""
    store_hit = (CACHED_BLOCKS + 2) * block_size
    scheduler = make_hybrid_scheduler(
        multi_connector_config(("StoreChild", store_hit), ("PullChild", 0))
    )
    cache_shared_prefix(scheduler.kv_cache_manager, block_size)
    _, loaded = schedule_prompt(scheduler, block_size)

    assert loaded == (0, (PROMPT_BLOCKS - CACHED_BLOCKS) * block_size)


def test_weights_do_not_move_a_diverged_decode_request_off_its_capable_child(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """On a diverged hit only the capable child can restore the recurrent
    state, so a store child's weight, however large, does not make it load."""
    store_hit = (CACHED_BLOCKS + 2) * block_size
    scheduler = make_hybrid_scheduler(
        multi_connector_config(
            ("StoreChild", store_hit), ("PullChild", 0), weights=(100.0, 1.0)
        )
    )
    cache_shared_prefix(scheduler.kv_cache_manager, block_size)
    _, loaded = schedule_prompt(scheduler, block_size)

    assert loaded == (0, (PROMPT_BLOCKS - CACHED_BLOCKS) * block_size)


def test_nested_multi_connector_loads_a_diverged_decode_request_from_its_capable_child(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """MultiConnector[store child, MultiConnector[store child, P/D child]],
    both store children with a hit beyond the cached prefix: the diverged
    decode request loads from the nested P/D child alone. The outer
    MultiConnector picks the nested one, which is capable for the request
    through its P/D child; the nested one must then also restrict its own
    selection to that child, or its store child loads attention KV without
    the lagging recurrent state. (Upstream's common hit is 0, so the first
    store child loads.)"""
    store_hit = (CACHED_BLOCKS + 2) * block_size
    scheduler = make_hybrid_scheduler(
        multi_connector_config(
            ("StoreChild", store_hit),
            nested_multi_connector(("StoreChild", store_hit), ("PullChild", 0)),
        )
    )
    cache_shared_prefix(scheduler.kv_cache_manager, block_size)
    _, loaded = schedule_prompt(scheduler, block_size)

    assert loaded == (0, 0, (PROMPT_BLOCKS - CACHED_BLOCKS) * block_size)


def test_multi_connector_built_without_init_answers_a_lookup(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """Upstream's tests assemble MultiConnectors without ``__init__``
    (``object.__new__``, then only the attributes upstream's
    ``get_num_new_matched_tokens`` reads); the diverged-hit bookkeeping must
    not make such a connector fail its lookup."""
    store_hit = 2 * block_size
    scheduler = make_hybrid_scheduler(multi_connector_config(("StoreChild", store_hit)))
    assert isinstance(scheduler.connector, MultiConnector)
    bare = object.__new__(MultiConnector)
    bare._connectors = child_connectors(scheduler.connector)
    bare._requests_to_connector = {}
    request = make_prompt_request("decode", PROMPT_BLOCKS * block_size, True)

    assert bare.get_num_new_matched_tokens(request, 0) == (store_hit, False)


def test_undiverged_decode_request_keeps_upstream_selection(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """Nothing cached locally, so the hit cannot diverge: every group's local
    hit is the same point (0), and a child's hit on top of it is upstream's
    contract, whether or not the child can complete a divergent hit: it
    loads every group, recurrent state included, for the tokens it reports.
    So the first child with a hit loads the P/D decode request, exactly as
    upstream (the store child here)."""
    store_hit = 2 * block_size
    scheduler = make_hybrid_scheduler(
        multi_connector_config(("StoreChild", store_hit), ("PullChild", 0))
    )
    _, loaded = schedule_prompt(scheduler, block_size)

    assert loaded == (store_hit, 0)


def test_non_hybrid_decode_request_keeps_upstream_selection(
    make_scheduler: MakeScheduler, block_size: int
) -> None:
    """A model without recurrent-state groups: [store child with a 5-block
    hit, P/D child] loads the P/D decode request from the store child, as
    upstream, and the P/D child pulls nothing."""
    store_hit = 5 * block_size
    scheduler = make_scheduler(
        multi_connector_config(("StoreChild", store_hit), ("PullChild", 0))
    )
    output, loaded = schedule_prompt(scheduler, block_size)

    assert loaded == (store_hit, 0)
    assert output.scheduled_new_reqs[0].num_computed_tokens == store_hit


def test_capable_child_without_tokens_falls_back_to_common_hit(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """The hit diverged but the capable child has nothing to load: no child
    loads and the request starts from the common hit (0: the recurrent group
    holds no checkpoint), as upstream, instead of from a full-attention
    prefix whose recurrent state nobody restores."""
    scheduler = make_hybrid_scheduler(
        multi_connector_config(("IdleCapableChild", 0), ("StoreChild", 0))
    )
    cache_shared_prefix(scheduler.kv_cache_manager, block_size)
    output, loaded = schedule_prompt(scheduler, block_size)

    assert loaded == (0, 0)
    assert output.scheduled_new_reqs[0].num_computed_tokens == 0


def test_ordinary_request_keeps_the_common_hit(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """Not a P/D decode request: the conservative common hit (0 here, the
    recurrent group has no checkpoint) and the first child with a hit loads,
    exactly as upstream."""
    store_hit = 5 * block_size
    scheduler = make_hybrid_scheduler(
        multi_connector_config(("PullChild", 0), ("StoreChild", store_hit))
    )
    cache_shared_prefix(scheduler.kv_cache_manager, block_size)
    output, loaded = schedule_prompt(scheduler, block_size, do_remote_prefill=False)

    assert loaded == (0, store_hit)
    # Nothing local (the common hit is 0), the store child's tokens on top.
    assert output.scheduled_new_reqs[0].num_computed_tokens == store_hit
