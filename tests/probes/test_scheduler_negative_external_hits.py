"""Probe: a KV connector's negative external hit must read as "no hit".

`KVConnectorBase_V1.get_num_new_matched_tokens` is an extension point for
out-of-tree connectors. Upstream feeds its count straight into the scheduler's
computed-token arithmetic (an async load then trips an assert that kills the
engine), `PrefillStats` and the connector prefix-cache stats, whose values end
up as Prometheus counter increments (which raise on negative amounts). The
patch validates the count at the connector boundary: a negative count is
logged once per connector class and treated as 0, while `None` ("not known
yet") still defers the request.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from conftest import MakeRequest, MakeScheduler
from scheduler_side_connector import SchedulerSideConnector
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus


class NegativeHitConnector(SchedulerSideConnector):
    """A scheduler-side connector that answers a fixed external hit.

    `kv_connector_extra_config` sets the answer (`matched_tokens`,
    `is_async`) and how many times per request it first answers `None`
    (`num_unknown_answers`). It records what the scheduler tells it after
    allocation, to show what the scheduler made of the answer.
    """

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        super().__init__(vllm_config, role, kv_cache_config)
        extra_config = self._kv_transfer_config.kv_connector_extra_config
        self._matched_tokens: int = extra_config["matched_tokens"]
        self._is_async: bool = extra_config["is_async"]
        self._unknown_answers_left: dict[str, int] = {}
        self._num_unknown_answers: int = extra_config.get("num_unknown_answers", 0)
        self.num_external_tokens_allocated: dict[str, int] = {}

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        left = self._unknown_answers_left.setdefault(
            request.request_id, self._num_unknown_answers
        )
        if left > 0:
            self._unknown_answers_left[request.request_id] = left - 1
            return None, False
        return self._matched_tokens, self._is_async

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self.num_external_tokens_allocated[request.request_id] = num_external_tokens


class WarnOnceProbeConnectorA(NegativeHitConnector):
    """Only the warning probe uses this class: warnings are once per process."""


class WarnOnceProbeConnectorB(NegativeHitConnector):
    """A second class, which must get its own warning."""


def _schedule(scheduler: Scheduler) -> SchedulerOutput:
    """One scheduling step; an assert tripping inside it is the engine crash
    this probe is about, so it is reported as such."""
    try:
        return scheduler.schedule()
    except AssertionError as error:
        raise AssertionError(
            f"schedule() crashed on a negative external hit: {error!r}"
        ) from error


def _transfer_config(
    connector_name: str,
    matched_tokens: int,
    *,
    is_async: bool = False,
    num_unknown_answers: int = 0,
) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector=connector_name,
        kv_connector_module_path=__name__,
        kv_role="kv_both",
        kv_connector_extra_config={
            "matched_tokens": matched_tokens,
            "is_async": is_async,
            "num_unknown_answers": num_unknown_answers,
        },
    )


@pytest.mark.parametrize("is_async", [False, True], ids=["sync-load", "async-load"])
def test_negative_external_hit_is_scheduled_as_no_hit(
    make_scheduler: MakeScheduler,
    make_request: MakeRequest,
    block_size: int,
    is_async: bool,
) -> None:
    """The request is prefilled from scratch and every stat sees 0 hits."""
    num_prompt_tokens = 3 * block_size
    scheduler = make_scheduler(
        _transfer_config(
            "NegativeHitConnector",
            -block_size,
            is_async=is_async,
            num_unknown_answers=1,
        )
    )
    connector = scheduler.connector
    assert isinstance(connector, NegativeHitConnector)
    request = make_request("negative-hit", num_prompt_tokens)
    scheduler.add_request(request)

    # `None` keeps its upstream meaning: not known yet, ask again next step.
    output = _schedule(scheduler)
    assert output.num_scheduled_tokens == {}
    assert request.status == RequestStatus.WAITING

    output = _schedule(scheduler)
    assert output.num_scheduled_tokens == {request.request_id: num_prompt_tokens}, (
        "the negative external hit changed how much of the prompt is computed"
    )
    assert [r.num_computed_tokens for r in output.scheduled_new_reqs] == [0]
    assert request.status == RequestStatus.RUNNING
    assert connector.num_external_tokens_allocated == {request.request_id: 0}

    prefill_stats = request.prefill_stats
    assert prefill_stats is not None
    assert prefill_stats.num_external_cached_tokens == 0
    assert prefill_stats.num_computed_tokens == num_prompt_tokens

    scheduler_stats = scheduler.make_stats()
    assert scheduler_stats is not None
    connector_stats = scheduler_stats.connector_prefix_cache_stats
    assert connector_stats is not None
    assert (connector_stats.queries, connector_stats.hits) == (num_prompt_tokens, 0)


def test_negative_external_hit_warns_once_per_connector_class(
    make_scheduler: MakeScheduler,
    make_request: MakeRequest,
    block_size: int,
    vllm_log_records: list[logging.LogRecord],
) -> None:
    """Many negative answers, two schedulers of one class: one warning."""
    connector_names = ["WarnOnceProbeConnectorA", "WarnOnceProbeConnectorB"]
    for connector_name in [*connector_names, connector_names[0]]:
        scheduler = make_scheduler(_transfer_config(connector_name, -block_size))
        for i in range(3):
            scheduler.add_request(make_request(f"{connector_name}-{i}", block_size))
        assert len(_schedule(scheduler).num_scheduled_tokens) == 3

    warnings = [
        record.getMessage()
        for record in vllm_log_records
        if record.levelno == logging.WARNING
        and "negative" in record.getMessage()
        and any(name in record.getMessage() for name in connector_names)
    ]
    for connector_name in connector_names:
        naming_it = [message for message in warnings if connector_name in message]
        assert len(naming_it) == 1, (
            f"expected one warning naming {connector_name}, got {naming_it}"
        )
