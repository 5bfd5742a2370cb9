"""Both sides of a NIXL P/D pair for the probes, from real vLLM parts.

The prefill side's block ids come from a real KV cache manager that computed
the prompt; the decode side is a real `Scheduler` with NixlConnector's
scheduler side (which needs no NIXL agent); the worker that pairs the two
block lists is NIXL's real `NixlConnectorWorker`, built without `__init__`
(which needs a NIXL agent and registered device KV caches) with what
`__init__` derives from the KV cache config, as upstream's own tests of its
block pairing build it.
"""

from __future__ import annotations

from typing import Any

from hybrid_scheduler import generation_request, hybrid_kv_cache_config
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker import (
    NixlConnectorWorker,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec
from vllm.v1.request import Request, RequestStatus


def nixl_config() -> KVTransferConfig:
    """NixlConnector on an instance that serves both P/D roles."""
    return KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both")


def store_tier(store_hit: int) -> dict[str, Any]:
    """An offloading tier's MultiConnector entry (`StoreChild`), with a hit
    beyond the cached prefix."""
    return {
        "kv_connector": "StoreChild",
        "kv_role": "kv_both",
        "kv_connector_module_path": "scheduler_side_connector",
        "kv_connector_extra_config": {"matched_tokens": store_hit},
    }


def multi_connector(*children: dict[str, Any]) -> dict[str, Any]:
    """A MultiConnector's KV transfer config (or entry, nested) over `children`."""
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": list(children)},
    }


NIXL_CHILD = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def prompt(num_tokens: int) -> list[int]:
    """The probes' shared prompt, or its first `num_tokens` tokens."""
    return [(5 * i) % 200 + 3 for i in range(num_tokens)]


def prefill_side_block_ids(
    scheduler: Scheduler, num_tokens: int
) -> tuple[list[int], ...]:
    """The block ids a prefill instance sends for a prompt of `num_tokens`:
    it computes all but the last token (NixlConnector truncates a hybrid
    model's prompt on that side) and sends what its KV cache manager holds
    (`NixlConnectorScheduler.request_finished`)."""
    request = generation_request("prefill", prompt(num_tokens)[:-1])
    scheduler.kv_cache_manager.allocate_slots(request, request.num_tokens)
    return scheduler.kv_cache_manager.get_block_ids("prefill")


def prefill_side_finished(
    scheduler: Scheduler, num_tokens: int
) -> tuple[Request, dict[str, Any]]:
    """A prefill instance's request for a prompt of `num_tokens` that
    computed all but the last token and finished, its blocks kept for the
    decode instance, and the `kv_transfer_params` it answers with, which
    upstream's proxy hands the decode instance: what NixlConnector's
    `request_finished_all_groups` returns when `Scheduler` finishes the
    request with the blocks its KV cache manager holds."""
    request = generation_request("prefill", prompt(num_tokens)[:-1])
    request.kv_transfer_params = {"do_remote_decode": True}
    manager = scheduler.kv_cache_manager
    manager.allocate_slots(request, request.num_tokens)
    request.num_computed_tokens = request.num_tokens
    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
    scheduler.requests[request.request_id] = request
    connector: Any = scheduler.connector
    delay_free, params = connector.request_finished_all_groups(
        request, manager.get_block_ids("prefill")
    )
    assert delay_free and params is not None
    return request, params


def prefill_side_transfer_params(
    scheduler: Scheduler, num_tokens: int
) -> dict[str, Any]:
    """The `kv_transfer_params` of `prefill_side_finished`."""
    return prefill_side_finished(scheduler, num_tokens)[1]


def prefill_side_sent_block_ids(
    scheduler: Scheduler, num_tokens: int
) -> tuple[list[int], ...]:
    """The block ids a prefill instance puts in the `remote_block_ids` it
    sends for a prompt of `num_tokens` once it computed all but the last
    token."""
    params = prefill_side_transfer_params(scheduler, num_tokens)
    return tuple(list(ids) for ids in params["remote_block_ids"])


def decode_request(
    num_tokens: int, remote_block_ids: tuple[list[int], ...], request_id: str
) -> Request:
    """A P/D decode request as upstream's proxy hands it to the decode
    instance: NixlConnector pulls its prompt from the prefill instance."""
    request = generation_request(request_id, prompt(num_tokens))
    request.kv_transfer_params = {
        "do_remote_prefill": True,
        "remote_block_ids": [list(ids) for ids in remote_block_ids],
        "remote_engine_id": "prefill-engine",
        "remote_request_id": "prefill",
        "remote_host": "127.0.0.1",
        "remote_port": 1,
        "tp_size": 1,
    }
    return request


def nixl_worker(physical_blocks_per_logical: int = 1) -> NixlConnectorWorker:
    """NIXL's worker for the probes' hybrid KV cache config: a Mamba group
    present, the group spec types, and the kernel blocks per logical block
    (1: the kernel block size is the block size)."""
    worker = object.__new__(NixlConnectorWorker)
    worker.kv_cache_config = hybrid_kv_cache_config()
    worker._has_mamba = True
    worker._group_spec_types = (FullAttentionSpec, MambaSpec)
    worker._physical_blocks_per_logical_kv_block = physical_blocks_per_logical
    return worker
