"""Probe: a speculating (MTP) P/D decode request of a hybrid model keeps only
the local prefix every KV cache group allows, and NIXL writes the pulled
recurrent state into the request's state block, not into a draft block.

With EAGLE/MTP and prefix caching the scheduler's KV cache manager drops the
last matched full-attention block of a hit (`drop_eagle_block`): its KV may
hold a slot written with a draft token. vLLM turns it on from the
speculative config (`use_eagle_block_drop`, sched/scheduler.py:301/318 in
0.31.0, :316/333 in 0.32.0, :331/356 in 0.33.0) for the KV cache groups that
hold the draft model's layers, or for every group when none is known to
(kv_cache_coordinator.py:109 in 0.31.0, :132 in 0.32.0, :134 in 0.33.0; the
group is flagged in 0.33.0's kv_cache_planning.py:1655). Each Mamba group
also gets `num_speculative_blocks` (model_executor/layers/mamba/abstract.py:79
in 0.31.0 and 0.32.0, :86 in 0.33.0): scratch blocks after a request's state
block, which NIXL's scheduler side clips off the blocks it has the prefill
side's state written into (`get_exchange_clipped_blocks`,
nixl/base_scheduler.py:250 in 0.31.0 and 0.32.0, :253 in 0.33.0).

multi-connector-pd-decode-hybrid-hit lets a MultiConnector over an offloading
tier and NixlConnector use upstream's divergent hit
(`KVCacheManager.get_computed_blocks_for_connector`, kv_cache_manager.py:323
in 0.31.0 and 0.32.0, :330 in 0.33.0) for a P/D decode request. That lookup
asks each group alone (`find_longest_cache_hit_per_group`,
kv_cache_coordinator.py:979 in 0.31.0, :933 in 0.32.0, :943 in 0.33.0),
passing `drop_eagle_block` to every finder; the Mamba finder
(`MambaManager.find_longest_cache_hit`, single_type_kv_cache_manager.py:1488
in 0.31.0, :1454 in 0.32.0, :1470 in 0.33.0) takes the flag and ignores it
(vllm#53912; PRs #48375 and #57128, open). These probes show what the patched
path does with a draft block: the full-attention hit it keeps is the one after
the drop, NIXL pulls the rest and the state into the state block; and where a
local Mamba checkpoint sits at the dropped block (the finder's gap), the
lookup's own guard (a group hit deeper than full attention falls back to the
common hit: kv_cache_manager.py:360-364 in 0.31.0 and 0.32.0, :369-373 in
0.33.0) sends the request to upstream's common hit: the gap costs the local
prefix there, never a longer hit or a local state above it.

The model is a tiny Qwen3.5 with one MTP layer (`mtp_num_hidden_layers`), so
the speculative config is vLLM's own for `method: mtp`; the KV cache config is
the probes' hybrid one with the Mamba group's `num_speculative_blocks` set as
vLLM sets it. Real NixlConnector scheduler side; the offloading tier is
`StoreChild`. vLLM's CPU platform asks the host's AMX support in 0.30.0-0.33.0
only to pick attention backends (vllm/platforms/cpu.py:147-151 in 0.30.0 and 0.31.0,
:152-156 in 0.32.0, :163-167 in 0.33.0), not to turn prefix caching off, so
these probes need no `host_amx` variants: they run as on a host without AMX.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nixl_sides
import pytest
from conftest import MakeScheduler, probe_vllm_config, tiny_model_config
from hybrid_scheduler import (
    BLOCK_SIZE,
    cache_prefix_without_recurrent_state,
    generation_request,
    hybrid_kv_cache_config,
    start_scheduler,
)
from scheduler_side_connector import child_connectors
from vllm.config import KVTransferConfig, ParallelConfig, SpeculativeConfig
from vllm.utils.hashing import sha256
from vllm.utils.math_utils import cdiv
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import MambaManager
from vllm.v1.kv_cache_interface import MambaSpec

from ci.fixtures.tiny_configs import CONFIGS

CACHED_BLOCKS = 4
PROMPT_BLOCKS = 7
# The offloading tier's hit, beyond the cached prefix: upstream's selection
# lets it load the request, which must not happen on a diverged hit.
STORE_HIT = (CACHED_BLOCKS + 2) * BLOCK_SIZE

# The tiny Qwen3.5 with one MTP layer that the P/D suite serves; here only
# its config, no weights.
QWEN3_5_MTP = CONFIGS["tiny-qwen3.5-mtp"]

# Which KV cache groups get the draft-block drop: the full-attention group,
# where the engine puts the MTP layer when it knows the draft layers, or
# every group, vLLM's fallback when none is flagged.
EAGLE_GROUPS = {"draft-group-flagged": True, "no-group-flagged": False}


@pytest.fixture(autouse=True)
def _fixed_block_hash_seed() -> None:
    init_none_hash(sha256)


@pytest.fixture(scope="module")
def mtp_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("tiny-qwen3.5-mtp")
    (model_dir / "config.json").write_text(json.dumps(QWEN3_5_MTP))
    return model_dir


@pytest.fixture(params=[1, 2], ids=["mtp1", "mtp2"])
def num_speculative_tokens(request: pytest.FixtureRequest) -> int:
    """MTP with one speculative token, and multi-module MTP with two."""
    return request.param


@pytest.fixture(params=list(EAGLE_GROUPS.values()), ids=list(EAGLE_GROUPS))
def draft_group_flagged(request: pytest.FixtureRequest) -> bool:
    """Whether the full-attention group is flagged as the draft's (else no
    group is, and every group gets the drop)."""
    return request.param


@pytest.fixture
def make_speculating_scheduler(
    mtp_model_dir: Path, num_speculative_tokens: int, draft_group_flagged: bool
) -> MakeScheduler:
    """The real v1 `Scheduler` of a decode instance serving the MTP model
    with prefix caching in "align" mode, over the probes' hybrid KV cache
    config with the Mamba group's speculative blocks."""

    def make(kv_transfer_config: KVTransferConfig) -> Scheduler:
        model_config = tiny_model_config(mtp_model_dir)
        vllm_config = probe_vllm_config(
            model_config,
            kv_transfer_config,
            "align",
            speculative_config=SpeculativeConfig(
                method="mtp",
                num_speculative_tokens=num_speculative_tokens,
                target_model_config=model_config,
                target_parallel_config=ParallelConfig(),
            ),
        )
        kv_cache_config = hybrid_kv_cache_config(
            num_speculative_blocks=num_speculative_tokens
        )
        kv_cache_config.kv_cache_groups[0].is_eagle_group = draft_group_flagged
        scheduler = start_scheduler(vllm_config, kv_cache_config)
        # From 0.34.0 a connector that supports lookahead block hashes (plain
        # NixlConnector, nixl/connector.py:93 there, as the prefill side here
        # runs it) gets them instead of the drop (sched/scheduler.py:342-345
        # there); MultiConnector over the offloading tier does not.
        assert (
            scheduler.kv_cache_manager.use_eagle
            or vllm_config.num_hash_lookahead_tokens
        ), "no draft-block drop, and no lookahead block hashes"
        return scheduler

    return make


