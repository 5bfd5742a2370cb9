"""Probe: NIXL's decode side uses KV it pulled only if the prefill side still
held the request's blocks once the read completed.

A NIXL read is one-sided: the decode worker reads the prefill side's blocks
and the prefill side learns of it only from the notification the read
carries. The prefill side frees a finished request's blocks when every
reader notified it, or when its lease ran out (heartbeats renew it only
while the prefill side still holds the request). A read issued after that
(a router's retry of a request that was read already, a request that waited
in a busy decode server's queue past the lease) returns whatever the blocks
hold by then, and upstream's decode worker reports the request received:
its output is another prompt's (0.32.0: pull_worker.py:642-693 on the
prefill side, base_worker.py:2860-2905 on the decode side; 0.22.1:
nixl/worker.py:1792-1845 and :1694-1790). Patched, the
prefill side's scheduler tracks the requests whose blocks it holds and its
handshake listener says which of them are still held; the decode worker asks
once the read completed and fails the request's load when they are not. The
"held" answer before a read promises the asking decode request to hold the
blocks a while, whatever else notifies the prefill side; a read completed
within that time is used without the second question, and no other request,
and no release without a read, is told the blocks are held meanwhile.

The parts are real: the prefill side is a real `Scheduler` with NixlConnector
finishing a request (`nixl_sides.py`), whose blocks it frees through its own
`_update_from_kv_xfer_finished` once it is told the sending finished, and
whose handshake listener runs on 127.0.0.1; the decode side's request
metadata is built by `NixlConnectorMetadata` from the parameters the prefill
side answered with; the decode side is NIXL's pull worker, built without
`__init__` (which needs a NIXL agent) with what `__init__` derives, as
upstream's `test_nixl_heartbeat.py` builds it, and its real
`get_transfer_results` reports the request (0.22.1: the one NIXL worker, its
`get_finished`, a declined read named in its worker metadata, as 0.22.1 has
no failed receives in a step's output). Two stand-ins: the NIXL agent
(`_DoneReads`: every read has completed, as `check_xfer_state` then says),
and the read in flight, left as `_read_blocks` leaves one (its handle in
`_recving_transfers`, its metadata in `_recving_metadata`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import vllm.envs as envs
import zmq
from conftest import MakeScheduler, MakeVllmConfig
from hybrid_scheduler import (
    generation_request,
    single_group_kv_cache_config,
    start_scheduler,
)
from nixl_sides import (
    nixl_config,
    prefill_side_finished,
    prompt,
    received_by_engine,
)
from scheduler_side_connector import StoreChild
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiConnector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (
    metadata as nixl_metadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    NixlConnectorMetadata,
    NixlHandshakePayload,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
    NixlKVConnectorStats,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker import (
    NixlConnectorWorker,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

NUM_TOKENS = 64
DECODE_REQUEST = "decode"
READ_HANDLE = 7
# Steps of the decode worker before the probe gives up waiting for it to
# report the request (its answer takes one round trip on 127.0.0.1).
MAX_STEPS = 200
STEP_S = 0.05
# How long a request's lease has left to run at the prefill side's "held"
# answer, in the probes where it runs out after the answer.
LEASE_LEFT_S = 0.1


class _DoneReads:
    """The decode worker's NIXL agent: every read it posted has completed."""

    def __init__(self) -> None:
        self.notified: list[bytes] = []

    def check_xfer_state(self, handle: int) -> str:
        return "DONE"

    def get_xfer_telemetry(self, handle: int) -> SimpleNamespace:
        """What NIXL's telemetry of a transfer holds (the stats read it)."""
        return SimpleNamespace(
            xferDuration=1, postDuration=1, totalBytes=1, descCount=1
        )

    def release_xfer_handle(self, handle: int) -> None:
        pass

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        return {}

    def send_notif(self, agent_name: str, notif_msg: bytes) -> None:
        self.notified.append(notif_msg)


class _Topology:
    """The transfer topology of a prefill engine like this one (one rank,
    the same block size), for the received request's post-processing."""

    class _Info:
        remote_block_size = 16
        remote_physical_blocks_per_logical = 1

    def get_engine_info(self, engine_id: str) -> _Info:
        return self._Info()

    def block_size_ratio(self, remote_block_size: int) -> int:
        return 1


def nixl_scheduler_module(name: str) -> Any:
    """NIXL's scheduler-side module `name` (0.31.0 on: `pull_scheduler`,
    `base_scheduler`); 0.22.1 has one, `nixl/scheduler.py`."""
    try:
        return importlib.import_module(
            f"vllm.distributed.kv_transfer.kv_connector.v1.nixl.{name}"
        )
    except ModuleNotFoundError:
        return importlib.import_module(
            "vllm.distributed.kv_transfer.kv_connector.v1.nixl.scheduler"
        )


def set_scheduler_constant(
    monkeypatch: pytest.MonkeyPatch, name: str, value: float
) -> None:
    """Set NIXL's scheduler-side constant `name` for one probe, even where a
    build lacks it, so that the probe fails there for the behaviour it names,
    not for the missing name."""
    monkeypatch.setattr(
        nixl_scheduler_module("base_scheduler"), name, value, raising=False
    )


def transfer_results(worker: NixlConnectorWorker) -> tuple[set[str], set[str]]:
    """One step of the decode worker: the requests it reports received, and
    those of them whose load failed or that it declined (0.22.1 has no
    failed receives in a step's output: a declined read is named in the
    worker metadata, which the model runner builds after the step's
    results)."""
    if hasattr(worker, "get_transfer_results"):
        results = worker.get_transfer_results()
        return set(results.finished_recving), set(results.failed_recving)
    _, finished = worker.get_finished()
    meta = getattr(worker, "build_connector_worker_meta", lambda: None)()
    declined = getattr(meta, "declined_recving", set())
    return set(finished), declined & finished


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(autouse=True)
def _fixed_block_hash_seed() -> None:
    init_none_hash(sha256)


