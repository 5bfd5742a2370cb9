"""Probe: NIXL's decode side pairs a hybrid model's blocks with the prefill
side's when Mamba prefix caching ("align") is on.

In align mode a request's Mamba group holds null padding up to its state
slot, so the block ids the prefill instance sends for it (what
`request_finished` reads from its KV cache manager) are `[0, ..., 0, S]`,
while the decode instance receives only the state slot it allocated (`[s]`:
`get_unhashed_block_ids_all_groups` skips null blocks). Up to 0.22.x
`NixlConnectorWorker._apply_prefix_caching` asserts that both lists are
equally long, so the first align-mode transfer kills the decode worker; and
for full attention it front-trims both lists to the shorter one, so a decode
instance that reuses a cached prefix would read the prefill side's first
blocks into its suffix blocks. Patched (vllm#42554's worker part), the SSM
state slots pair with the remote list's last ones and full attention reads
only the uncomputed suffix.

The block lists come from real KV cache managers (the prefill side's after
it computed the prompt, the decode side's NixlConnector metadata); the worker
is NIXL's real `NixlConnectorWorker`, built without `__init__` (which needs a
NIXL agent and registered device KV caches) with the attributes `__init__`
derives from the KV cache config, as upstream's own tests of this method do.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import MakeScheduler
from hybrid_scheduler import (
    cache_prefix_without_recurrent_state,
    generation_request,
    hybrid_kv_cache_config,
)
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker import (
    NixlConnectorWorker,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

PROMPT_BLOCKS = 7


@pytest.fixture(autouse=True)
def _fixed_block_hash_seed() -> None:
    init_none_hash(sha256)


def nixl_config() -> KVTransferConfig:
    return KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both")


def prompt(block_size: int) -> list[int]:
    return [(5 * i) % 200 + 3 for i in range(PROMPT_BLOCKS * block_size)]


def prefill_side_block_ids(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> tuple[list[int], ...]:
    """The block ids a prefill instance sends for the prompt: it computes
    all but the last token (NixlConnector truncates a hybrid model's prompt
    on that side) and sends what its KV cache manager holds."""
    scheduler = make_hybrid_scheduler(nixl_config())
    request = generation_request("prefill", prompt(block_size)[:-1])
    scheduler.kv_cache_manager.allocate_slots(request, request.num_tokens)
    return scheduler.kv_cache_manager.get_block_ids("prefill")


def decode_side_block_ids(
    scheduler: Scheduler,
    remote_block_ids: tuple[list[int], ...],
    num_cached_blocks: int = 0,
) -> tuple[list[int], ...]:
    """The local block ids NixlConnector's decode side hands its worker for
    a P/D decode request of the prompt, whose first `num_cached_blocks`
    blocks the decode instance caches for full attention (a P/D decode
    instance holds no recurrent-state checkpoint of a pulled prompt). The
    blocks are allocated as `Scheduler.schedule()` allocates them for an
    asynchronous load, here without its local-hit lookup, which on 0.22.1
    drops a full-attention hit the recurrent group does not share."""
    manager = scheduler.kv_cache_manager
    connector: Any = scheduler.connector
    tokens = prompt(scheduler.block_size)
    cache_prefix_without_recurrent_state(
        manager, tokens[: num_cached_blocks * scheduler.block_size]
    )
    request = generation_request("decode", tokens)
    request.kv_transfer_params = {
        "do_remote_prefill": True,
        "remote_block_ids": [list(ids) for ids in remote_block_ids],
        "remote_engine_id": "prefill-engine",
        "remote_request_id": "prefill",
        "remote_host": "127.0.0.1",
        "remote_port": 1,
        "tp_size": 1,
    }
    hit = [
        manager.block_pool.get_cached_block(block_hash, [0])[0]
        for block_hash in request.block_hashes[:num_cached_blocks]
    ]
    num_local = num_cached_blocks * scheduler.block_size
    num_external, load_async = connector.get_num_new_matched_tokens(request, num_local)
    assert load_async and num_external == len(tokens) - 1 - num_local
    manager.allocate_slots(
        request,
        0,
        num_new_computed_tokens=num_local,
        new_computed_blocks=manager.create_kv_cache_blocks((hit, [])),
        num_external_computed_tokens=num_external,
        delay_cache_blocks=True,
    )
    connector.update_state_after_alloc(
        request, manager.get_blocks("decode"), num_external
    )
    _, local_block_ids = connector.connector_scheduler._reqs_need_recv["decode"]
    return local_block_ids


def worker(physical_blocks_per_logical: int = 1) -> NixlConnectorWorker:
    """NIXL's worker with what `__init__` derives from the hybrid KV cache
    config: a Mamba group present, the group spec types, and the kernel
    blocks per logical block (1: the kernel block size is the block size)."""
    nixl_worker = object.__new__(NixlConnectorWorker)
    nixl_worker.kv_cache_config = hybrid_kv_cache_config()
    nixl_worker._has_mamba = True
    nixl_worker._group_spec_types = (FullAttentionSpec, MambaSpec)
    nixl_worker._physical_blocks_per_logical_kv_block = physical_blocks_per_logical
    return nixl_worker


def test_align_mode_transfer_pairs_the_state_slot(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """Nothing cached on the decode side: every full-attention block pairs
    with its remote one, and the one local state slot with the remote
    list's last (upstream 0.22.1 asserts the SSM lists equally long)."""
    remote = prefill_side_block_ids(make_hybrid_scheduler, block_size)
    local = decode_side_block_ids(make_hybrid_scheduler(nixl_config()), remote)
    assert remote[1][:-1] == [0] * (len(remote[1]) - 1), "align-mode null padding"

    paired_local, paired_remote = worker()._apply_prefix_caching(
        [list(ids) for ids in local], [list(ids) for ids in remote], 1
    )

    assert (list(paired_local[0]), list(paired_remote[0])) == (local[0], remote[0])
    assert (list(paired_local[1]), list(paired_remote[1])) == (
        local[1],
        remote[1][-1:],
    )


def test_partial_local_hit_reads_only_the_uncomputed_suffix(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """The decode side caches the prompt's first 4 full-attention blocks and
    allocated only the rest: those pair with the prefill side's last blocks,
    not its first ones (upstream 0.22.1 asserts, and its front-trim would
    read prefill blocks 0.. into the decode side's suffix blocks)."""
    cached = 4
    remote = prefill_side_block_ids(make_hybrid_scheduler, block_size)
    local = decode_side_block_ids(
        make_hybrid_scheduler(nixl_config()), remote, num_cached_blocks=cached
    )
    assert len(local[0]) == PROMPT_BLOCKS - cached

    paired_local, paired_remote = worker()._apply_prefix_caching(
        [list(ids) for ids in local], [list(ids) for ids in remote], 1
    )

    assert list(zip(paired_local[0], paired_remote[0], strict=True)) == list(
        zip(local[0], remote[0][cached:], strict=True)
    )
    assert (list(paired_local[1]), list(paired_remote[1])) == (
        local[1],
        remote[1][-1:],
    )


def test_heterogeneous_kernel_blocks_keep_upstream_pairing() -> None:
    """Scope: when the two sides map a logical block to different numbers of
    kernel blocks (heterogeneous TP), full attention keeps upstream's
    front-trim to the shorter list (vllm's own case: 12 local kernel blocks
    at 6 per logical block, 10 remote at 10)."""
    paired_local, paired_remote = worker(6)._apply_prefix_caching(
        [list(range(12)), [42]], [list(range(10)), [42]], 10
    )

    assert paired_local == [list(range(10)), [42]]
    assert paired_remote == [list(range(10)), [42]]