def offload_and_nixl(make: MakeScheduler) -> Scheduler:
    """The decode instance's scheduler under MultiConnector[offloading tier
    with a hit past the cached prefix, NixlConnector]."""
    return make(
        KVTransferConfig(
            **nixl_sides.multi_connector(
                nixl_sides.store_tier(STORE_HIT), nixl_sides.NIXL_CHILD
            )
        )
    )


def schedule_decode_request(
    scheduler: Scheduler, remote: tuple[list[int], ...] = ([], [])
) -> dict[str, Any]:
    """Schedule the P/D decode request of the whole prompt, whose prefill
    side sent the block ids `remote`, and return what NixlConnector's
    scheduler side hands its worker for it (the local block ids it has the
    prefill side's blocks written into, per group, and the blocks each group
    covers locally) and what the offloading tier loads."""
    scheduler.add_request(
        nixl_sides.decode_request(PROMPT_BLOCKS * BLOCK_SIZE, remote, "decode")
    )
    metadata: Any = scheduler.schedule().kv_connector_metadata
    store, _ = child_connectors(scheduler.connector)
    receive = metadata.metadata[-1].reqs_to_recv["decode"]
    return {
        "recv": tuple(list(ids) for ids in receive.local_block_ids),
        "local": tuple(receive.local_num_computed_blocks),
        "store": store.allocated_external_tokens["decode"],
    }


def test_speculating_decode_request_keeps_the_local_prefix_below_the_draft_block(
    make_speculating_scheduler: MakeScheduler, num_speculative_tokens: int
) -> None:
    """L prompt tokens, the first P blocks cached locally for full attention
    only (as P/D leaves a decode instance), MTP on: the decode request keeps
    the first P - 1 cached blocks (the drop takes the last matched one, whose
    KV may hold a draft token's slot), never the P-th, and NIXL alone pulls
    the rest: the full-attention blocks after the kept hit, in order, and the
    recurrent state into the request's state block, a fresh block ahead of
    its `num_speculative_blocks` scratch blocks. The prefill side, which
    speculates alike, sends one state block and every full-attention block of
    the prompt; the decode side writes its last L - (P - 1) blocks and the
    state, so the blocks it skips are exactly those it keeps. (Upstream's
    common hit is 0, so none of the cached blocks is reused and the
    offloading tier loads.)"""
    remote = nixl_sides.prefill_side_sent_block_ids(
        make_speculating_scheduler(nixl_sides.nixl_config()), PROMPT_BLOCKS * BLOCK_SIZE
    )
    scheduler = offload_and_nixl(make_speculating_scheduler)
    cached = cache_prefix_without_recurrent_state(
        scheduler.kv_cache_manager, nixl_sides.prompt(CACHED_BLOCKS * BLOCK_SIZE)
    )
    pulled = schedule_decode_request(scheduler, remote)

    attention, mamba = scheduler.kv_cache_manager.get_block_ids("decode")
    kept = CACHED_BLOCKS - 1
    # The state after the loaded prefix lives in the block of its last token.
    computed = scheduler.requests["decode"].num_computed_tokens
    state = mamba[cdiv(computed, BLOCK_SIZE) - 1]
    block = scheduler.kv_cache_manager.block_pool.blocks[state]
    assert {
        "cached blocks reused": attention[:kept],
        "dropped block reused": cached[kept] in attention,
        "tokens the offloading tier loads": pulled["store"],
    } == {
        "cached blocks reused": cached[:kept],
        "dropped block reused": False,
        "tokens the offloading tier loads": 0,
    }
    assert {
        "blocks covered locally": pulled["local"],
        "full-attention blocks NIXL writes": pulled["recv"][0],
        "state blocks NIXL writes": pulled["recv"][1],
        "state block fresh": (block.block_hash, block.ref_cnt),
        "scratch blocks after it": len(mamba) - cdiv(computed, BLOCK_SIZE),
        "prefill blocks the decode side skips": len(remote[0]) - len(pulled["recv"][0]),
        "state blocks the prefill side sends": len(remote[1]),
    } == {
        "blocks covered locally": (kept, 0),
        "full-attention blocks NIXL writes": attention[kept:],
        "state blocks NIXL writes": [state],
        "state block fresh": (None, 1),
        "scratch blocks after it": num_speculative_tokens,
        "prefill blocks the decode side skips": kept,
        "state blocks the prefill side sends": 1,
    }


