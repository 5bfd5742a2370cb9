"""A stand-in for LMCache's vLLM adapter, for the LMCache probes.

`LMCacheConnectorV1` builds its adapter, `LMCacheConnectorV1Impl`, from the
`lmcache` package. `install_fake_adapter` puts a module of that name in
`sys.modules`, so the real connector, patched or not, imports the fake in its
constructor and drives it as it would drive LMCache's; the probes can then
see what the connector asks and hands it, with or without lmcache installed.
`test_lmcache_real_adapter.py` drives the real lmcache package.

The fake keeps the scheduler-side load bookkeeping of vLLM's in-tree adapter
(`lmcache_integration/vllm_v1_adapter.py`): only its lookup in
`get_num_new_matched_tokens` records a load for a request,
`update_state_after_alloc` arms it when the scheduler allocated external
tokens, and `build_connector_meta` puts the armed loads into the step's
metadata, which is all the worker side loads.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request

ADAPTER_MODULE = "lmcache.integration.vllm.vllm_v1_adapter"


@dataclass
class FakeLMCacheMetadata(KVConnectorMetadata):
    """One step's loads: request id -> number of tokens to load."""

    loads: dict[str, int] = field(default_factory=dict)


class FakeLMCacheAdapter:
    """Finds `matched_tokens` of every prompt in its store and records what
    the connector asks and hands it."""

    matched_tokens = 0
    # Every adapter built, by the subclass `install_fake_adapter` returns.
    instances: list[FakeLMCacheAdapter]

    def __init__(self, vllm_config: Any, role: Any, parent: Any) -> None:
        type(self).instances.append(self)
        self.parent = parent
        self.lookups: list[str] = []
        self.allocated: dict[str, int] = {}
        self.finished: list[tuple[str, list[int]]] = []
        self.registered_layers: list[str] | None = None
        # Request id -> the block ids of every step's scheduler output, as
        # an adapter that saves them reads them.
        self.scheduled_block_ids: dict[str, list[tuple[list[int], ...]]] = {}
        self._looked_up: set[str] = set()
        self._armed_loads: dict[str, int] = {}

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> int:
        self.lookups.append(request.request_id)
        self._looked_up.add(request.request_id)
        return max(self.matched_tokens - num_computed_tokens, 0)

    def update_state_after_alloc(
        self, request: Request, num_external_tokens: int
    ) -> None:
        self.allocated[request.request_id] = num_external_tokens
        if request.request_id in self._looked_up and num_external_tokens > 0:
            self._armed_loads[request.request_id] = num_external_tokens

    def build_connector_meta(
        self, scheduler_output: SchedulerOutput
    ) -> FakeLMCacheMetadata:
        for new_req in scheduler_output.scheduled_new_reqs:
            self.scheduled_block_ids.setdefault(new_req.req_id, []).append(
                new_req.block_ids
            )
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, block_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            if block_ids is not None:
                self.scheduled_block_ids.setdefault(req_id, []).append(block_ids)
        loads, self._armed_loads = self._armed_loads, {}
        return FakeLMCacheMetadata(loads)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self.finished.append((request.request_id, block_ids))
        return False, None

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self.registered_layers = sorted(kv_caches)


def install_fake_adapter(
    monkeypatch: pytest.MonkeyPatch, **attributes: Any
) -> type[FakeLMCacheAdapter]:
    """Make `LMCacheConnectorV1` build a `FakeLMCacheAdapter` subclass with
    `attributes` (e.g. `matched_tokens`) for the rest of the test, and return
    that subclass; its `instances` lists every adapter the connector built."""
    adapter_cls = type(
        "ProbeLMCacheAdapter", (FakeLMCacheAdapter,), {"instances": [], **attributes}
    )
    parts = ADAPTER_MODULE.split(".")
    for depth in range(1, len(parts)):
        package = ".".join(parts[:depth])
        monkeypatch.setitem(sys.modules, package, types.ModuleType(package))
    module = types.ModuleType(ADAPTER_MODULE)
    module.LMCacheConnectorV1Impl = adapter_cls  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, ADAPTER_MODULE, module)
    return adapter_cls
