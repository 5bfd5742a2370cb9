"""Probe: a request whose kv_transfer_params NixlConnector's decode side
cannot read is refused, naming the field, before the engine's scheduler
sees it.

A request's kv_transfer_params come from the request body: any client of
the OpenAI endpoint can send them. With "do_remote_prefill" set, NIXL's
decode side reads the prefill side's fields unchecked inside the engine's
scheduler (0.32.0: nixl/metadata.py:332-336, called from
nixl/base_scheduler.py:488; 0.22.1: nixl/metadata.py:205-209); a missing
one raised KeyError in `Scheduler.schedule()` and the engine core died with
every request on it, and a negative block id selects another block's
descriptor in the worker. Patched, the frontend refuses such a request
(the OpenAI server answers the ValueError with HTTP 400), the engine core's
input thread refuses one that came another way (answered with an error;
the engine serves on), and a refused request's parameters are not
submitted again to release blocks they do not name.

The parts are real: vLLM's `InputProcessor` built from the probes'
`VllmConfig`, `EngineCore.preprocess_add_request` on an object holding only
what it reads, `AsyncLLM.notify_kv_transfer_request_rejected` on one whose
engine client records what it is sent, and the prefill side's parameters
from a real prefill scheduler with NixlConnector (`nixl_sides.py`), as a
router forwards them (through JSON).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import vllm.exceptions
from conftest import MakeScheduler, MakeVllmConfig
from nixl_sides import (
    NIXL_CHILD,
    multi_connector,
    nixl_config,
    prefill_side_transfer_params,
    received_by_engine,
)
from vllm.config import KVTransferConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.input_processor import InputProcessor

NUM_TOKENS = 64


def without(key: str) -> Callable[[dict[str, Any]], None]:
    def edit(params: dict[str, Any]) -> None:
        del params[key]

    return edit


def setting(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(params: dict[str, Any]) -> None:
        params[key] = value

    return edit


# Each malformed case: how it differs from what the prefill side sent, and
# the field the refusal must name.
MALFORMED = {
    "no remote_request_id": (without("remote_request_id"), "remote_request_id"),
    "no remote_block_ids": (without("remote_block_ids"), "remote_block_ids"),
    "no remote_host": (without("remote_host"), "remote_host"),
    "flat remote_block_ids": (
        setting("remote_block_ids", [1, 2, 3, 4]),
        "remote_block_ids",
    ),
    "negative block id": (setting("remote_block_ids", [[0, -1]]), "remote_block_ids"),
    "port as text": (setting("remote_port", "5600"), "remote_port"),
    "negative port": (setting("remote_port", -1), "remote_port"),
    "negative remote_num_tokens": (
        setting("remote_num_tokens", -16),
        "remote_num_tokens",
    ),
    "remote_confirms_reads as text": (
        setting("remote_confirms_reads", "yes"),
        "remote_confirms_reads",
    ),
    "remote_reads_question as text": (
        setting("remote_reads_question", "two"),
        "remote_reads_question",
    ),
    "remote_reads_held_until from a client": (
        setting("remote_reads_held_until", ["boot-id", 1e18]),
        "remote_reads_held_until",
    ),
}

# A decode server's connector configs that include NixlConnector.
NIXL_CONFIGS = {
    "NixlConnector": nixl_config,
    "MultiConnector[NixlConnector]": lambda: KVTransferConfig(
        **multi_connector(NIXL_CHILD)
    ),
}


@pytest.fixture(autouse=True)
def _fixed_block_hash_seed() -> None:
    init_none_hash(sha256)


@pytest.fixture
def sent(make_scheduler: MakeScheduler) -> dict[str, Any]:
    """The kv_transfer_params a prefill server with NixlConnector answers,
    as a router forwards them to the decode server (through JSON)."""
    params = prefill_side_transfer_params(make_scheduler(nixl_config()), NUM_TOKENS)
    return json.loads(json.dumps(params))


def malformed(sent: dict[str, Any], case: str) -> tuple[dict[str, Any], str]:
    """`sent` changed as `case` says, and the field a refusal names."""
    edit, field = MALFORMED[case]
    params = dict(sent)
    edit(params)
    return params, field


# What `AsyncLLM.generate` passes on as the client's error, which the OpenAI
# server answers with HTTP 400 (0.30.0 on: VLLMClientError, and any other
# exception becomes an HTTP 500; 0.22.1: a ValueError).
CLIENT_ERRORS = (getattr(vllm.exceptions, "VLLMClientError", ValueError),)


def refusal(call: Callable[[], object]) -> Exception | None:
    """The exception `call` raised, if any."""
    try:
        call()
    except Exception as refused:
        return refused
    return None


def sampling_params(params: dict[str, Any]) -> SamplingParams:
    return SamplingParams(max_tokens=4, extra_args={"kv_transfer_params": params})


def frontend(vllm_config: Any) -> InputProcessor:
    """The frontend's check of a request before it submits it to the
    engine (the OpenAI server's ValueError is HTTP 400)."""
    return InputProcessor(vllm_config)


@pytest.mark.parametrize("config", list(NIXL_CONFIGS))
@pytest.mark.parametrize("case", list(MALFORMED))
def test_frontend_refuses_malformed_nixl_params_naming_the_field(
    make_vllm_config: MakeVllmConfig, sent: dict[str, Any], case: str, config: str
) -> None:
    params, field = malformed(sent, case)
    processor = frontend(make_vllm_config(NIXL_CONFIGS[config]()))

    refused = refusal(
        lambda: processor._validate_params(sampling_params(params), ("generate",))
    )

    assert isinstance(refused, CLIENT_ERRORS) and field in str(refused), (
        f"the frontend took a request whose kv_transfer_params ({case}) the "
        f"decode side cannot read, instead of refusing it naming {field!r}: "
        f"{refused!r}"
    )


def test_frontend_passes_what_the_prefill_side_sent_and_other_connectors_params(
    make_vllm_config: MakeVllmConfig, sent: dict[str, Any]
) -> None:
    """What a prefill server sent passes the frontend as before, and so do
    parameters malformed for NIXL on a server without NixlConnector: the
    check is NixlConnector's alone."""
    nixl = frontend(make_vllm_config(nixl_config()))
    nixl._validate_params(sampling_params(sent), ("generate",))
    nixl._validate_params(sampling_params({"do_remote_decode": True}), ("generate",))

    other = frontend(
        make_vllm_config(
            KVTransferConfig(kv_connector="LMCacheConnectorV1", kv_role="kv_both")
        )
    )
    for case in MALFORMED:
        params, _ = malformed(sent, case)
        other._validate_params(sampling_params(params), ("generate",))


@pytest.mark.parametrize("case", list(MALFORMED))
def test_engine_refuses_malformed_nixl_params_before_its_scheduler(
    make_scheduler: MakeScheduler, sent: dict[str, Any], case: str
) -> None:
    """A request that reaches the engine core without the frontend's check
    (another frontend, the offline engine) is refused by its input thread,
    which answers it with an error, instead of reaching the scheduler,
    whose step raised on it and stopped the engine."""
    params, field = malformed(sent, case)

    decode = make_scheduler(nixl_config())
    refused = refusal(lambda: received_by_engine(decode, "decode", params, NUM_TOKENS))

    assert isinstance(refused, ValueError) and field in str(refused), (
        f"the engine core took a request whose kv_transfer_params ({case}) its "
        f"scheduler cannot read, instead of refusing it naming {field!r}: "
        f"{refused!r}"
    )


class _EngineClient:
    """AsyncLLM's engine client: records the requests it is sent."""

    def __init__(self) -> None:
        self.sent: list[EngineCoreRequest] = []

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        self.sent.append(request)


def released_through_engine(
    make_vllm_config: MakeVllmConfig, params: dict[str, Any]
) -> list[EngineCoreRequest]:
    """What the frontend submits to the engine, to release the prefill
    side's blocks, for a request it refused carrying `params`
    (`AsyncLLM.notify_kv_transfer_request_rejected`, the real method)."""
    client = _EngineClient()
    engine = SimpleNamespace(
        vllm_config=make_vllm_config(nixl_config()), engine_core=client
    )
    asyncio.run(AsyncLLM.notify_kv_transfer_request_rejected(engine, "decode", params))
    return client.sent


def test_a_refused_request_releases_nothing_through_the_engine(
    make_vllm_config: MakeVllmConfig, sent: dict[str, Any]
) -> None:
    """The frontend submits a request it refused again, pre-aborted, so
    that the connector releases the prefill side's blocks it names; one
    refused for its kv_transfer_params names none, and its submission
    reached the scheduler's step with them (the engine stopped there)."""
    assert len(released_through_engine(make_vllm_config, sent)) == 1

    for case in MALFORMED:
        params, _ = malformed(sent, case)
        assert released_through_engine(make_vllm_config, params) == [], (
            f"a request refused for its kv_transfer_params ({case}) was "
            "submitted to the engine to release blocks"
        )
