"""Probe: MultiConnector exports the Prometheus metrics of the children it can.

A child connector may collect transfer stats (`get_kv_connector_stats`) for
the periodic log line without defining Prometheus metrics
(`build_prom_metrics` returns None, the base default). Up to 0.32.0,
`MultiKVConnectorPromMetrics.observe` asserts that every child reporting stats
has Prometheus metrics, so such a child crashes the stat logger on its first
report. The patch skips it and still exports the children that do define
metrics.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from conftest import MakeScheduler
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from scheduler_side_connector import SchedulerSideConnector
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorProm,
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiConnector,
)
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, KVConnectorOutput
from vllm.v1.request import Request
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

TRANSFERS_METRIC = "vllm:probe_kv_transfers"


class ProbeTransferStats(KVConnectorStats):
    """Transfer stats of the probe children: `{"num_transfers": n}`."""

    def reset(self) -> None:
        self.data = {"num_transfers": 0}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        self.data["num_transfers"] += other.data["num_transfers"]
        return self

    def reduce(self) -> dict[str, int | float]:
        return {"num_transfers": self.data["num_transfers"]}

    def is_empty(self) -> bool:
        return self.data.get("num_transfers", 0) == 0


class ProbeTransferPromMetrics(KVConnectorPromMetrics):
    """Exports `num_transfers` as a per-engine counter."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        counter = self._counter_cls(
            name=TRANSFERS_METRIC,
            documentation="KV transfers reported by the probe connector.",
            labelnames=labelnames,
        )
        self._transfers = {
            engine_idx: counter.labels(*labelvalues)
            for engine_idx, labelvalues in per_engine_labelvalues.items()
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        self._transfers[engine_idx].inc(transfer_stats_data["num_transfers"])


class StatsOnlyChildConnector(SchedulerSideConnector):
    """A scheduler-side child that reports transfer stats, but has no
    Prometheus metrics (it keeps the base `build_prom_metrics`).

    `kv_connector_extra_config["num_transfers"]` sets what it reports.
    """

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        super().__init__(vllm_config, role, kv_cache_config)
        extra_config = self._kv_transfer_config.kv_connector_extra_config
        self._num_transfers: int = extra_config["num_transfers"]

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        return ProbeTransferStats(data={"num_transfers": self._num_transfers})

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        pass


class ExportingChildConnector(StatsOnlyChildConnector):
    """A child that reports the same stats and exports them to Prometheus."""

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return ProbeTransferPromMetrics(
            vllm_config, metric_types, labelnames, per_engine_labelvalues
        )


def _registry_bound_prom_class(registry: CollectorRegistry) -> type[KVConnectorProm]:
    """`KVConnectorProm` whose metrics register in `registry`, not globally.

    vLLM's Ray logger swaps the metric classes the same way.
    """

    class RegistryCounter(Counter):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, registry=registry, **kwargs)

    class RegistryGauge(Gauge):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, registry=registry, **kwargs)

    class RegistryHistogram(Histogram):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, registry=registry, **kwargs)

    class RegistryKVConnectorProm(KVConnectorProm):
        _counter_cls = RegistryCounter
        _gauge_cls = RegistryGauge
        _histogram_cls = RegistryHistogram

    return RegistryKVConnectorProm


def test_child_without_prom_metrics_is_skipped(
    make_scheduler: MakeScheduler,
) -> None:
    """One scheduler step's stats reach Prometheus despite the stats-only child."""
    children = [("StatsOnlyChildConnector", 5), ("ExportingChildConnector", 3)]
    scheduler = make_scheduler(
        KVTransferConfig(
            kv_connector="MultiConnector",
            kv_role="kv_both",
            kv_connector_extra_config={
                "connectors": [
                    {
                        "kv_connector": name,
                        "kv_connector_module_path": __name__,
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {"num_transfers": transfers},
                    }
                    for name, transfers in children
                ]
            },
        )
    )
    assert isinstance(scheduler.connector, MultiConnector)

    # The workers' stats of an (idle) step, as the model runner returns them:
    # the same children in the worker role report the same transfers. 0.22.1
    # passes the scheduler-side stats on only together with the workers'.
    worker = MultiConnector(
        vllm_config=scheduler.vllm_config,
        role=KVConnectorRole.WORKER,
        kv_cache_config=scheduler.kv_cache_config,
    )
    runner_output = dataclasses.replace(
        EMPTY_MODEL_RUNNER_OUTPUT,
        kv_connector_output=KVConnectorOutput(
            kv_connector_stats=worker.get_kv_connector_stats()
        ),
    )
    outputs = scheduler.update_from_output(scheduler.schedule(), runner_output)
    scheduler_stats = outputs[0].scheduler_stats
    assert scheduler_stats is not None
    # What the stat loggers receive: the stats cross from the engine core to
    # the API server process through vLLM's own msgpack serialization.
    received = MsgpackDecoder(SchedulerStats).decode(
        MsgpackEncoder().encode(scheduler_stats)
    )
    kv_connector_stats = received.kv_connector_stats
    assert kv_connector_stats is not None
    assert set(kv_connector_stats) == {name for name, _ in children}

    # PrometheusStatLogger's per-connector part, on a private registry.
    registry = CollectorRegistry()
    prom_cls = _registry_bound_prom_class(registry)
    prom = prom_cls(
        scheduler.vllm_config,
        labelnames=["model_name", "engine"],
        per_engine_labelvalues={0: ["probe", "0"]},
    )
    try:
        prom.observe(kv_connector_stats, engine_idx=0)
    except AssertionError as error:
        raise AssertionError(
            "observe() rejected the stats of a child without Prometheus "
            f"metrics instead of skipping it: {error}"
        ) from error

    exported = registry.get_sample_value(
        f"{TRANSFERS_METRIC}_total", {"model_name": "probe", "engine": "0"}
    )
    assert exported == 2 * 3  # the worker's transfers and the scheduler's
