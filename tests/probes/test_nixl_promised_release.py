"""Probe: no decode server but the promised reader releases the blocks the
prefill side promised to hold for that reader's read.

The read confirmation's "held" answer before a read promises the asking
decode request to hold the blocks a while, whatever else notifies the
prefill side: its read, completed within the promise, is used without
asking again. The prefill side's worker frees a request's blocks once as
many notifications arrived as the readers said to expect, whoever sent them
(0.32.0: nixl/pull_worker.py:865-897; 0.22.1: nixl/worker.py:1792-1845). A
decode server that does not ask (upstream's, a revision of the series before
the read confirmation, or one whose router dropped remote_confirms_reads)
reads at once and notifies: when it reads a reference another decode server
was promised (a router's retry), its notification released the blocks under
the promised read, which then returned whatever they held by then, with HTTP
200. Patched, the decode side names the reader in each notification of a
request whose prefill side reads names (remote_reads_question 3), the
prefill side's worker says whose notifications released a request, and its
scheduler keeps blocks released by any other while the promise runs, freeing
them once it ended.

The parts are the read confirmation probes' (`test_nixl_read_confirmation`):
the prefill side is a real `Scheduler` with NixlConnector and its listener
on 127.0.0.1, the decode side a real scheduler asking it. The prefill side's
worker is NIXL's pull worker built without `__init__`, as those probes build
the decode side's, its real `get_transfer_results` (0.22.1: `get_finished`)
taking the notifications; the stand-in is its NIXL agent, which hands it the
notifications a decode worker sent.
"""

from __future__ import annotations

import importlib
import queue
from collections import defaultdict
from typing import Any

