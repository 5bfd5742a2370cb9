"""Probe: NIXL's decode side does not read KV blocks after the prefill side's
lease on them ran out.

The prefill side keeps a finished request's blocks for `kv_lease_duration`
(30 s by default), renewed by the decode side's heartbeats, and then
releases them (`_reap_expired_send_leases`, nixl/base_worker.py:3014-3040 in
0.32.0). Upstream the decode side checks no deadline for them: a NIXL read is
one-sided, so a read issued after the lease ran out takes whatever the
released blocks hold by then, the prefill side only logs "Potentially
invalid KV blocks" (nixl/pull_worker.py:662-672), and the request answers
with HTTP 200 (seen under load: README, "Under load"). Only the turn-2
readback of bidirectional transfer declines an expired read
(`_is_turn2_read_expired`, :125-134). Patched, the prefill side exports its
deadline with the request's transfer parameters, the decode worker moves it
on with every heartbeat it delivered for the request, and declines a read
within the safety margin of it: the request's load fails and
`kv_load_failure_policy` decides (recompute, or fail with an error).

The parts are real: the prefill side is NixlConnector's scheduler side
finishing a request (`nixl_sides.py`), the decode side's request metadata is
built by `NixlConnectorMetadata` from those parameters as the proxy hands
them on, and the decode side is NIXL's pull worker, built without `__init__`
(which needs a NIXL agent) with the attributes `__init__` derives, as
upstream's `test_nixl_heartbeat.py` builds it. Two stand-ins: the NIXL agent
(`_NixlAgent`: its `send_notif` records a heartbeat, or refuses one as an
unreachable agent does), and the read itself, which the worker would plan
through its TP mapping; `_PlannedRead` marks that step reached. Time is moved
by replacing `time.perf_counter`, the clock both sides stamp leases with.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from conftest import MakeScheduler
from nixl_sides import nixl_config, prefill_side_transfer_params
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    HeartbeatInfo,
    NixlConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
    NixlKVConnectorStats,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker import (
    NixlConnectorWorker,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash

NUM_TOKENS = 64
# vLLM's defaults: kv_lease_duration 30 s, renewed by 2/3 of it.
LEASE_S = 30
RENEWAL_S = LEASE_S * 2 // 3


class _PlannedRead(Exception):
    """The worker went on to plan the NIXL read of the request."""


class _TpMappings(dict):
    def __getitem__(self, engine_id: str) -> Any:
        raise _PlannedRead(engine_id)


class _NixlAgent:
    """The NIXL agent's notification sender: records what it sends, or
    raises as `send_notif` does for an agent it cannot reach."""

    def __init__(self, reachable: bool = True) -> None:
        self.reachable = reachable
        self.sent: list[bytes] = []

    def send_notif(self, agent_name: str, notif_msg: bytes) -> None:
        if not self.reachable:
            raise RuntimeError(f"cannot reach {agent_name}")
        self.sent.append(notif_msg)


class _Clock:
    """`time.perf_counter`, moved on by hand."""

    def __init__(self) -> None:
        self.now = time.perf_counter()

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _fixed_block_hash_seed() -> None:
    init_none_hash(sha256)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock


def decode_worker(
    engine_id: str, agent: _NixlAgent, renewal_s: int = RENEWAL_S
) -> NixlConnectorWorker:
    """NIXL's pull worker on the decode side, handshaken with `engine_id`
    (clocks in step), with what `__init__` derives for reading from it."""
    worker = object.__new__(NixlConnectorWorker)
    worker.transfer_topo = object()
    worker.tp_mappings = _TpMappings()
    worker.nixl_wrapper = agent
    worker.xfer_stats = NixlKVConnectorStats()
    worker._remote_agents = {engine_id: {(0, 0): "prefill-agent"}}
    worker._engine_clock_offset = {engine_id: 0.0}
    worker._remote_registration_generations = {}
    worker._invalid_remote_engines = set()
    worker._engine_last_active = {}
    worker._recv_failures = set()
    worker._recving_transfers = {}
    worker._bidirectional_kv_xfer_enabled = False
    worker._lease_extension = renewal_s
    worker._engine_ttl = 0
    worker._handshake_lock = threading.Lock()
    worker._handshake_futures = {}
    worker._hb_handshake_notif_only = False
    return worker


def read_outcome(worker: NixlConnectorWorker, params: dict[str, Any]) -> str:
    """What the decode worker does with the request's read now: "read" or
    "declined" (the request's load failed)."""
    metadata = NixlConnectorMetadata()
    metadata.add_new_req_to_recv("decode", ([5, 6, 7, 8],), params)
    meta = metadata.reqs_to_recv["decode"]
    meta.local_physical_block_ids = meta.local_block_ids
    try:
        worker._read_blocks_for_req("decode", meta)
    except _PlannedRead:
        return "read"
    assert worker._recv_failures == {"decode"}, "neither read nor failed"
    return "declined"


def heartbeat(worker: NixlConnectorWorker, params: dict[str, Any]) -> None:
    """The decode worker's heartbeat for the request, as its scheduler side
    packs one into the step's metadata."""
    metadata = NixlConnectorMetadata()
    metadata.heartbeat_by_engine[params["remote_engine_id"]] = HeartbeatInfo(
        req_ids={params["remote_request_id"]},
        host=params["remote_host"],
        port=params["remote_port"],
        tp_size=params["tp_size"],
    )
    worker._send_heartbeats(metadata)


@pytest.fixture
def finished_prefill(make_scheduler: MakeScheduler, clock: _Clock) -> dict[str, Any]:
    """The transfer parameters of a request the prefill side finished now."""
    return prefill_side_transfer_params(make_scheduler(nixl_config()), NUM_TOKENS)


def test_decode_side_declines_a_read_after_the_lease(
    finished_prefill: dict[str, Any], clock: _Clock
) -> None:
    """No heartbeat reached the prefill side and its 30 s lease ran out one
    second ago: the decode side must not read the released blocks."""
    worker = decode_worker(finished_prefill["remote_engine_id"], _NixlAgent())
    clock.now += LEASE_S + 1

    assert read_outcome(worker, finished_prefill) == "declined", (
        f"the decode side read the blocks of request "
        f"{finished_prefill['remote_request_id']!r} {LEASE_S + 1} s after the "
        f"prefill side finished it, past its {LEASE_S} s lease, with no "
        "heartbeat renewing it: those blocks may be released and reused"
    )


def test_undelivered_heartbeat_does_not_renew_the_lease(
    finished_prefill: dict[str, Any], clock: _Clock
) -> None:
    """The decode side's heartbeat at 25 s could not be sent, so the lease
    still ends at 30 s: a read at 31 s is declined."""
    agent = _NixlAgent(reachable=False)
    worker = decode_worker(finished_prefill["remote_engine_id"], agent)
    clock.now += LEASE_S - 5
    heartbeat(worker, finished_prefill)
    clock.now += 6

    assert read_outcome(worker, finished_prefill) == "declined", (
        "the decode side read blocks whose lease ran out at 30 s; its one "
        "heartbeat, at 25 s, could not be sent and renewed nothing"
    )


def test_delivered_heartbeat_keeps_the_read(
    finished_prefill: dict[str, Any], clock: _Clock
) -> None:
    """A heartbeat sent at 25 s renews the lease to at least 45 s (the
    prefill side extends it from when it reads the heartbeat): a read at 31 s
    goes ahead, as upstream."""
    agent = _NixlAgent()
    worker = decode_worker(finished_prefill["remote_engine_id"], agent)
    clock.now += LEASE_S - 5
    heartbeat(worker, finished_prefill)
    clock.now += 6

    assert agent.sent == [f"HB:{finished_prefill['remote_request_id']}".encode()]
    assert read_outcome(worker, finished_prefill) == "read"


def test_read_within_the_lease_goes_ahead(
    finished_prefill: dict[str, Any], clock: _Clock
) -> None:
    """Ten seconds into the lease the read goes ahead, as upstream."""
    worker = decode_worker(finished_prefill["remote_engine_id"], _NixlAgent())
    clock.now += 10

    assert read_outcome(worker, finished_prefill) == "read"


def test_read_without_a_deadline_goes_ahead(
    finished_prefill: dict[str, Any], clock: _Clock
) -> None:
    """Parameters without the prefill side's deadline (an unpatched prefill
    server, or a router that forwards only upstream's keys) are read as
    upstream reads them, however late."""
    upstream_keys = {
        key: value
        for key, value in finished_prefill.items()
        if key != "remote_lease_expiry_time"
    }
    worker = decode_worker(finished_prefill["remote_engine_id"], _NixlAgent())
    clock.now += LEASE_S + 1

    assert read_outcome(worker, upstream_keys) == "read"


def test_short_lease_renewed_in_time_goes_ahead(
    make_scheduler: MakeScheduler, clock: _Clock
) -> None:
    """With `kv_lease_duration` 6 on both servers (renewed by 4 s, heartbeats
    every second), a read 1 s after a heartbeat sent at 1 s goes ahead, as
    upstream: the lease's 4 s left are more than a short lease's margin (a
    quarter of the renewal, 1 s; turn-2's fixed 5 s would decline it)."""
    short = KVTransferConfig(
        kv_connector="NixlConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"kv_lease_duration": 6},
    )
    params = prefill_side_transfer_params(make_scheduler(short), NUM_TOKENS)
    worker = decode_worker(params["remote_engine_id"], _NixlAgent(), renewal_s=4)
    clock.now += 1
    heartbeat(worker, params)
    clock.now += 1

    assert read_outcome(worker, params) == "read"