def prefill_scheduler(
    make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> Scheduler:
    """A prefill instance's scheduler with NixlConnector whose handshake
    listener will serve on 127.0.0.1 (`listening`)."""
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
    return make_scheduler(nixl_config())


@contextlib.contextmanager
def listening(scheduler: Scheduler) -> Iterator[Scheduler]:
    """`scheduler` with its handshake listener serving, as the engine core
    starts it once its workers sent their handshake metadata; shut down
    after."""
    connector: Any = scheduler.connector
    payload = NixlHandshakePayload(compatibility_hash="probe", agent_metadata_bytes=b"")
    if hasattr(connector, "set_xfer_handshake_metadata_pp_aware"):
        connector.set_xfer_handshake_metadata_pp_aware({(0, 0): payload})
    else:  # 0.22.1: by tensor-parallel rank
        connector.set_xfer_handshake_metadata({0: payload})
    try:
        yield scheduler
    finally:
        connector.shutdown()


@pytest.fixture
def prefill(
    make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Scheduler]:
    """A prefill instance's scheduler with NixlConnector, its handshake
    listener serving on 127.0.0.1."""
    with listening(prefill_scheduler(make_scheduler, monkeypatch)) as scheduler:
        yield scheduler


def decode_worker(
    engine_id: str, agent: _DoneReads, decode: Scheduler | None = None
) -> NixlConnectorWorker:
    """NIXL's pull worker on the decode side, handshaken with `engine_id`,
    with what `__init__` derives for receiving from it; a worker of the
    decode instance whose scheduler is `decode` (its engine id) if given."""
    worker = object.__new__(NixlConnectorWorker)
    worker.engine_id = (
        decode_engine_id(decode) if decode is not None else "decode-engine"
    )
    worker.tp_rank = 0
    worker.transfer_topo = _Topology()
    worker.nixl_wrapper = agent
    worker.xfer_stats = NixlKVConnectorStats()
    worker._remote_agents = {engine_id: {(0, 0): "prefill-agent"}}
    worker._engine_by_address = {("prefill-host", 0): engine_id}
    worker._invalid_engine_backoff = {}
    worker._engine_clock_offset = {engine_id: 0.0}
    worker._engine_last_active = {engine_id: time.perf_counter()}
    worker._remote_registration_generations = {}
    worker._invalid_remote_engines = set()
    worker._failed_remote_engines = set()
    worker._recv_failures = set()
    worker._recving_transfers = {}
    worker._recving_metadata = {}
    worker._pending_recv_notifs = {}
    worker._replicated_pcp_done_sending = set()
    worker._failed_recv_reqs = queue.Queue()
    worker._reqs_to_send = {}
    worker._reqs_to_process = set()
    worker._is_hma_required = False
    worker._invalid_block_ids = queue.Queue()
    worker.use_host_buffer = False
    worker.use_mla = False
    worker.enable_permute_local_kv = False
    worker.enable_heterogeneous_attn_post_process = False
    worker._physical_blocks_per_logical_kv_block = 1
    worker._engine_ttl = 0
    worker._handshake_lock = threading.RLock()
    worker._handshake_futures = {}
    worker._TRANSFER_MODE = "pull"
    return worker


def read_completed(
    worker: NixlConnectorWorker,
    params: dict[str, Any],
    request_id: str = DECODE_REQUEST,
    block_ids: list[int] | None = None,
) -> None:
    """The decode request's read of the prefill side's blocks into
    `block_ids`, posted as `_read_blocks` posts it, has completed."""
    metadata = NixlConnectorMetadata()
    local = (block_ids or [5, 6, 7, 8],)
    # The fields a release's request metadata has, passed by name: 0.22.1 has
    # neither, 0.29.0 no `awaiting_kvs` (a count of parameters took 0.29.0's
    # four for 0.30.0's five).
    fields = {"local_num_computed_blocks": (0,), "awaiting_kvs": True}
    known = inspect.signature(metadata.add_new_req_to_recv).parameters
    metadata.add_new_req_to_recv(
        request_id, local, params, **{k: v for k, v in fields.items() if k in known}
    )
    meta = metadata.reqs_to_recv[request_id]
    meta.local_physical_block_ids = meta.local_block_ids
    worker._recving_metadata[request_id] = meta
    worker._recving_transfers[request_id] = [READ_HANDLE]


def reported(
    worker: NixlConnectorWorker, request_id: str = DECODE_REQUEST
) -> tuple[bool, bool]:
    """Step the decode worker until it reports the request (bounded): whether
    it was received, and whether its load failed."""
    for _ in range(MAX_STEPS):
        finished, failed = transfer_results(worker)
        if request_id in finished:
            return True, request_id in failed
        time.sleep(STEP_S)
    return False, False


def read_reported(
    decode: Scheduler, request: Request, agent: _DoneReads | None = None
) -> tuple[bool, bool]:
    """A worker of the decode instance whose scheduler is `decode` found the
    read of `request`, posted with the parameters the scheduler handed on,
    completed: whether it reported the request received, and whether its
    load failed (`reported`)."""
    params = request.kv_transfer_params or {}
    worker = decode_worker(params["remote_engine_id"], agent or _DoneReads(), decode)
    read_completed(worker, params, request.request_id)
    return reported(worker, request.request_id)


def released(scheduler: Scheduler, request_id: str, reader: str | None = None) -> None:
    """The prefill side frees the request's blocks: its worker reported the
    sending finished, as the scheduler processes a step's output, once the
    notifications of `reader` (a decode request, utils.reader_name, named in
    them as a build that reads names has its worker report:
    NixlWorkerMetadata.released_by) released them; without `reader`, once
    their lease ran out or, after any promise to hold them for a reader
    ended, another read's notification released them. A promise ends before
    the lease, so none runs then: the probe ends it where a build keeps one
    (HeldRead.reader_until); releases under a promise are
    test_nixl_promised_release.py's."""
    connector: Any = scheduler.connector
    held = getattr(connector.connector_scheduler, "_held_for_remote_read", None)
    meta_class = getattr(nixl_metadata, "NixlWorkerMetadata", None)
    worker_meta = None
    if reader is not None and "released_by" in getattr(
        meta_class, "__dataclass_fields__", {}
    ):
        assert meta_class is not None
        worker_meta = meta_class(released_by={request_id: {reader}})
    elif reader is None and held and request_id in held:
        held[request_id].reader_until = 0.0
    scheduler._update_from_kv_xfer_finished(
        KVConnectorOutput(
            finished_sending={request_id}, kv_connector_worker_meta=worker_meta
        )
    )


def test_decode_side_uses_no_kv_the_prefill_side_released(prefill: Scheduler) -> None:
    """The prefill side freed the request's blocks (another read of the same
    request released them, or its lease ran out) before the decode side's
    read completed: the decode side must not use what it read."""
    request, params = prefill_side_finished(prefill, NUM_TOKENS)
    worker = decode_worker(params["remote_engine_id"], _DoneReads())
    released(prefill, request.request_id)
    read_completed(worker, params)

    received, failed = reported(worker)

    assert received, "the decode worker never reported the request"
    assert failed, (
        f"the decode side used the KV it read for request "
        f"{request.request_id!r} after the prefill side had freed its blocks: "
        "they may hold another request's KV by then"
    )


def test_decode_side_uses_kv_the_prefill_side_still_held(
    prefill: Scheduler,
) -> None:
    """The prefill side still holds the request's blocks when the read
    completed: the decode side uses the KV, as upstream."""
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    worker = decode_worker(params["remote_engine_id"], _DoneReads())
    read_completed(worker, params)

    assert reported(worker) == (True, False)


def decode_engine_id(scheduler: Scheduler) -> str:
    """The engine id of the decode instance whose scheduler this is, shared
    by its workers."""
    assert scheduler.vllm_config.kv_transfer_config is not None
    return scheduler.vllm_config.kv_transfer_config.engine_id


def scheduled(
    scheduler: Scheduler, params: dict[str, Any], tries: int = 1
) -> list[RequestStatus]:
    """Where `tries` decode requests carrying the same `params` (as upstream's
    proxy, or a router retrying, hands them on) stand once the decode
    instance's scheduler scheduled them: their KV loading
    (WAITING_FOR_REMOTE_KVS) or their prompt computed here (RUNNING)."""
    return [r.status for r in decode_requests(scheduler, params, tries)]


def leaves_the_queue(scheduler: Scheduler, request: Request) -> None:
    """Step `scheduler` until `request` is no longer WAITING: its read
    scheduled, or its prompt computed here (bounded)."""
    for _ in range(MAX_STEPS):
        scheduler.schedule()
        if request.status != RequestStatus.WAITING:
            return
        time.sleep(STEP_S)


def decode_requests(
    scheduler: Scheduler, params: dict[str, Any], tries: int = 1, first: int = 0
) -> list[Request]:
    """The `tries` decode requests of `scheduled`, numbered from `first`, once
    scheduled, with the parameters their scheduler hands on to its workers.
    Bounded: the scheduler may wait a step or two for the prefill side's
    answer."""
    requests = []
    for attempt in range(first, first + tries):
        request = generation_request(f"{DECODE_REQUEST}-{attempt}", prompt(NUM_TOKENS))
        request.kv_transfer_params = dict(params)
        scheduler.add_request(request)
        requests.append(request)
    for _ in range(MAX_STEPS):
        scheduler.schedule()
        if all(r.status != RequestStatus.WAITING for r in requests):
            break
        time.sleep(STEP_S)
    return requests


def test_decode_side_reads_nothing_the_prefill_side_released(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """A decode request reaches the decode instance after the prefill side
    freed its blocks (it waited in the queue past the lease, or it is a
    router's retry of a request read already): the decode side computes the
    prompt instead of reading them. (A read of released blocks returns
    another request's KV, and on a CPU prefill server that stopped stepping
    it is never served.)"""
    request, params = prefill_side_finished(prefill, NUM_TOKENS)
    released(prefill, request.request_id)
    decode = make_scheduler(nixl_config())

    [status] = scheduled(decode, params)

    assert status == RequestStatus.RUNNING, (
        f"the decode side scheduled a read of request {request.request_id!r} "
        f"({status.name}) after the prefill side had freed its blocks, "
        "instead of computing the prompt itself"
    )


def test_decode_side_reads_what_the_prefill_side_still_holds(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """The prefill side still holds the request's blocks: the decode side
    reads them, as upstream."""
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())

    assert scheduled(decode, params) == [RequestStatus.WAITING_FOR_REMOTE_KVS]


def test_parameters_without_the_key_are_read_as_upstream(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """Parameters without `remote_confirms_reads` (from a prefill server
    without the patch, or through a router that forwards only upstream's
    keys) are read and used as upstream reads and uses them, even after the
    prefill side freed the blocks: nothing asks it."""
    request, params = prefill_side_finished(prefill, NUM_TOKENS)
    released(prefill, request.request_id)
    upstream_keys = {k: v for k, v in params.items() if k != "remote_confirms_reads"}
    worker = decode_worker(params["remote_engine_id"], _DoneReads())
    read_completed(worker, upstream_keys)

    assert scheduled(make_scheduler(nixl_config()), upstream_keys) == [
        RequestStatus.WAITING_FOR_REMOTE_KVS
    ]
    assert reported(worker) == (True, False)


def test_decode_side_reads_a_reference_for_one_request_at_a_time(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """A router retries a request on the same decode instance while the first
    try still waits for its KV, or once its read completed: only the first
    try reads the prefill side's blocks, whose release its notification
    triggers (the prefill side frees them after the one reader it expects);
    the retries compute the prompt."""
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())

    first, retry = decode_requests(decode, params, tries=2)

    statuses = [first.status, retry.status]
    assert statuses == [RequestStatus.WAITING_FOR_REMOTE_KVS, RequestStatus.RUNNING], (
        f"two requests of the decode instance read the blocks of one prefill "
        f"request ({[s.name for s in statuses]}): the first read's notification "
        "frees them, so the other read them after they may have been released"
    )
    decode._update_from_kv_xfer_finished(
        KVConnectorOutput(finished_recving={first.request_id})
    )  # the first try's read completed
    (late,) = decode_requests(decode, params, first=2)
    assert late.status == RequestStatus.RUNNING, (
        f"a retry that reached the decode instance once the first try's read "
        f"completed was scheduled to read the blocks again ({late.status.name}): "
        "that read's notification frees them"
    )


def test_decode_side_sends_no_release_for_a_retry_of_a_request_it_reads(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """A router's retry reaches the decode instance while the first try reads
    the prefill side's blocks, and is aborted before the scheduler looked at
    it (its client went away). The first try's notification releases the
    blocks, so the retry sends no release (the notification a request that
    reads nothing sends): once the prefill side's promise to the first try
    ran out, it could free the blocks under that read, which would then be
    declined and its prompt computed again."""
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())
    (first,) = decode_requests(decode, params)
    assert first.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    retry = generation_request(f"{DECODE_REQUEST}-1", prompt(NUM_TOKENS))
    retry.kv_transfer_params = dict(params)
    decode.add_request(retry)
    decode.finish_requests(retry.request_id, RequestStatus.FINISHED_ABORTED)

    to_recv = decode.schedule().kv_connector_metadata.reqs_to_recv

    assert retry.request_id not in to_recv, (
        f"the decode side sent a release of the blocks of "
        f"{params['remote_request_id']!r} for an aborted retry, while request "
        f"{first.request_id!r} reads them"
    )


def test_decode_side_reads_no_blocks_but_those_sent(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """A reference whose block ids are not those the prefill side sent with
    the request (a router that mangled or mixed up references; the blocks
    may hold another request's KV, or not exist) is not read: the decode
    side computes the prompt."""
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    blocks = params["remote_block_ids"]
    other = {**params, "remote_block_ids": [[b + 1 for b in g] for g in blocks]}
    decode = make_scheduler(nixl_config())

    [status] = scheduled(decode, other)

    assert status == RequestStatus.RUNNING, (
        f"the decode side scheduled a read of blocks {other['remote_block_ids']} "
        f"({status.name}), which the prefill side did not send with request "
        f"{params['remote_request_id']!r} (it sent {blocks})"
    )


def arrived(scheduler: Scheduler, params: dict[str, Any]) -> Request:
    """A decode request carrying `params` added to the decode instance's
    scheduler, once the prefill side answered the question the connector
    asked as it arrived (bounded), before the scheduler looked at it: as a
    request that waited in the queue for a sequence slot."""
    request = generation_request(DECODE_REQUEST, prompt(NUM_TOKENS))
    request.kv_transfer_params = dict(params)
    scheduler.add_request(request)
    connector: Any = scheduler.connector
    # Upstream's connector asks nothing.
    questions = getattr(connector.connector_scheduler, "_held_answers", None) or {}
    if DECODE_REQUEST in questions:
        questions[DECODE_REQUEST].answer.result(timeout=MAX_STEPS * STEP_S)
    return request


def test_decode_side_asks_before_the_scheduler_looks_at_a_request(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """The decode side asks the prefill side about a request's blocks as it
    arrives, so a request that waited in the queue has its answer when the
    scheduler first looks at it, and its read is scheduled in that step, as
    upstream's is, rather than one step later."""
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())
    request = arrived(decode, params)

    decode.schedule()

    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS, (
        f"the decode side's first look at request {request.request_id!r}, "
        f"answered already, left it {request.status.name}: its read waits a "
        "step for an answer it had"
    )


def promised_reader(prefill: Scheduler, finished: Request) -> Any:
    """What the prefill side's listener recorded of the questions about
    `finished`'s blocks: the decode request promised them, and every asker
    told they are held."""
    prefill_side: Any = prefill.connector
    return prefill_side.connector_scheduler._held_for_remote_read[finished.request_id]


def reader_of(scheduler: Scheduler, request_id: str) -> str | None:
    """The name a decode request asks in (utils.reader_name); None where a
    build names no readers (no read confirmation)."""
    utils = importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils"
    )
    if not hasattr(utils, "reader_name"):
        return None
    return utils.reader_name(decode_engine_id(scheduler), request_id)


def wait_until_promised(
    prefill: Scheduler, finished: Request, reader: str | None
) -> bool:
    """Whether the prefill side promised `finished`'s blocks to `reader`
    within the probes' bound."""
    for _ in range(MAX_STEPS):
        if promised_reader(prefill, finished).reader == reader:
            return True
        time.sleep(STEP_S)
    return False


def answered_on_receipt(decode: Scheduler, request_id: str) -> None:
    """Wait (bounded) until the answer to the question asked as the engine
    received `request_id` has reached the decode side. The prefill side's
    listener records its promise before the answer travels back; in a
    server the engine's step outlasts that round trip, but on a busy host
    the scheduler's first attempt could otherwise run in between and find
    the request unanswered (a CI run of 0.31.0 did)."""
    connector: Any = decode.connector
    asked = (connector.connector_scheduler._asked_on_receipt or {})[request_id]
    asked[1].answer.result(timeout=MAX_STEPS * STEP_S)


def test_decode_side_asks_as_the_engine_receives_a_request(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """The engine's input thread has the decode side ask the prefill side
    about a request's blocks as it receives the request, while the
    engine's loop still runs the step it is in, so that the answer is there
    when the scheduler adds the request and first tries it: asked as the
    scheduler added it, the answer came after that attempt for 86-88 % of
    requests on a loaded CPU pair of 0.32.0, and their reads waited a decode
    step (docs/benchmarks/2026-11-28-question-timing.md). The prefill
    side's listener is real, and records the question in the request's
    name as it answers it."""
    finished, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())

    request = received_by_engine(decode, DECODE_REQUEST, params)

    assert wait_until_promised(prefill, finished, reader_of(decode, DECODE_REQUEST)), (
        f"the prefill side was not asked about request {DECODE_REQUEST!r} as "
        "the engine received it: the question waits for the scheduler, whose "
        "first attempt then finds no answer"
    )
    answered_on_receipt(decode, DECODE_REQUEST)
    decode.add_request(request)
    decode.schedule()
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS, (
        f"the decode side's first look at request {DECODE_REQUEST!r}, answered "
        f"on receipt, left it {request.status.name}"
    )


def test_a_retry_received_behind_its_first_try_asks_nothing(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """A router's retry that reaches the decode engine while the first try
    still waits for the engine's loop (both received, neither added) asks
    nothing: the first try claimed the read as it was received, so the
    prefill side's promise goes to it whichever question would have come
    first, the first try reads, and the retry is computed here."""
    finished, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())
    first_id, retry_id = f"{DECODE_REQUEST}-0", f"{DECODE_REQUEST}-1"

    first = received_by_engine(decode, first_id, params)
    retry = received_by_engine(decode, retry_id, params)

    assert wait_until_promised(prefill, finished, reader_of(decode, first_id)), (
        f"the prefill side did not promise the blocks to the first try {first_id!r}"
    )
    answered_on_receipt(decode, first_id)
    decode.add_request(first)
    decode.add_request(retry)
    decode.schedule()
    assert (first.status, retry.status) == (
        RequestStatus.WAITING_FOR_REMOTE_KVS,
        RequestStatus.RUNNING,
    ), "the first try reads, its retry computes its prompt here"
    assert promised_reader(prefill, finished).told_held == {
        reader_of(decode, first_id)
    }, "the retry asked the prefill side about the blocks its first try reads"


def waiting_for_room(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> tuple[Request, Scheduler, Request, Callable[[], None]]:
    """A decode request answered "held" that the decode instance's first
    attempt could not place, its cache full (every free block taken): the
    prefill side's request, the decode scheduler, the decode request, and
    what frees the room."""
    finished, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())
    pool = decode.kv_cache_manager.block_pool
    taken = pool.get_new_blocks(pool.get_num_free_blocks())
    request = arrived(decode, params)
    decode.schedule()
    assert request.status == RequestStatus.WAITING, "the decode cache was full"
    return finished, decode, request, lambda: pool.free_blocks(taken)


def test_decode_side_schedules_a_read_as_soon_as_it_fits(
    prefill: Scheduler, make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode request whose blocks do not fit in the decode cache yet (it
    is full) is scheduled at the first attempt after room frees, on the
    answer it has (while it is younger than HELD_ANSWER_TTL_S, made long
    here), instead of asking again at every attempt, which cost a step
    each."""
    monkeypatch.setattr(
        nixl_scheduler_module("pull_scheduler"), "HELD_ANSWER_TTL_S", 60.0
    )
    _, decode, request, free_room = waiting_for_room(prefill, make_scheduler)

    free_room()
    decode.schedule()

    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS, (
        f"request {request.request_id!r} was not scheduled at the first "
        f"attempt after its blocks fitted ({request.status.name})"
    )


def test_decode_side_asks_again_once_its_answer_is_old(
    prefill: Scheduler, make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A "held" answer older than HELD_ANSWER_TTL_S (made 0 here) is asked
    anew: a request that waited for room while the prefill side released
    the blocks (their lease ran out) is computed, not read."""
    monkeypatch.setattr(
        nixl_scheduler_module("pull_scheduler"), "HELD_ANSWER_TTL_S", 0.0
    )
    finished, decode, request, free_room = waiting_for_room(prefill, make_scheduler)

    released(prefill, finished.request_id)
    free_room()
    leaves_the_queue(decode, request)

    assert request.status == RequestStatus.RUNNING, (
        f"request {request.request_id!r} was scheduled ({request.status.name}) "
        "on an answer older than HELD_ANSWER_TTL_S, after the prefill side "
        "had released its blocks"
    )


def test_decode_side_asks_again_before_using_an_answer_its_request_outwaited(
    prefill: Scheduler, make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode request asked as it arrived and was answered "held", then
    waited in a full decode server's queue past the prefill side's promise
    (5 s), while another decode server read and released the blocks (a
    router's retry there). Used at its first attempt, that answer let the
    request post a read of released blocks: another prompt's KV, or, on a CPU
    prefill server that stopped stepping, a read never served (the request
    hung). Asked anew, the prefill side says the blocks are gone, and the
    request is computed here. The decode scheduler's clock is moved past the
    prefill side's serving window (`StoppedClock`): no wall-clock wait."""
    finished, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())
    request = arrived(decode, params)
    released(prefill, finished.request_id)  # the retry's read released them
    window = getattr(
        nixl_scheduler_module("base_scheduler"), "CONFIRMED_READ_WINDOW_S", 5.0
    )
    clock = StoppedClock(time.monotonic() + window + 0.001)
    monkeypatch.setattr(nixl_scheduler_module("pull_scheduler"), "time", clock)

    leaves_the_queue(decode, request)

    assert request.status == RequestStatus.RUNNING, (
        f"request {request.request_id!r} was scheduled ({request.status.name}) "
        'on a "held" answer it outwaited in the queue, after the prefill side '
        "had released its blocks"
    )


def test_decode_side_asks_again_for_a_read_the_inflight_load_limit_held_back(
    prefill: Scheduler,
    make_vllm_config: MakeVllmConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM 0.34.0 starts a P/D decode request's read only while fewer reads
    than --max-num-inflight-kv-loads are in flight: a request whose "held"
    answer an attempt took up waits at the head of the asynchronous loads'
    queue, looked at again every step, until a load in flight ends
    (v1/core/sched/scheduler.py:1325-1335, `_admits_inflight_kv_load` at
    :2842-2850 there). If it waits past the prefill side's promise while
    another decode server reads and releases the blocks (a router's retry
    there), the answer its first attempt took up must not let it post the
    read: it is asked anew, the prefill side says the blocks are gone, and
    the request is computed here. A load in flight is stood for by an
    aborted one the scheduler still counts (`_aborted_kv_loads`, which
    holds a request whose load was in flight when it was aborted until the
    load ends); the decode scheduler's clock is moved past the promise
    (`StoppedClock`): no wall-clock wait."""
    scheduler_module = importlib.import_module("vllm.v1.core.sched.scheduler")
    if not hasattr(scheduler_module.Scheduler, "_admits_inflight_kv_load"):
        pytest.skip(
            "this vLLM has no limit on asynchronous KV loads in flight "
            "(--max-num-inflight-kv-loads came in 0.34.0)"
        )
    finished, params = prefill_side_finished(prefill, NUM_TOKENS)
    vllm_config = make_vllm_config(nixl_config())
    vllm_config.scheduler_config.max_num_inflight_kv_loads = 1
    decode = start_scheduler(vllm_config, single_group_kv_cache_config())
    decode._aborted_kv_loads.add("a load in flight")
    request = arrived(decode, params)
    decode.schedule()
    assert request in decode.async_kv_waiting, (
        f"request {request.request_id!r} ({request.status.name}) is not held "
        "back by the limit on loads in flight: the probe sets up nothing"
    )
    released(prefill, finished.request_id)  # the retry's read released them
    window = getattr(
        nixl_scheduler_module("base_scheduler"), "CONFIRMED_READ_WINDOW_S", 5.0
    )
    clock = StoppedClock(time.monotonic() + window + 0.001)
    monkeypatch.setattr(nixl_scheduler_module("pull_scheduler"), "time", clock)
    decode._aborted_kv_loads.clear()  # the load in flight ended

    leaves_the_queue(decode, request)

    assert request.status == RequestStatus.RUNNING, (
        f"request {request.request_id!r} was scheduled ({request.status.name}) "
        'on a "held" answer it took up before the limit on loads in flight '
        "held it back past the prefill side's promise, after the prefill side "
        "had released its blocks"
    )


def test_a_question_the_prefill_side_never_answers_is_final(
    prefill: Scheduler, make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A question that got no answer within its timeout (a dead prefill
    server, or one killed before the read) makes the request computed here,
    however long the question took: only a "held" answer its request
    outwaited is asked anew. Asked anew, a question to a silent listener
    outwaits its answer again (its timeout is longer than the age at which
    an answer is asked anew), and the request never starts. Both are made
    short here, in the same order."""
    utils = importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils"
    )
    monkeypatch.setattr(utils, "READS_HELD_TIMEOUT_MS", 100)
    monkeypatch.setattr(
        nixl_scheduler_module("pull_scheduler"),
        "UNUSED_ANSWER_MAX_AGE_S",
        0.05,
        raising=False,
    )
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())
    with silent_listener() as port:
        request = generation_request(DECODE_REQUEST, prompt(NUM_TOKENS))
        request.kv_transfer_params = {**params, "remote_port": port}
        decode.add_request(request)
        leaves_the_queue(decode, request)

    assert request.status == RequestStatus.RUNNING, (
        f"request {request.request_id!r} still {request.status.name}: a question "
        "that got no answer was asked again instead of computing the request"
    )


def test_decode_side_counts_a_request_it_waited_on_once(
    prefill: Scheduler, make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode request the scheduler looked at before the prefill side's
    answer came is counted once in the prefix cache stats, as upstream counts
    a request it schedules at the first look: vLLM 0.22.1 records a lookup at
    every attempt to schedule a request (v1/core/kv_cache_manager.py:226-231),
    so an attempt deferred for the answer would count the prompt twice and
    halve the hit rate users see. The answer is held back here until the
    first attempt was deferred (in `utils`, where the asking threads look
    the question up)."""
    utils = importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils"
    )
    answer_may_go = threading.Event()
    ask = utils.reads_still_held

    def held_back(*args: Any) -> Any:
        answer_may_go.wait(timeout=MAX_STEPS * STEP_S)
        return ask(*args)

    monkeypatch.setattr(utils, "reads_still_held", held_back)
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())
    request = generation_request(DECODE_REQUEST, prompt(NUM_TOKENS))
    request.kv_transfer_params = dict(params)
    decode.add_request(request)
    decode.schedule()
    assert request.status == RequestStatus.WAITING, "the first attempt waited"
    answer_may_go.set()
    leaves_the_queue(decode, request)
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS

    stats = decode.kv_cache_manager.make_prefix_cache_stats()

    assert stats is not None
    assert (stats.requests, stats.queries) == (1, NUM_TOKENS), (
        f"the prefix cache stats count {stats.requests} requests of "
        f"{stats.queries} tokens for one request of {NUM_TOKENS} tokens"
    )


def decode_config(layout: str, **nixl_extra_config: str) -> KVTransferConfig:
    """The decode instance's connector under upstream's default
    kv_load_failure_policy ("fail": a failed load fails the request):
    NixlConnector alone, or as the first child of a MultiConnector whose
    other child (an offloading tier with no hit) loads nothing; with
    `nixl_extra_config` as NixlConnector's extra config."""
    nixl = {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": nixl_extra_config,
    }
    if layout == "NixlConnector":
        return KVTransferConfig(**nixl, kv_load_failure_policy="fail")
    return KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_load_failure_policy="fail",
        kv_connector_extra_config={
            "connectors": [
                nixl,
                {
                    "kv_connector": "StoreChild",
                    "kv_role": "kv_both",
                    "kv_connector_module_path": StoreChild.__module__,
                    "kv_connector_extra_config": {"matched_tokens": 0},
                },
            ]
        },
    )


def worker_output(
    worker: NixlConnectorWorker, request_id: str, layout: str
) -> KVConnectorOutput:
    """Step the decode worker until it reports `request_id` (bounded): the
    step's connector output as the model runner hands it to the scheduler,
    the transfer results and then the worker metadata
    (kv_connector_model_runner_mixin.py:94-104 of 0.32.0), which the real
    MultiConnector wraps for its children in that layout (its other child
    reports none)."""
    for _ in range(MAX_STEPS):
        if hasattr(worker, "get_transfer_results"):
            results = worker.get_transfer_results()
            finished = set(results.finished_recving)
            failed = {"failed_recving": results.failed_recving}
        else:  # 0.22.1: no failed receives in a step's output
            finished, failed = set(worker.get_finished()[1]), {}
        if request_id in finished:
            connector: Any = object.__new__(NixlConnector)
            connector.connector_worker = worker
            if layout == "MultiConnector":
                multi: Any = object.__new__(MultiConnector)
                multi._connectors = [connector, object.__new__(StoreChild)]
                connector = multi
            return KVConnectorOutput(
                finished_recving=finished,
                kv_connector_worker_meta=connector.build_connector_worker_meta(),
                **failed,
            )
        time.sleep(STEP_S)
    pytest.fail(f"the decode worker never reported request {request_id!r}")


def read_after_release(
    prefill: Scheduler, decode: Scheduler, layout: str
) -> tuple[Request | None, int | None]:
    """A decode request whose read completed after the prefill side freed
    its blocks (its lease ran out mid-read), once the decode scheduler took
    the step's output: the request, and how many of its tokens the decode
    instance computes in its next step (None: it finished and is gone)."""
    request, params = prefill_side_finished(prefill, NUM_TOKENS)
    [status] = scheduled(decode, params)
    assert status == RequestStatus.WAITING_FOR_REMOTE_KVS
    read_id = f"{DECODE_REQUEST}-0"
    released(prefill, request.request_id)
    worker = decode_worker(params["remote_engine_id"], _DoneReads())
    read_completed(worker, params, read_id)

    output = worker_output(worker, read_id, layout)
    decode.update_from_output(
        decode.schedule(),
        dataclasses.replace(EMPTY_MODEL_RUNNER_OUTPUT, kv_connector_output=output),
    )
    computed = decode.schedule().num_scheduled_tokens.get(read_id)
    return decode.requests.get(read_id), computed


@pytest.mark.parametrize("layout", ["NixlConnector", "MultiConnector"])
def test_decode_side_recomputes_a_read_it_did_not_use(
    prefill: Scheduler, make_scheduler: MakeScheduler, layout: str
) -> None:
    """The prefill side released the request's blocks while the decode side
    read them (its lease ran out mid-read): the decode side uses nothing it
    read and computes the prompt itself, under upstream's default
    kv_load_failure_policy ("fail") too: nothing failed that an operator
    could act on, and computing the prompt answers correctly, where failing
    answers HTTP 500."""
    decode = make_scheduler(decode_config(layout))

    read, computed = read_after_release(prefill, decode, layout)

    assert read is not None and read.status == RequestStatus.RUNNING, (
        f"the decode side's request whose read it did not use ended "
        f"{read.status.name if read else 'finished and gone'}: it must compute "
        "its prompt, whatever kv_load_failure_policy says"
    )
    assert computed == NUM_TOKENS, (
        f"the decode side computes {computed} of the {NUM_TOKENS} prompt tokens "
        f"of request {read.request_id!r}, whose KV it read after the prefill "
        "side had freed the blocks: it must compute the whole prompt (the KV "
        "it read may be another request's)"
    )


def test_declined_reads_can_follow_the_failure_policy(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """An operator who wants such a request to fail rather than be computed
    (`"declined_reads": "kv_load_failure_policy"` in NixlConnector's extra
    config) gets kv_load_failure_policy's answer: "fail" fails it."""
    decode = make_scheduler(
        decode_config("NixlConnector", declined_reads="kv_load_failure_policy")
    )

    read, _ = read_after_release(prefill, decode, "NixlConnector")

    assert read is None, (
        f"request {read.request_id!r}, whose read was declined under "
        f"kv_load_failure_policy 'fail', ended {read.status.name}"
    )


def test_declined_reads_takes_only_its_two_values(
    make_scheduler: MakeScheduler,
) -> None:
    """A misspelt "declined_reads" is refused when the connector is built,
    naming the key and its values, rather than silently recomputing."""
    with pytest.raises(ValueError, match=r"declined_reads.*recompute"):
        make_scheduler(decode_config("NixlConnector", declined_reads="fail"))


class StoppedClock:
    """`time` as one NIXL module sees it in a probe, its monotonic clock
    standing at `now` until the probe moves it; everything else is the real
    module's. A probe of a deadline sets it there instead of waiting on the
    wall clock, which two busy cores can stretch past any window."""

    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def lease_runs_out_after_the_answer(
    prefill: Scheduler, request_id: str, monkeypatch: pytest.MonkeyPatch
) -> Callable[[], None]:
    """Give the lease of the prefill side's request `request_id` LEASE_LEFT_S
    to run at its "held" answer (asked after this call), which bounds the
    promise made with that answer whatever HELD_FOR_READER_S says; return
    what runs it out: wait that long, then release the blocks as the lease's
    expiry does. (Set even where a build lacks HELD_FOR_READER_S, to fail
    there for the behaviour named.)"""
    set_scheduler_constant(monkeypatch, "HELD_FOR_READER_S", LEASE_LEFT_S)

    def run_out() -> None:
        time.sleep(LEASE_LEFT_S * 1.5)
        released(prefill, request_id)

    return run_out


def test_prefill_side_steps_on_for_a_read_it_confirmed(
    prefill: Scheduler, make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode side reads right after the prefill side said it holds the
    request's blocks. If their lease runs out in between, the prefill engine
    releases them and, holding nothing else, would stop stepping; where the
    NIXL agent has no progress thread (the CPU platform) a read is served
    only while the engine steps, so the read would never be served and the
    decode request would hang. The prefill engine keeps stepping a while
    after it confirmed blocks held (`Scheduler.has_requests`, which the
    engine's loop steps on: v1/engine/core.py:1534-1540 in 0.32.0)."""
    request, params = prefill_side_finished(prefill, NUM_TOKENS)
    assert prefill.has_requests(), "a prefill engine holding blocks steps"
    run_out = lease_runs_out_after_the_answer(prefill, request.request_id, monkeypatch)
    decode = make_scheduler(nixl_config())
    assert scheduled(decode, params) == [RequestStatus.WAITING_FOR_REMOTE_KVS]

    run_out()

    assert prefill.has_requests(), (
        f"the prefill engine stopped stepping once the lease of request "
        f"{request.request_id!r} ran out, right after the decode side was told "
        "its blocks were held: the read the decode side posts next is never "
        "served on the CPU platform, and its request hangs"
    )


def test_prefill_side_stops_stepping_without_a_confirmed_read(
    prefill: Scheduler,
) -> None:
    """Nothing asked the prefill side (upstream's decode side, or nothing
    read the request): once it released the blocks, its engine stops
    stepping, as upstream's does."""
    request, _ = prefill_side_finished(prefill, NUM_TOKENS)
    released(prefill, request.request_id)

    assert not prefill.has_requests()


def test_prefill_side_steps_on_only_for_its_window(
    prefill: Scheduler, make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine steps on for `CONFIRMED_READ_WINDOW_S` after the last
    "held" answer, then stops: an idle prefill server does not spin. The
    prefill scheduler's monotonic clock stands still until the probe moves it
    past the window (`StoppedClock`): no wall-clock window."""
    scheduler_side = nixl_scheduler_module("base_scheduler")
    clock = StoppedClock(time.monotonic())
    monkeypatch.setattr(scheduler_side, "time", clock)
    request, params = prefill_side_finished(prefill, NUM_TOKENS)
    run_out = lease_runs_out_after_the_answer(prefill, request.request_id, monkeypatch)
    scheduled(make_scheduler(nixl_config()), params)
    run_out()
    assert prefill.has_requests()

    clock.now += getattr(scheduler_side, "CONFIRMED_READ_WINDOW_S", 0.0) + 0.001

    assert not prefill.has_requests()


def test_prefill_side_stops_stepping_once_the_read_completed(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """Once the read of the one decode request promised the blocks completed
    and its notification released them, no read of them is pending, and a
    prefill engine holding nothing else stops stepping at once, not
    CONFIRMED_READ_WINDOW_S after the "held" answer nor READ_DONE_WINDOW_S
    after the release: an empty step keeps a core busy, which on a CPU pair
    slowed the decode server (a loaded pair's prefill server used 2.5-2.6
    CPU s per run instead of 3.0 with 0.32.0, `docs/benchmarks`)."""
    request, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())
    (reader,) = decode_requests(decode, params)
    assert read_reported(decode, reader) == (True, False)

    released(prefill, request.request_id, reader_of(decode, reader.request_id))

    assert not prefill.has_requests(), (
        f"the prefill engine still steps for request {request.request_id!r}, "
        "whose one promised read completed and released its blocks"
    )


def test_prefill_side_steps_on_for_a_promised_read_whatever_others_ask(
    prefill: Scheduler, make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second decode server's read of blocks the prefill side promised to
    hold for a first one's request completed first, and its question was
    refused; then the blocks were released within the promise (a decode
    server without the patch notifies without asking; the lease cannot run
    out within it). The first one's read may not be served
    yet, and on a CPU the prefill engine serves it only while it steps: it
    steps on for CONFIRMED_READ_WINDOW_S after the promise, not
    READ_DONE_WINDOW_S (made short here) after the refused question. (Set
    even where a build lacks READ_DONE_WINDOW_S, to fail there for the
    behaviour named.)"""
    set_scheduler_constant(monkeypatch, "READ_DONE_WINDOW_S", 0.2)
    request, params = prefill_side_finished(prefill, NUM_TOKENS)
    first, second = make_scheduler(nixl_config()), make_scheduler(nixl_config())
    decode_requests(first, params)
    (retry,) = decode_requests(second, params)
    read_reported(second, retry)
    # An unpatched reader's notification, within the promise.
    prefill._update_from_kv_xfer_finished(
        KVConnectorOutput(finished_sending={request.request_id})
    )

    time.sleep(0.3)

    assert prefill.has_requests(), (
        f"the prefill engine stopped stepping for request {request.request_id!r} "
        "once another decode server's refused question said its read completed, "
        "though the read promised to the first one may not have been served"
    )


def worker_clock_at(
    monkeypatch: pytest.MonkeyPatch, params: dict[str, Any], offset: float
) -> None:
    """Stop the decode worker's monotonic clock `offset` seconds from the end
    of the promise the prefill side made with `params`' "held" answer (its
    `remote_reads_held_until`, on this host's clock), or from now on a build
    without the promise: the worker then finds every read complete at that
    time, however long the probe's steps took."""
    held_until = params.get("remote_reads_held_until")
    end = held_until[1] if held_until else time.monotonic()
    module = sys.modules[NixlConnectorWorker.__module__]
    monkeypatch.setattr(module, "time", StoppedClock(end + offset))


def test_decode_side_skips_asking_again_only_within_the_prefill_sides_promise(
    prefill: Scheduler, make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the read, the prefill side promises the asking decode request
    to hold the blocks for a while (`HELD_FOR_READER_S`, within their lease),
    whatever else notifies it. A read that completed within that time, by the
    decode side's own clock from its question, saw the blocks: it is used at
    the worker's first step, without a second round trip. A read that
    completed after it is used only once the prefill side confirmed it still
    held the blocks: here it had released them (its lease ran out), and the
    read is not used. The worker's clock is stopped a millisecond before and
    after the promise's end (`worker_clock_at`): no wall-clock window."""
    decode = make_scheduler(nixl_config())
    request, params = prefill_side_finished(prefill, NUM_TOKENS)
    (within,) = decode_requests(decode, params)
    within_params = within.kv_transfer_params or {}
    worker = decode_worker(params["remote_engine_id"], _DoneReads(), decode)
    read_completed(worker, within_params, within.request_id)
    worker_clock_at(monkeypatch, within_params, -0.001)

    assert transfer_results(worker) == ({within.request_id}, set()), (
        "the decode worker did not use at once a read that completed within "
        "the time the prefill side promised to hold its blocks"
    )

    released(prefill, request.request_id, reader_of(decode, within.request_id))
    late, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())
    (after,) = decode_requests(decode, params)
    released(prefill, late.request_id)  # the lease ran out
    worker_clock_at(monkeypatch, after.kv_transfer_params or {}, 0.001)

    received, failed = read_reported(decode, after)
    assert received, "the decode worker never reported the request"
    assert failed, (
        "the decode side used a read that completed after the prefill side's "
        f"promise ran out, and after it released the blocks of {late.request_id!r}"
    )


def test_no_other_decode_instance_releases_blocks_promised_to_a_reader(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """A router retries a request on a second decode server while the first
    one reads it under the prefill side's promise. The second one's read may
    complete first; if it were used, its notification would release the
    blocks while the first one's read, which is used without asking again,
    is in flight. So the second read is not used and releases nothing, and
    the first one's read is used."""
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    first, second = make_scheduler(nixl_config()), make_scheduler(nixl_config())
    (reader,) = decode_requests(first, params)
    (retry,) = decode_requests(second, params)
    retry_agent = _DoneReads()

    received, failed = read_reported(second, retry, retry_agent)

    assert received, "the second decode worker never reported the request"
    assert failed and not retry_agent.notified, (
        "a second decode instance used, and released, the blocks the prefill "
        "side promised to hold for the first one's read"
    )
    assert read_reported(first, reader) == (True, False)


def test_no_other_request_of_the_readers_instance_reads_under_its_promise(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """A router retries a request on the same decode server once the first
    try ended, its read completed, before the prefill side took in the read's
    notification: the retry's question still finds the blocks held. A
    notification counts towards the release whichever request sends it, so
    the promise covers the one decode request it was made to, not its
    instance: the retry's read, which completes after the first read's
    notification released the blocks, is used only once the prefill side
    confirmed it still held them. Here it had released them, and the read is
    not used."""
    request, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())
    (first,) = decode_requests(decode, params)
    # It ended (its read completed, its answer went out), before the prefill
    # side took in its read's notification.
    decode.finish_requests(first.request_id, RequestStatus.FINISHED_ABORTED)
    (retry,) = decode_requests(decode, params, first=1)
    assert retry.status == RequestStatus.WAITING_FOR_REMOTE_KVS, (
        "the retry was not scheduled to read the blocks the prefill side holds"
    )
    # The first read's notification.
    released(prefill, request.request_id, reader_of(decode, first.request_id))

    received, failed = read_reported(decode, retry)

    assert received, "the decode worker never reported the retry"
    assert failed, (
        "a second request of the decode instance used its read of the blocks "
        f"of {request.request_id!r} without asking, under the promise the "
        "prefill side made to the first one, after the first read's "
        "notification released them"
    )


def unread_release_sent(
    worker: NixlConnectorWorker,
    params: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    request_id: str = DECODE_REQUEST,
) -> bool:
    """Whether the decode worker, handed a request with nothing to read (a
    full local hit, or an aborted request: no local blocks), goes on to
    release the prefill side's blocks within a bounded number of steps.
    Stand-in: `_read_blocks_for_req`, which for such a request only sends
    the notification that releases them (0.32.0 pull_worker.py:444-468)."""
    released_for: list[str] = []
    monkeypatch.setattr(
        worker,
        "_read_blocks_for_req",
        lambda req_id, meta: released_for.append(req_id),
    )
    worker._ready_requests = queue.Queue()
    worker.pcp_rank = 0
    worker.pcp_dcp_sharded = False
    metadata = NixlConnectorMetadata()
    metadata.add_new_req_to_recv(request_id, ([],), params)
    worker.start_load_kv(metadata)
    for _ in range(20):
        if released_for:
            break
        transfer_results(worker)
        time.sleep(STEP_S)
        worker.start_load_kv(NixlConnectorMetadata())
    return bool(released_for)


def test_decode_side_releases_unread_blocks_only_when_no_promised_read_may_run(
    prefill: Scheduler, make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode request that reads nothing still notifies the prefill side,
    which then releases the blocks. While the prefill side's promise to
    another decode instance's reader runs, that reader uses its read without
    asking again, so such a release must not come first: it is not sent (the
    reader's notification, or the lease, frees the blocks). With no promise
    pending it is sent, once the prefill side answered; so is the release of
    the request the promise was made to, which then found its whole prompt
    in its own cache (it would otherwise hold the blocks until their
    lease)."""
    request, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode_requests(make_scheduler(nixl_config()), params)
    other = make_scheduler(nixl_config())
    worker = decode_worker(params["remote_engine_id"], _DoneReads(), other)

    assert not unread_release_sent(worker, params, monkeypatch), (
        "a decode instance that read nothing released the blocks the prefill "
        "side promised to hold for another instance's read"
    )

    released(prefill, request.request_id)
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    worker = decode_worker(params["remote_engine_id"], _DoneReads(), other)
    assert unread_release_sent(worker, params, monkeypatch), (
        "a decode instance that read nothing never released the blocks, "
        "though no read of them was promised"
    )

    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    (promised,) = decode_requests(other, params)
    worker = decode_worker(params["remote_engine_id"], _DoneReads(), other)
    assert unread_release_sent(worker, params, monkeypatch, promised.request_id), (
        "the decode request the prefill side promised to hold the blocks for "
        "read nothing and never released them: they stay until their lease"
    )


def test_decode_side_asks_a_listener_over_one_kept_connection() -> None:
    """Questions from one thread to one prefill listener travel over one
    connection kept between them: a connection per question cost a loaded
    CPU pair of 0.32.0 its answer's wait (5.6-5.7 ms at the median against
    1.9-2.5 ms; docs/benchmarks/2026-11-28-question-timing.md). The ROUTER
    socket here stands for the prefill side's handshake listener
    (`_nixl_handshake_listener`), which answers READS_HELD_MSG on one such
    socket and tells its peers apart by their ZMQ identity, one per
    connection."""
    utils = importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils"
    )
    port = free_port()
    context = zmq.Context()
    listener = context.socket(zmq.ROUTER)
    listener.bind(f"tcp://127.0.0.1:{port}")
    listener.setsockopt(zmq.RCVTIMEO, 5000)
    peers: list[bytes] = []

    def answer_twice() -> None:
        for _ in range(2):
            identity, _, _ = listener.recv_multipart()
            peers.append(identity)
            listener.send_multipart((identity, b"", msgspec.msgpack.encode({})))

    answering = threading.Thread(target=answer_twice)
    answering.start()
    try:
        for _ in range(2):
            assert (
                utils.reads_still_held("127.0.0.1", port, [("req", None)], None) == {}
            )
    finally:
        answering.join(timeout=10)
        listener.close(linger=0)
        context.term()
    assert len(peers) == 2
    assert peers[0] == peers[1], (
        "each question to the prefill side's listener opened a connection of its own"
    )


# The question's name on the wire (READS_HELD_MSG), as any peer sends it.
READS_HELD_MSG = b"reads_held_msg"


def listener_answer(params: dict[str, Any], message: bytes) -> Any:
    """Send `message` to the handshake listener the prefill side's
    parameters name, as a decode side asks it (a REQ socket), and return
    its decoded answer; None if none came within 5 s (the decode side's
    own bound, utils.READS_HELD_TIMEOUT_MS)."""
    context = zmq.Context()
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(f"tcp://{params['remote_host']}:{params['remote_port']}")
    try:
        sock.send(message)
        return msgspec.msgpack.decode(sock.recv())
    except zmq.Again:
        return None
    finally:
        sock.close(linger=0)
        context.term()


def question(params: dict[str, Any]) -> bytes:
    """A well-formed question about the blocks the prefill side's
    parameters name, before a read, from no named asker."""
    blocks = [list(group) for group in params["remote_block_ids"]]
    return msgspec.msgpack.encode(
        (READS_HELD_MSG, [(params["remote_request_id"], blocks)], 0)
    )


def test_prefill_listener_answers_on_after_a_question_it_cannot_read(
    prefill: Scheduler,
) -> None:
    """A question the prefill side's listener cannot read (from a peer of
    another revision, or any client that reaches the port) is answered
    with nothing held, and the listener answers the next question: its
    thread raised on it and died, after which no question was answered
    and no handshake taken until the server restarted, so every decode
    request waited out its question and computed its prompt."""
    request, params = prefill_side_finished(prefill, NUM_TOKENS)

    unreadable = listener_answer(params, msgspec.msgpack.encode((READS_HELD_MSG, 7, 0)))
    answer = listener_answer(params, question(params))

    assert unreadable == {}, (
        "the prefill side's listener did not answer a question it could not read"
    )
    assert answer is not None and params["remote_request_id"] in answer, (
        f"after a question it could not read, the prefill side's listener "
        f"answered {answer!r} about request {request.request_id!r}, whose "
        "blocks it holds (None: it answers no more)"
    )


class _EndedMeanwhile(dict):  # type: ignore[type-arg]
    """The prefill side's stepping windows (`_reads_to_serve`), as its
    listener's thread sees them while the scheduler's thread ends them: each
    window the listener lists is ended (popped, as update_connector_output
    pops one when the promised reader's notifications release the blocks)
    before the listener goes on."""

    def items(self) -> Any:
        listed = list(super().items())
        for req_id, _ in listed:
            self.pop(req_id, None)
        return listed


def test_prefill_listener_survives_the_scheduler_ending_a_read_window(
    make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener ends the stepping windows that ran out as it answers a
    question; the scheduler's thread ends one as the promised reader's
    notifications release the blocks. When the scheduler ended a window
    the listener was about to end, the listener raised KeyError and died
    (no answer, no handshake after it): it must answer that question, and
    the next, with the blocks it holds."""
    set_scheduler_constant(monkeypatch, "CONFIRMED_READ_WINDOW_S", 0.0)
    scheduler = prefill_scheduler(make_scheduler, monkeypatch)
    prefill_side: Any = scheduler.connector
    prefill_side.connector_scheduler._reads_to_serve = _EndedMeanwhile()
    with listening(scheduler) as prefill:
        request, params = prefill_side_finished(prefill, NUM_TOKENS)

        answers = [listener_answer(params, question(params)) for _ in range(2)]

        for answer in answers:
            assert answer is not None and params["remote_request_id"] in answer, (
                f"the prefill side's listener answered {answers!r} about "
                f"request {request.request_id!r}, whose blocks it holds, while "
                "the scheduler ended the read windows it was ending (None: no "
                "answer)"
            )


# Questions sent to the silent listener: twice the asking threads one pool
# for every listener had (4), so that they held up every other question.
SILENT_QUESTIONS = 8


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """The port of a prefill listener that takes questions and never
    answers, as a hung or partitioned prefill server's does until each
    question's 5 s run out."""
    port = free_port()
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{port}")
    try:
        yield port
    finally:
        sock.close(linger=0)
        context.term()


def test_a_silent_prefill_listener_holds_up_no_other_read(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """A decode instance asks each prefill instance about its blocks before
    it reads them. Questions to a prefill listener that never answers wait
    out their 5 s; with one pool of asking threads for every listener, a few
    of them held up the questions to every live prefill instance, and a
    decode server with one dead prefill server among several queued all its
    requests behind them. A request to a live prefill instance is scheduled
    for its read while those to the silent one still wait."""
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())
    with silent_listener() as port:
        silent = []
        for number in range(SILENT_QUESTIONS):
            request = generation_request(f"silent-{number}", prompt(NUM_TOKENS))
            request.kv_transfer_params = {
                **params,
                "remote_port": port,
                "remote_request_id": f"gone-{number}",
            }
            decode.add_request(request)
            silent.append(request)
        live = generation_request("live", prompt(NUM_TOKENS))
        live.kv_transfer_params = dict(params)
        decode.add_request(live)
        for _ in range(MAX_STEPS):
            decode.schedule()
            waited_out = [r for r in silent if r.status != RequestStatus.WAITING]
            if live.status != RequestStatus.WAITING or waited_out:
                break
            time.sleep(STEP_S)

    assert live.status == RequestStatus.WAITING_FOR_REMOTE_KVS and not waited_out, (
        f"the read of a request to a live prefill instance ({live.status.name}) "
        f"waited behind questions to a silent one ({len(waited_out)} of "
        f"{SILENT_QUESTIONS} waited out their 5 s first)"
    )


def test_a_silent_prefill_listener_holds_up_no_other_confirmation(
    prefill: Scheduler,
) -> None:
    """Once a read completed, the decode worker asks the prefill instance
    whether it still held the blocks (outside its promise). Its questions to
    a listener that never answers held up, with one pool for every listener,
    the confirmation of reads from live prefill instances; the worker reports
    a live one's read, completed after them, while those from the silent one
    still wait."""
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    worker = decode_worker(params["remote_engine_id"], _DoneReads())
    with silent_listener() as port:
        for number in range(SILENT_QUESTIONS):
            silent = {
                **params,
                "remote_port": port,
                "remote_request_id": f"gone-{number}",
            }
            read_completed(worker, silent, f"silent-{number}")
        finished = transfer_results(worker)[0]  # asks about the silent reads
        read_completed(worker, params, "live")
        for _ in range(MAX_STEPS):
            finished |= transfer_results(worker)[0]
            if finished:
                break
            time.sleep(STEP_S)

    assert finished == {"live"}, (
        "the decode worker reported "
        f"{sorted(finished) or 'nothing'} first: the confirmation of a read "
        "from a live prefill instance waited behind questions to a silent one"
    )
