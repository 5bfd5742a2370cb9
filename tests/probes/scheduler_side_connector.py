"""A base for the probes' connectors: the scheduler side only.

Probes drive a real `Scheduler`, which calls only the scheduler-side methods of
its connector; the worker-side ones must exist (they are abstract upstream)
but are never reached, so they raise.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1 import (
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiConnector,
)
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request


class SchedulerSideConnector(KVConnectorBase_V1):
    """Empty metadata for every step; worker-side methods unreachable."""

    def build_connector_meta(
        self, scheduler_output: SchedulerOutput
    ) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        raise NotImplementedError

    def wait_for_save(self) -> None:
        raise NotImplementedError


class RecordingHMAChild(SchedulerSideConnector, SupportsHMA):
    """A MultiConnector child as the in-tree ones are (HMA-capable), which
    records the external tokens each request was allocated for: the
    MultiConnector gives its chosen loader the count and every other child 0,
    so these records show which child loads a request."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        super().__init__(vllm_config, role, kv_cache_config)
        self.allocated_external_tokens: dict[str, int] = {}

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self.allocated_external_tokens[request.request_id] = num_external_tokens

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return False, None


class StoreChild(RecordingHMAChild):
    """An offloading tier as a MultiConnector child: a fixed synchronous hit
    of `matched_tokens` (its extra config). Like any child, it loads every
    KV cache group for the tokens it reports; but it cannot complete a
    divergent local hybrid hit (`supports_divergent_local_hybrid_hits` stays
    False): it cannot restore a recurrent state that lags behind a local
    full-attention hit."""

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        extra_config = self._kv_transfer_config.kv_connector_extra_config
        return max(extra_config["matched_tokens"] - num_computed_tokens, 0), False


def child_connectors(connector: MultiConnector) -> list[Any]:
    """A MultiConnector's children: the `sub_connectors` property, which 0.22.1
    lacks (it keeps them in `_connectors` only)."""
    if hasattr(MultiConnector, "sub_connectors"):
        return list(connector.sub_connectors)
    return list(connector._connectors)
