"""A base for the probes' connectors: the scheduler side only.

Probes drive a real `Scheduler`, which calls only the scheduler-side methods of
its connector; the worker-side ones must exist (they are abstract upstream)
but are never reached, so they raise.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
from vllm.v1.core.sched.output import SchedulerOutput


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
