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
blocks into its suffix blocks. With speculative decoding (MTP/EAGLE, which a
prefill instance often runs without) a Mamba list also ends with one slot per
speculative token after the state slot, so the two sides' lists end
differently. Patched (vllm#42554's worker part, and upstream's later
`get_exchange_clipped_blocks`), each side clips its Mamba lists to its state
slot before they are exchanged, the worker pairs SSM and full-attention lists
from the end, and full attention reads only the uncomputed suffix: the decode
side's state slot reads the prefill side's, whatever either side's
speculative slots. The parts are real (see `nixl_sides.py`).
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import MakeScheduler, MakeVllmConfig
from hybrid_scheduler import (
    BLOCK_SIZE,
    cache_prefix_without_recurrent_state,
    hybrid_kv_cache_config,
    start_scheduler,
)
from nixl_sides import (
    decode_request,
    nixl_config,
    nixl_worker,
    prefill_side_block_ids,
    prefill_side_sent_block_ids,
    prompt,
)
from vllm.utils.hashing import sha256
from vllm.utils.math_utils import cdiv
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler

PROMPT_BLOCKS = 7


@pytest.fixture(autouse=True)
def _fixed_block_hash_seed() -> None:
    init_none_hash(sha256)


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
    asynchronous load, without its local-hit lookup (on 0.22.1 that lookup
    drops a full-attention hit the recurrent group does not share; the
    scheduler side is proven in `test_nixl_pd_decode_hybrid_hit.py`)."""
    manager = scheduler.kv_cache_manager
    connector: Any = scheduler.connector
    block_size = scheduler.block_size
    cache_prefix_without_recurrent_state(
        manager, prompt(num_cached_blocks * block_size)
    )
    request = decode_request(PROMPT_BLOCKS * block_size, remote_block_ids, "decode")
    hit = [
        manager.block_pool.get_cached_block(block_hash, [0])[0]
        for block_hash in request.block_hashes[:num_cached_blocks]
    ]
    num_local = num_cached_blocks * block_size
    num_external, load_async = connector.get_num_new_matched_tokens(request, num_local)
    assert load_async and num_external == request.num_tokens - 1 - num_local
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


def pair(
    local: tuple[list[int], ...],
    remote: tuple[list[int], ...],
    physical_blocks_per_logical: int = 1,
) -> tuple[list[list[int]], list[list[int]]]:
    """What the worker reads (remote) into what (local), per group."""
    paired_local, paired_remote = nixl_worker(
        physical_blocks_per_logical
    )._apply_prefix_caching(
        [list(ids) for ids in local],
        [list(ids) for ids in remote],
        physical_blocks_per_logical,
    )
    return [list(ids) for ids in paired_local], [list(ids) for ids in paired_remote]


def speculative_sides(
    make_vllm_config: MakeVllmConfig,
    prefill_speculative_blocks: int,
    decode_speculative_blocks: int,
) -> tuple[tuple[list[int], ...], tuple[list[int], ...], int, int]:
    """Both sides of a P/D transfer of the prompt, each instance speculating
    with its own number of speculative blocks (vLLM's
    `num_speculative_tokens` for MTP/EAGLE): what the prefill side sends and
    what the decode side hands its worker, and the Mamba block each side
    keeps the request's state in. The prefill side writes the state of the
    tokens it computed into block `cdiv(computed, block_size) - 1` of the
    request (`curr_state_idx`, vllm/v1/worker/mamba_utils.py:673-688 in
    0.22.1); the decode side starts its first step from block
    `(loaded - 1) // block_size` (`prev_state_idx`, :666-670), the block the
    transfer must fill. Returns remote, local, prefill state, decode state."""

    def scheduler(num_speculative_blocks: int) -> Scheduler:
        return start_scheduler(
            make_vllm_config(nixl_config(), mamba_cache_mode="align"),
            hybrid_kv_cache_config(num_speculative_blocks=num_speculative_blocks),
        )

    num_tokens = PROMPT_BLOCKS * BLOCK_SIZE
    # NixlConnector's prefill side computes all but the last prompt token and
    # the decode side loads those.
    computed = num_tokens - 1
    prefill = scheduler(prefill_speculative_blocks)
    remote = prefill_side_sent_block_ids(prefill, num_tokens)
    prefill_mamba = prefill.kv_cache_manager.get_block_ids("prefill")[1]
    decode = scheduler(decode_speculative_blocks)
    local = decode_side_block_ids(decode, remote)
    decode_mamba = decode.kv_cache_manager.get_block_ids("decode")[1]
    return (
        remote,
        local,
        prefill_mamba[cdiv(computed, BLOCK_SIZE) - 1],
        decode_mamba[(computed - 1) // BLOCK_SIZE],
    )


def test_align_mode_transfer_pairs_the_state_slot(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """Nothing cached on the decode side: every full-attention block pairs
    with its remote one, and the one local state slot with the remote
    list's last (upstream 0.22.1 asserts the SSM lists equally long)."""
    remote = prefill_side_block_ids(
        make_hybrid_scheduler(nixl_config()), PROMPT_BLOCKS * block_size
    )
    local = decode_side_block_ids(make_hybrid_scheduler(nixl_config()), remote)
    assert remote[1][:-1] == [0] * (len(remote[1]) - 1), "align-mode null padding"

    assert pair(local, remote) == (
        [local[0], local[1]],
        [remote[0], remote[1][-1:]],
    )


