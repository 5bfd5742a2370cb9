"""Probe: a hybrid model with Mamba prefix caching ("align") admits external hits.

Up to 0.22.x, `Scheduler._mamba_block_aligned_split()` asserts that the KV
connector found no tokens ("External KV connector is not verified yet"), so
the first external hit of a hybrid model in align mode kills the engine core,
and for an asynchronous load (NIXL's decode side) the split also runs with
`num_new_tokens == 0`, which ends the scheduling step instead of letting the
request wait for its KV. The patch (vllm#42554's scheduler part) drops the
assert and skips the split for an asynchronous load.
"""

from __future__ import annotations

from typing import Any

from conftest import MakeRequest, MakeScheduler
from scheduler_side_connector import RecordingHMAChild
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus


class ExternalHitConnector(RecordingHMAChild):
    """Answers a fixed external hit (`matched_tokens`, `is_async` in its
    extra config) for every request, and records what the scheduler allocated
    for it. HMA-capable, as a connector of a hybrid model must be."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        super().__init__(vllm_config, role, kv_cache_config)
        extra_config = self._kv_transfer_config.kv_connector_extra_config
        self._matched_tokens: int = extra_config["matched_tokens"]
        self._is_async: bool = extra_config["is_async"]

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._matched_tokens, self._is_async


def _transfer_config(matched_tokens: int, is_async: bool) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="ExternalHitConnector",
        kv_connector_module_path=__name__,
        kv_role="kv_both",
        kv_connector_extra_config={
            "matched_tokens": matched_tokens,
            "is_async": is_async,
        },
    )


def _schedule(scheduler: Scheduler) -> SchedulerOutput:
    """One step; the assert tripping inside it is the engine-core crash."""
    try:
        return scheduler.schedule()
    except AssertionError as error:
        raise AssertionError(
            f"schedule() crashed on an external hit of a hybrid model: {error!r}"
        ) from error


def test_async_external_hit_waits_for_its_kv(
    make_hybrid_scheduler: MakeScheduler, make_request: MakeRequest, block_size: int
) -> None:
    """A P/D decode-style answer (4 of 6 blocks, asynchronous): the request
    gets its blocks and waits for the transfer."""
    matched = 4 * block_size
    scheduler = make_hybrid_scheduler(_transfer_config(matched, is_async=True))
    scheduler.add_request(make_request("remote", 6 * block_size))
    _schedule(scheduler)

    request = scheduler.requests["remote"]
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    connector = scheduler.connector
    assert isinstance(connector, ExternalHitConnector)
    assert connector.allocated_external_tokens == {"remote": matched}


def test_sync_external_hit_is_computed(
    make_hybrid_scheduler: MakeScheduler, make_request: MakeRequest, block_size: int
) -> None:
    """A synchronous answer of 4 of 6 blocks: the prompt goes on from them,
    in whole blocks (how many per chunk is the release's split rule: 0.22.1
    schedules both remaining blocks, 0.32.0 one)."""
    matched = 4 * block_size
    scheduler = make_hybrid_scheduler(_transfer_config(matched, is_async=False))
    scheduler.add_request(make_request("loaded", 6 * block_size))
    output = _schedule(scheduler)

    assert [r.req_id for r in output.scheduled_new_reqs] == ["loaded"]
    assert output.scheduled_new_reqs[0].num_computed_tokens == matched
    (scheduled,) = output.num_scheduled_tokens.values()
    assert 0 < scheduled <= 2 * block_size and scheduled % block_size == 0
