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

import time
from types import SimpleNamespace
from typing import Any

from hybrid_scheduler import BLOCK_SIZE, generation_request, hybrid_kv_cache_config
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker import (
    NixlConnectorWorker,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.core import EngineCore
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


def received_by_engine(
    scheduler: Scheduler,
    request_id: str,
    params: dict[str, Any],
    num_tokens: int = 64,
) -> Request:
    """A decode request of `num_tokens` carrying `params` as the engine
    core's input thread makes it (`EngineCore.preprocess_add_request`, the
    real method on an object holding only what it reads, `scheduler` the
    engine's), not yet added to the scheduler: as a request waiting for the
    engine's loop. Whatever the method raises, a refusal, is raised."""
    sampling_params = SamplingParams(
        max_tokens=4, extra_args={"kv_transfer_params": dict(params)}
    )
    sampling_params.update_from_generation_config({}, 2)
    engine = SimpleNamespace(
        vllm_config=scheduler.vllm_config,
        mm_receiver_cache=None,
        request_block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
        structured_output_manager=None,
        scheduler=scheduler,
        # 0.34.0 reads it for the frontend's block hashes, which this request
        # does not carry (v1/engine/core.py:1287 there).
        prefix_hash_config=None,
    )
    received = EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=prompt(num_tokens),
        mm_features=None,
        sampling_params=sampling_params,
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )
    request, _ = EngineCore.preprocess_add_request(engine, received)
    return request