def test_partial_local_hit_reads_only_the_uncomputed_suffix(
    make_hybrid_scheduler: MakeScheduler, block_size: int
) -> None:
    """The decode side caches the prompt's first 4 full-attention blocks and
    allocated only the rest: those pair with the prefill side's last blocks,
    not its first ones (upstream 0.22.1 asserts, and its front-trim would
    read prefill blocks 0.. into the decode side's suffix blocks)."""
    cached = 4
    remote = prefill_side_block_ids(
        make_hybrid_scheduler(nixl_config()), PROMPT_BLOCKS * block_size
    )
    local = decode_side_block_ids(
        make_hybrid_scheduler(nixl_config()), remote, num_cached_blocks=cached
    )
    assert len(local[0]) == PROMPT_BLOCKS - cached

    assert pair(local, remote) == (
        [local[0], local[1]],
        [remote[0][cached:], remote[1][-1:]],
    )


@pytest.mark.parametrize(
    ("prefill_speculative_blocks", "decode_speculative_blocks"),
    [(0, 1), (1, 0)],
    ids=["decode-speculates", "prefill-speculates"],
)
def test_speculating_side_pairs_the_state_blocks(
    make_vllm_config: MakeVllmConfig,
    prefill_speculative_blocks: int,
    decode_speculative_blocks: int,
) -> None:
    """One instance speculates (MTP/EAGLE, one speculative token) and the
    other does not; a decode instance that speculates behind prefill
    instances that do not is a common layout. A Mamba group holds one block
    per speculative token after the request's state block, so the two sides'
    lists end differently: the decode side's state block must read the
    prefill side's state block (and nothing else). Pairing unclipped lists
    from the end (this backport up to 0.22.1's revision 3) reads the prefill
    side's null padding
    into the decode side's state block (local `[8, 9]`, remote
    `[0, 0, 0, 0, 0, 0, 8]`), or its never-written speculative block (local
    `[8]`, remote `[..., 8, 9]`); upstream 0.22.1 asserts the SSM lists
    equally long."""
    remote, local, prefill_state, decode_state = speculative_sides(
        make_vllm_config, prefill_speculative_blocks, decode_speculative_blocks
    )

    assert pair(local, remote) == (
        [local[0], [decode_state]],
        [remote[0], [prefill_state]],
    )


def test_equally_speculating_sides_pair_the_state_blocks(
    make_vllm_config: MakeVllmConfig,
) -> None:
    """Scope: both instances speculate alike; the decode side's state block
    still reads the prefill side's (revision 3 paired both sides' state and
    speculative blocks from the end; now the state block is read alone, the
    speculative ones being written before they are read)."""
    remote, local, prefill_state, decode_state = speculative_sides(
        make_vllm_config, prefill_speculative_blocks=1, decode_speculative_blocks=1
    )
    paired_local, paired_remote = pair(local, remote)

    paired = dict(zip(paired_local[1], paired_remote[1], strict=True))
    assert paired[decode_state] == prefill_state


def test_heterogeneous_kernel_blocks_keep_upstream_pairing() -> None:
    """Scope: when the two sides map a logical block to different numbers of
    kernel blocks (heterogeneous TP), full attention keeps upstream's
    front-trim to the shorter list (vllm's own case: 12 local kernel blocks
    at 6 per logical block, 10 remote at 10)."""
    paired_local, paired_remote = nixl_worker(6)._apply_prefix_caching(
        [list(range(12)), [42]], [list(range(10)), [42]], 10
    )

    assert paired_local == [list(range(10)), [42]]
    assert paired_remote == [list(range(10)), [42]]
