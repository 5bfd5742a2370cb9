"""Probe: the prefill side's handshake listener serves on whatever reaches it,
and the decode side's question cannot stop a listener that does not know it.

The listener is one thread (`_nixl_handshake_listener`) that decodes every
message into a handshake's (GET_META_MSG, pp_rank, tp_rank) (0.22.1:
(GET_META_MSG, tp_rank)) and answers with that rank's metadata. Upstream's
thread raises on a message of another shape, or naming ranks it does not
have (0.33.0: nixl/base_scheduler.py:368 unpacks it, :382 looks the ranks
up; 0.22.1: nixl/scheduler.py:314, :321), and dies: its server takes no
handshake until it restarts, so no new decode server can read from it.
Patched, such a message gets "nothing held" and the listener serves on.

The read confirmation's question goes to the same listener. In the shape
earlier revisions sent, (READS_HELD_MSG, reads, asker), it killed a listener
without the read confirmation (a prefill server rolled back to upstream at
the same address); now it travels inside a handshake's message, which such a
listener answers as a handshake, and the decode side, given a handshake for
an answer, uses nothing it read. The listener here is upstream's own, its
source read from the pinned wheel (`vllm_overlay.testing.pristine`).
"""

from __future__ import annotations

import importlib
import importlib.util
import tempfile
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
import test_nixl_read_confirmation as confirmation
import zmq
from nixl_sides import prefill_side_finished
from test_nixl_read_confirmation import NUM_TOKENS, free_port, listener_answer, question
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_overlay.series.manifest import read_installed_manifest
from vllm_overlay.testing.pristine import pristine_sources

# The read confirmation probes' fixtures: the prefill side's scheduler with
# its listener serving on 127.0.0.1, and the block hash seed.
prefill = confirmation.prefill
_fixed_block_hash_seed = confirmation._fixed_block_hash_seed

GET_META_MSG = b"get_meta_msg"
# 0.22.1's handshake names a tensor-parallel rank only, and its answer is
# the metadata alone; later releases name (pp_rank, tp_rank) and answer with
# the metadata and the listener's clock.
PP_AWARE = hasattr(NixlConnector, "set_xfer_handshake_metadata_pp_aware")
HANDSHAKE = (GET_META_MSG, 0, 0) if PP_AWARE else (GET_META_MSG, 0)
HANDSHAKE_FRAMES = 2 if PP_AWARE else 1
LISTENER_MODULE = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/" + (
    "base_scheduler.py" if PP_AWARE else "scheduler.py"
)
TIMEOUT_MS = 5000


def frames_from(port: int, message: bytes) -> list[bytes] | None:
    """Send `message` to the listener on 127.0.0.1:`port` as a decode side
    does (a REQ socket); the frames of its answer, None if none came within
    5 s."""
    context = zmq.Context()
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    sock.connect(f"tcp://127.0.0.1:{port}")
    try:
        sock.send(message)
        return sock.recv_multipart()
    except zmq.Again:
        return None
    finally:
        sock.close(linger=0)
        context.term()


def test_prefill_listener_serves_on_after_any_message(prefill: Scheduler) -> None:
    """Bytes that are not msgpack, a message of another length and a
    handshake naming ranks the server does not have each get an answer
    ("nothing held"), and a handshake after them gets its metadata."""
    _, params = prefill_side_finished(prefill, NUM_TOKENS)
    port = params["remote_port"]
    unreadable = {
        "not msgpack": b"\xc1",
        "another length": msgspec.msgpack.encode((GET_META_MSG,)),
        "ranks it does not have": msgspec.msgpack.encode(
            (GET_META_MSG, 7, 7) if PP_AWARE else (GET_META_MSG, 7)
        ),
    }

    answers = {name: frames_from(port, message) for name, message in unreadable.items()}
    handshake = frames_from(port, msgspec.msgpack.encode(HANDSHAKE))

    assert handshake is not None and len(handshake) == HANDSHAKE_FRAMES, (
        f"after {', '.join(unreadable)}, the prefill side's listener answered a "
        f"handshake with {handshake!r} (None: it answers no more)"
    )
    nothing_held = [msgspec.msgpack.encode({})]
    assert answers == dict.fromkeys(unreadable, nothing_held), (
        "the prefill side's listener did not answer each message it could not "
        f"read with nothing held: {answers!r}"
    )


def test_prefill_listener_answers_the_question_in_either_shape(
    prefill: Scheduler,
) -> None:
    """The listener answers the question inside a handshake's message, as
    the decode side of this revision asks it, and in the shape earlier
    revisions send."""
    request, params = prefill_side_finished(prefill, NUM_TOKENS)
    shape_1 = msgspec.msgpack.decode(question(params))
    shape_2 = (list(shape_1), 0, 0) if PP_AWARE else (list(shape_1), 0)

    answers = [
        listener_answer(params, question(params)),
        listener_answer(params, msgspec.msgpack.encode(shape_2)),
    ]

    # 2 and later ask inside a handshake's message (3 also names the reader
    # in each notification: test_nixl_promised_release.py).
    assert params.get("remote_reads_question", 1) >= 2
    assert all(
        answer is not None and params["remote_request_id"] in answer
        for answer in answers
    ), f"asked about request {request.request_id!r}, the listener answered {answers!r}"


def upstream_listener() -> Any:
    """Upstream's `_nixl_handshake_listener` of the installed release, from
    the pinned wheel's source of its module."""
    manifest = read_installed_manifest()
    assert manifest is not None, "the installed vLLM carries no series"
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-listener-") as scratch:
        (path,) = pristine_sources(manifest, [LISTENER_MODULE], Path(scratch)).values()
        spec = importlib.util.spec_from_file_location("upstream_nixl_listener", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return next(
        value._nixl_handshake_listener
        for value in vars(module).values()
        if isinstance(value, type) and "_nixl_handshake_listener" in vars(value)
    )


def test_the_question_does_not_stop_a_listener_without_the_read_confirmation() -> None:
    """Asked in the shape the prefill side's parameters name, upstream's
    listener answers as a handshake and serves on; the decode side takes
    that for "not held" (it raises, which its callers treat as no answer)."""
    utils = importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils"
    )
    listener = upstream_listener()
    port = free_port()
    ready, stop = threading.Event(), threading.Event()
    metadata = {(0, 0) if PP_AWARE else 0: msgspec.msgpack.encode("metadata")}
    thread = threading.Thread(
        target=listener,
        args=(metadata, ready, stop, "127.0.0.1", port),
        daemon=True,
    )
    thread.start()
    assert ready.wait(10)
    try:
        with pytest.raises(ValueError, match="did not answer the question"):
            utils.reads_still_held(
                "127.0.0.1", port, [("req", None)], "decode:req", utils.READS_HELD_SHAPE
            )
        handshake = frames_from(port, msgspec.msgpack.encode(HANDSHAKE))
    finally:
        stop.set()
        thread.join(timeout=10)
    assert handshake is not None and len(handshake) == HANDSHAKE_FRAMES, (
        "upstream's listener answered no handshake after the decode side's "
        f"question (it died on it): {handshake!r}"
    )
