"""Probe: MultiConnector loads from the child with the best weighted hit.

Upstream lets the first child that reports any hit load a request, so a small
fast tier listed first (a CPU tier holding 2k tokens) wins over a large one
behind it (a disk tier holding 60k). Patched, a child's entry in
`kv_connector_extra_config["connectors"]` may set `load_weight`; when any
does, the child with the highest new-matched-tokens x weight loads (unset
weights are 1.0, ties go to the earlier child). Without weights the choice
is upstream's. `load_weight` is a field of a child's KVTransferConfig, so
every place that builds a child's config from its entry accepts it, and an
unusable weight is an error naming the child when the MultiConnector's config
is built, before any model loads.

On a release without weights, the probes of the selection leave the key out
(`LOAD_WEIGHT_KNOWN`), so that they fail on the selection itself, not on the
config rejecting the key; that rejection is its own probe.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from conftest import LOAD_WEIGHT_KNOWN, MakeRequest, MakeScheduler, MakeVllmConfig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_side_connector import RecordingHMAChild, child_connectors
from vllm.config import KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiConnector,
)
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.request import Request

UNSET: Any = object()  # a child entry without load_weight


class ScriptedChild(RecordingHMAChild):
    """Answers `matched_tokens` from its config (None: "not known yet") for
    every request, synchronously; labels its hits with the configured
    `source` where the release has hit sources (0.32.0 on)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        super().__init__(vllm_config, role, kv_cache_config)
        extra_config = self._kv_transfer_config.kv_connector_extra_config
        self._matched_tokens: int | None = extra_config["matched_tokens"]
        if "source" in extra_config:
            from vllm.v1.metrics.cache_hit_source import CacheHitSource

            self._cache_hit_source = CacheHitSource[extra_config["source"]]

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._matched_tokens, False

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig) -> bool:
        return True


def multi_connector_config(
    children: list[tuple[int | None, Any]],
    sources: tuple[str, ...] = (),
    always_weigh: bool = False,
) -> KVTransferConfig:
    """A MultiConnector over scripted children given as (hit, load_weight);
    a load_weight of UNSET leaves the key out, and so does a release without
    weights unless `always_weigh`."""
    entries = []
    for i, (hit, weight) in enumerate(children):
        extra = {"matched_tokens": hit}
        if sources:
            extra["source"] = sources[i]
        entry = {
            "kv_connector": "ScriptedChild",
            "kv_role": "kv_both",
            "kv_connector_module_path": __name__,
            "kv_connector_extra_config": extra,
        }
        if weight is not UNSET and (LOAD_WEIGHT_KNOWN or always_weigh):
            entry["load_weight"] = weight
        entries.append(entry)
    return KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": entries},
    )


def allocations(scheduler: Scheduler, request_id: str) -> list[int]:
    connector = scheduler.connector
    assert isinstance(connector, MultiConnector)
    return [
        c.allocated_external_tokens[request_id] for c in child_connectors(connector)
    ]


def test_weighted_child_with_longer_hit_loads(
    make_scheduler: MakeScheduler, make_request: MakeRequest, block_size: int
) -> None:
    """[CPU tier: 2 blocks, disk tier: 30 blocks at weight 0.5]: the disk
    tier's 15 weighted blocks beat the CPU tier's 2, so all 30 load."""
    cpu_hit, disk_hit = 2 * block_size, 30 * block_size
    scheduler = make_scheduler(
        multi_connector_config([(cpu_hit, UNSET), (disk_hit, 0.5)])
    )
    scheduler.add_request(make_request("long", 40 * block_size))
    output = scheduler.schedule()

    assert allocations(scheduler, "long") == [0, disk_hit]
    assert output.scheduled_new_reqs[0].num_computed_tokens == disk_hit


@pytest.mark.skipif(
    not hasattr(MultiConnector, "get_external_cache_hit_sources"),
    reason="MultiConnector reports no per-request hit sources before 0.32.0",
)
def test_hit_sources_follow_the_weighted_winner(
    make_scheduler: MakeScheduler, make_request: MakeRequest, block_size: int
) -> None:
    """The hit-source metrics name the child that loaded, not the first hit."""
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    config = multi_connector_config(
        [(block_size, UNSET), (4 * block_size, 2.0)], sources=("HOST", "DISK")
    )
    scheduler = make_scheduler(config)
    request = make_request("sources", 8 * block_size)
    scheduler.add_request(request)
    scheduler.schedule()

    connector = scheduler.connector
    assert isinstance(connector, MultiConnector)
    sources = connector.get_external_cache_hit_sources(request, 4 * block_size)
    assert sources == {CacheHitSource.DISK: 4 * block_size}