def cache_prefix_with_its_state(
    manager: KVCacheManager, num_blocks: int
) -> tuple[list[int], int]:
    """The decode instance computed the prompt's first `num_blocks` blocks
    itself (say, as an earlier turn's output): full attention and the Mamba
    state checkpoint at their end stay cached. Returns the full-attention
    block ids and the checkpoint's block id."""
    fill = generation_request("earlier", nixl_sides.prompt(num_blocks * BLOCK_SIZE))
    manager.allocate_slots(fill, fill.num_tokens)
    fill.num_computed_tokens = fill.num_tokens
    attention, mamba = manager.get_block_ids(fill.request_id)
    manager.free(fill)
    return list(attention), mamba[num_blocks - 1]


def test_mamba_checkpoint_at_the_draft_block_sends_decode_request_to_common_hit(
    make_speculating_scheduler: MakeScheduler,
) -> None:
    """Whether vllm#53912's finder gap reaches the patched path: it does, as
    a lost local prefix, not as a longer hit. The decode instance holds the
    first P blocks and the Mamba checkpoint at their end. Full attention
    allows P - 1 blocks (the drop); the Mamba finder, ignoring the drop,
    reports its checkpoint at P, deeper than full attention, so the divergent
    lookup falls back to the common hit (0: no checkpoint at P - 1). The
    request then keeps no cached block and not that checkpoint, and NIXL
    pulls nothing: upstream's selection, exactly as without the patch (and as
    upstream's NixlConnector alone). Fails when upstream's Mamba finder
    honours the drop (#48375, #57128): re-check the patched path then, whose
    hit would diverge (P - 1 against 0) and keep the P - 1 blocks."""
    scheduler = offload_and_nixl(make_speculating_scheduler)
    manager = scheduler.kv_cache_manager
    cached, checkpoint = cache_prefix_with_its_state(manager, CACHED_BLOCKS)

    request = nixl_sides.decode_request(PROMPT_BLOCKS * BLOCK_SIZE, ([], []), "probe")
    coordinator: Any = manager.coordinator
    mamba_group = coordinator.single_type_managers[1]
    spec = mamba_group.kv_cache_spec
    assert isinstance(spec, MambaSpec) and isinstance(mamba_group, MambaManager)
    mamba_hits = {
        drop: MambaManager.find_longest_cache_hit(
            block_hashes=request.block_hashes,
            max_length=request.num_tokens - 1,
            kv_cache_group_ids=[1],
            block_pool=manager.block_pool,
            kv_cache_spec=spec,
            drop_eagle_block=drop,
            alignment_tokens=BLOCK_SIZE,
        )[1]
        for drop in (False, True)
    }
    _, per_group = coordinator.find_longest_cache_hit_per_group(
        request.block_hashes, request.num_tokens - 1
    )
    assert {
        "Mamba finder hit, without and with the drop": mamba_hits,
        "per-group hits (full attention, Mamba)": per_group,
    } == {
        "Mamba finder hit, without and with the drop": {
            False: CACHED_BLOCKS * BLOCK_SIZE,
            True: CACHED_BLOCKS * BLOCK_SIZE,
        },
        "per-group hits (full attention, Mamba)": (
            (CACHED_BLOCKS - 1) * BLOCK_SIZE,
            CACHED_BLOCKS * BLOCK_SIZE,
        ),
    }

    pulled = schedule_decode_request(scheduler)
    attention, mamba = manager.get_block_ids("decode")
    assert {
        "cached blocks reused": set(cached) & set(attention),
        "full-attention blocks NIXL writes": pulled["recv"],
        "local checkpoint held": checkpoint in mamba,
        "tokens the offloading tier loads": pulled["store"],
    } == {
        "cached blocks reused": set(),
        "full-attention blocks NIXL writes": (),
        "local checkpoint held": False,
        "tokens the offloading tier loads": STORE_HIT,
    }