import test_nixl_read_confirmation as confirmation
from conftest import MakeScheduler
from nixl_sides import nixl_config, prefill_side_finished
from test_nixl_read_confirmation import (
    DECODE_REQUEST,
    NUM_TOKENS,
    _DoneReads,
    decode_requests,
    decode_worker,
    promised_reader,
    read_completed,
    reader_of,
    wait_until_promised,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker import (
    NixlConnectorWorker,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

# The read confirmation probes' fixtures: the prefill side's scheduler with
# its listener serving on 127.0.0.1, and the block hash seed.
prefill = confirmation.prefill
_fixed_block_hash_seed = confirmation._fixed_block_hash_seed

FAR_FUTURE_S = 1e9


class _Notified(_DoneReads):
    """The prefill worker's NIXL agent: it hands over, once, the
    notifications decode workers sent it."""

    def __init__(self, *notifs: bytes) -> None:
        super().__init__()
        self.pending = list(notifs)

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        notifs, self.pending = self.pending, []
        return {"decode-agent": notifs} if notifs else {}


class _OneRank:
    """The transfer topology of a prefill engine of one rank read by decode
    engines of one rank: one notification a reader (0.22.1's worker asks it
    how many to expect)."""

    def tp_ratio(self, remote_tp_size: int) -> int:
        return 1


def prefill_worker(finished: Request, agent: _Notified) -> NixlConnectorWorker:
    """The prefill side's worker holding `finished`'s blocks under their
    lease, as its scheduler's metadata left them, with `agent`."""
    worker = decode_worker("decode-engine", agent)
    worker.engine_id = "prefill-engine"
    worker.transfer_topo = _OneRank()
    worker.world_size = 1
    worker._reqs_to_send = {finished.request_id: FAR_FUTURE_S}
    worker._reqs_to_process = {finished.request_id}
    worker.consumer_notification_counts_by_req = defaultdict(int)
    worker._ready_requests = queue.Queue()
    worker.pcp_rank = 0
    worker.pcp_dcp_sharded = False
    worker.expected_consumer_notifications_by_req = {}
    return worker


def worker_output(worker: NixlConnectorWorker) -> KVConnectorOutput:
    """One step of the prefill side's worker, as the model runner hands it
    to the scheduler: the requests whose sending finished and the worker's
    metadata (0.22.1: `get_finished`)."""
    if hasattr(worker, "get_transfer_results"):
        sending = set(worker.get_transfer_results().finished_sending)
    else:
        sending = set(worker.get_finished()[0])
    meta = getattr(worker, "build_connector_worker_meta", lambda: None)()
    return KVConnectorOutput(finished_sending=sending, kv_connector_worker_meta=meta)


def upstream_notif(finished: Request) -> bytes:
    """The notification upstream's decode worker sends once its read of
    `finished`'s blocks completed, one reader expected."""
    return f"{finished.request_id}:1".encode()


def named_notif(reader: str, finished: Request) -> bytes:
    """That notification naming the decode request that read
    (utils.named_notif)."""
    utils: Any = importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils"
    )
    return utils.named_notif(reader, upstream_notif(finished))


def promised(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> tuple[Request, str | None]:
    """A request the prefill side finished, whose blocks a decode request
    is scheduled to read, and which a build with the read confirmation
    promised to it when it asked before its read: the request, and the
    reader's name (None where a build names no readers)."""
    finished, params = prefill_side_finished(prefill, NUM_TOKENS)
    decode = make_scheduler(nixl_config())
    (reader,) = decode_requests(decode, params)
    assert reader.status == RequestStatus.WAITING_FOR_REMOTE_KVS, (
        "the decode request was not scheduled to read the blocks"
    )
    connector: Any = prefill.connector
    if getattr(connector.connector_scheduler, "_held_for_remote_read", None) is None:
        return finished, None
    name = reader_of(decode, reader.request_id)
    assert wait_until_promised(prefill, finished, name), (
        "the prefill side promised the blocks to no reader"
    )
    return finished, name


def test_no_notification_but_the_readers_frees_blocks_promised_to_it(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """A decode server that does not ask reads a reference the prefill side
    promised to another decode server's request, and notifies. Its
    notification must not free the blocks while the promise runs: the
    promised reader's read may be in flight, and it is used without asking
    again."""
    finished, _ = promised(prefill, make_scheduler)
    worker = prefill_worker(finished, _Notified(upstream_notif(finished)))

    prefill._update_from_kv_xfer_finished(worker_output(worker))

    assert finished.request_id in prefill.requests, (
        f"the prefill side freed the blocks of {finished.request_id!r}, promised "
        "to a decode request's read, on the notification of a decode server "
        "that did not ask"
    )


def test_the_promised_readers_own_notification_frees_the_blocks_at_once(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """The promised reader's notification, which names it, frees the blocks
    at the step that took it in, as upstream frees them on any: an ordinary
    read keeps its blocks no longer than before."""
    finished, reader = promised(prefill, make_scheduler)
    assert reader is not None
    worker = prefill_worker(finished, _Notified(named_notif(reader, finished)))

    prefill._update_from_kv_xfer_finished(worker_output(worker))

    assert finished.request_id not in prefill.requests, (
        "the promised reader's own notification did not free the blocks"
    )


def test_decode_side_names_the_reader_only_for_a_prefill_side_that_reads_names(
    prefill: Scheduler,
) -> None:
    """A decode worker names the decode request in the notifications of a
    request whose prefill side's parameters say it reads names
    (remote_reads_question 3), in its reader's name (utils.reader_name); in
    none for parameters of an earlier revision, which reads them as
    upstream's."""
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    worker = decode_worker(params["remote_engine_id"], _DoneReads())
    names = []
    for question in (params["remote_reads_question"], 2, None):
        read_completed(worker, {**params, "remote_reads_question": question})
        meta = worker._recving_metadata[DECODE_REQUEST]
        names.append(worker._notif_reader(DECODE_REQUEST, meta))

    assert names == [f"{worker.engine_id}/{DECODE_REQUEST}", None, None]


def test_blocks_kept_for_a_promised_reader_are_freed_once_the_promise_ended(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """Blocks another decode server's notification released under the
    promise are freed once it ended: the scheduler names them in its next
    step's metadata, every worker reports them finished again, and the
    scheduler frees them; the engine steps on until then (0.32.0:
    v1/core/sched/scheduler.py:2813-2821, a finished request whose blocks the
    scheduler holds)."""
    finished, _ = promised(prefill, make_scheduler)
    worker = prefill_worker(finished, _Notified(upstream_notif(finished)))
    prefill._update_from_kv_xfer_finished(worker_output(worker))
    assert finished.request_id in prefill.requests
    assert prefill.has_requests(), "the prefill engine would stop stepping"

    promised_reader(prefill, finished).reader_until = 0.0  # the promise ended
    worker.start_load_kv(prefill.schedule().kv_connector_metadata)
    prefill._update_from_kv_xfer_finished(worker_output(worker))

    assert finished.request_id not in prefill.requests, (
        "the blocks kept for the promised reader were not freed once the promise ended"
    )


def test_a_named_notification_reads_back_and_a_malformed_one_reads_whole() -> None:
    """The prefill side reads back the reader a notification names, whatever
    the request ids hold (":" included); one that does not parse (from any
    peer) is read whole, as upstream reads every notification."""
    utils: Any = importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils"
    )
    plain = b"cmpl-1:2"
    named = utils.named_notif("engine/req:7", plain).decode()

    assert utils.named_notif(None, plain) == plain
    assert utils.notif_reader(named) == ("engine/req:7", "cmpl-1:2")
    assert utils.notif_reader("cmpl-1:2") == ("", "cmpl-1:2")
    for malformed in ("RD:x:cmpl-1:2", "RD:99:ab:1", "RD:", "RD:²:a:1"):
        assert utils.notif_reader(malformed) == ("", malformed)


def test_no_other_requests_ranks_free_blocks_promised_to_a_reader(
    prefill: Scheduler, make_scheduler: MakeScheduler
) -> None:
    """With decode context parallelism a rank with nothing to read notifies
    without asking (0.33.0: nixl/pull_worker.py:648-671), in its request's
    name. Two ranks of another decode request (a router's retry), which the
    prefill side expects two notifications from, reach the release count
    under the promised reader's read: the blocks stay held until the promise
    ended."""
    finished, reader = promised(prefill, make_scheduler)
    assert reader is not None
    retry = f"{reader}-retry"
    two = f"{finished.request_id}:2".encode()
    utils: Any = importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils"
    )
    worker = prefill_worker(
        finished,
        _Notified(utils.named_notif(retry, two), utils.named_notif(retry, two)),
    )
    prefill._update_from_kv_xfer_finished(worker_output(worker))
    assert finished.request_id in prefill.requests, (
        "another decode request's two ranks freed the blocks promised to a reader"
    )