def test_child_entry_with_load_weight_builds_a_child_config() -> None:
    """Every place that builds a child's KVTransferConfig from its entry
    (MultiConnector itself, its class methods, a model such as 0.33's Step5)
    passes the whole entry; upstream's config rejects the unknown key."""
    try:
        child = KVTransferConfig(
            kv_connector="ScriptedChild", kv_role="kv_both", load_weight=2.0
        )
    except ValueError as refused:  # pydantic's ValidationError is one
        pytest.fail(f"a child entry with load_weight builds no config: {refused}")
    assert child.load_weight == 2.0


@pytest.mark.skipif(
    not hasattr(MultiConnector, "supports_sleep_mode"),
    reason="MultiConnector answers sleep-mode support from 0.33.0 on",
)
def test_sleep_mode_support_with_weighted_children() -> None:
    """VllmConfig asks the connector class about sleep mode when it is on;
    MultiConnector builds each child's config for that. Children that support
    sleep mode do so with a weight too."""
    try:
        weighted = multi_connector_config([(0, UNSET), (0, 2.0)], always_weigh=True)
        supported = MultiConnector.supports_sleep_mode(weighted)
    except ValueError as refused:  # pydantic's ValidationError is one
        pytest.fail(f"a child entry with load_weight builds no config: {refused}")
    assert supported is True


@pytest.mark.parametrize(
    "weight",
    [
        -1.0,
        0,
        0.0,
        math.nan,
        math.inf,
        pytest.param(10**400, id="10**400"),
        "2",
        True,
        None,
        [1.0],
    ],
)
def test_invalid_load_weight_fails_when_the_config_is_built(weight: Any) -> None:
    """Negative, zero, NaN, infinite, too large for a float or not a number:
    a configuration error that names the child, raised when the
    MultiConnector's config is built, before any model loads."""
    with pytest.raises(ValueError, match=r"child 1 \(ScriptedChild\).*load_weight"):
        multi_connector_config([(0, 1.0), (0, weight)], always_weigh=True)


# What one child answers: None ("not known yet") now and then, else a hit.
answers = st.one_of(st.none(), st.integers(0, 4096)) | st.integers(0, 4096)
weights = st.one_of(st.just(UNSET), st.floats(0.01, 100.0), st.integers(1, 100))


def expected_loader(
    hits: list[int | None], child_weights: list[Any]
) -> tuple[int | None, int | None]:
    """The rule, stated plainly: (returned token count, loading child)."""
    if any(hit is None for hit in hits):
        return None, None
    candidates = [i for i, hit in enumerate(hits) if hit]
    if not candidates:
        return 0, None
    if all(weight is UNSET for weight in child_weights):
        winner = candidates[0]
    else:
        factor = [1.0 if w is UNSET else w for w in child_weights]
        winner = max(candidates, key=lambda i: hits[i] * factor[i])
    return hits[winner], winner


class BuiltConfig:
    """A `VllmConfig` handed to the property as a fixture value. Hypothesis
    prints its arguments, field by field for a dataclass, and 0.22.1's
    `SchedulerConfig` lists an init-only field (`max_model_len`) that it has no
    attribute for, so printing the config itself raises."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config

    def __repr__(self) -> str:
        return "BuiltConfig(tiny model, no KV transfer config)"


@pytest.fixture(scope="module")
def base_vllm_config(make_vllm_config: MakeVllmConfig) -> BuiltConfig:
    """Built once: the property runs hundreds of examples."""
    return BuiltConfig(make_vllm_config(None))


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    children=st.lists(st.tuples(answers, weights), min_size=1, max_size=4),
)
def test_selection_rule(
    base_vllm_config: BuiltConfig,
    make_request: MakeRequest,
    children: list[tuple[int | None, Any]],
) -> None:
    """For any hits and weights the MultiConnector returns the winner's hit,
    allocates the external tokens to the winner alone, and answers None when
    any child does not know yet."""
    vllm_config = copy.copy(base_vllm_config.vllm_config)
    vllm_config.kv_transfer_config = multi_connector_config(children)
    connector = MultiConnector(
        vllm_config=vllm_config,
        role=KVConnectorRole.SCHEDULER,
        kv_cache_config=KVCacheConfig(
            num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[]
        ),
    )
    request = make_request("property", 16)
    tokens, load_async = connector.get_num_new_matched_tokens(request, 0)

    hits = [hit for hit, _ in children]
    expected_tokens, winner = expected_loader(hits, [w for _, w in children])
    assert (tokens, load_async) == (expected_tokens, False)
    if tokens is None:
        return
    connector.update_state_after_alloc(request, KVCacheBlocks(()), tokens)
    allocated = [
        child.allocated_external_tokens[request.request_id]
        for child in child_connectors(connector)
    ]
    assert allocated == [tokens if i == winner else 0 for i in range(len(children))]
