"""Probe: on the CPU platform, NIXL's worker keeps the thread that runs the
model within an explicit `VLLM_CPU_OMP_THREADS_BIND`.

NIXL's worker is built in the worker process's main thread, the OpenMP master
thread that runs the model. On the CPU platform its `__init__` moves that
thread to the last core of each NUMA node, reserved for KV transfer
(`os.sched_setaffinity(0, rsv_cores_for_kv)`: 0.22.1
nixl/worker.py:326-339, 0.31.0 nixl/base_worker.py:730-743, 0.32.0 :701-714,
0.33.0 :812-825). With "auto" binding that core is kept out of every rank's
OpenMP cores for it. With a core list the user chose, it may be another
instance's: a prefill and a decode instance bound to cores "0" and "1" of a
two-core host both end up running their model on core 1 while core 0 idles.
Patched, an explicit binding keeps only the reserved cores within the thread's
own binding; with none, the thread stays where OpenMP bound it.

The worker is NIXL's real `NixlConnectorWorker`, built by its real `__init__`
on vLLM's CPU platform, with stand-ins for a NIXL agent that does nothing (no
transfer happens here) and a single-rank tensor-parallel group (`nixl_host`),
and for the host (`EmulatedHost`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import vllm.envs as envs
from conftest import MakeVllmConfig
from vllm.config import KVTransferConfig, VllmConfig, set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker import (
    NixlConnectorWorker,
)
from vllm.platforms import current_platform
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)

try:
    # 0.31.0 on: the engine core resolves one KV cache layout for the model
    # before any worker builds its connector.
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
except ImportError:
    # 0.22.1: the worker asks for the layout itself (get_kv_cache_layout).
    resolve_kv_cache_layout = None

try:
    # 0.31.0 on: the affinity code is in the base of the pull and push workers.
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (
        base_worker as nixl_worker_module,
    )
except ImportError:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (
        worker as nixl_worker_module,
    )

# The emulated host: one NUMA node of two cores, so NIXL reserves core 1.
ONE_NODE = [[0, 1]]
# Two NUMA nodes of two cores each: NIXL reserves cores 1 and 3.
TWO_NODES = [[0, 1], [2, 3]]
# vLLM's CPU attention takes blocks of a multiple of 32 tokens.
CPU_BLOCK_SIZE = 32


@dataclass
class EmulatedHost:
    """The host as NIXL's worker module sees it, so that the probes pass on
    any host and never change the affinity of the thread running pytest.

    - `numa_nodes` stands for `/sys/devices/system/node` as
      `CpuPlatform.discover_numa_topology` reads it: the cores of each NUMA
      node (one logical core per physical core).
    - `thread_cores` stands for the calling thread's CPU affinity: what the
      OpenMP runtime bound the worker's main thread to, from the cores
      `OMPProcessManager.configure_omp_envs` exported for its rank, before
      the connector is built. `sched_getaffinity(0)` reads it and
      `sched_setaffinity(0, cores)` replaces it, as the kernel does for the
      calling thread; each `sched_setaffinity` is recorded in `moves`.
    """

    numa_nodes: list[list[int]]
    thread_cores: set[int]
    moves: list[list[int]] = field(default_factory=list)

    def sched_getaffinity(self, pid: int) -> set[int]:
        assert pid == 0, "NIXL asks for another thread's affinity than its own"
        return set(self.thread_cores)

    def sched_setaffinity(self, pid: int, cores: Any) -> None:
        assert pid == 0, "NIXL moves another thread than its own"
        self.moves.append(list(cores))
        self.thread_cores = set(cores)


class _OsOfHost:
    """`os` for NIXL's worker module: the real module, but for the calling
    thread's affinity, which is the emulated host's."""

    def __init__(self, host: EmulatedHost) -> None:
        self.sched_getaffinity = host.sched_getaffinity
        self.sched_setaffinity = host.sched_setaffinity

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


class _IdleNixlAgent:
    """A NIXL agent that is never asked for a transfer: building the worker
    only creates it."""

    def __init__(self, agent_name: str, config: Any) -> None:
        self.agent_name = agent_name


@pytest.fixture
def nixl_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NIXL agent and the tensor-parallel group of every probe here."""
    monkeypatch.setattr(nixl_worker_module, "NixlWrapper", _IdleNixlAgent)
    monkeypatch.setattr(nixl_worker_module, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(
        nixl_worker_module, "get_tensor_model_parallel_world_size", lambda: 1
    )


def build_worker(
    make_vllm_config: MakeVllmConfig,
    monkeypatch: pytest.MonkeyPatch,
    binding: str,
    host: EmulatedHost,
) -> None:
    """Build NIXL's worker on `host` with `VLLM_CPU_OMP_THREADS_BIND` set to
    `binding`, as a CPU worker process of one rank builds it."""
    assert current_platform.device_type == "cpu"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", binding)
    if hasattr(envs, "disable_envs_cache"):
        # A release that caches vLLM's variables once the engine is up must
        # read this probe's binding.
        envs.disable_envs_cache()
    monkeypatch.setattr(
        current_platform, "discover_numa_topology", lambda: host.numa_nodes
    )
    monkeypatch.setattr(nixl_worker_module, "os", _OsOfHost(host))
    vllm_config = make_vllm_config(
        KVTransferConfig(
            kv_connector="NixlConnector", kv_role="kv_both", kv_buffer_device="cpu"
        )
    )
    vllm_config.cache_config.block_size = CPU_BLOCK_SIZE
    kv_cache_config = KVCacheConfig(
        num_blocks=16,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["model.layers.0.self_attn.attn"],
                FullAttentionSpec(
                    block_size=CPU_BLOCK_SIZE,
                    num_kv_heads=1,
                    head_size=32,
                    dtype=torch.float32,
                ),
            )
        ],
    )
    resolve_layout_as_the_engine_does(vllm_config, kv_cache_config)
    # The worker process builds its connector within its config
    # (WorkerWrapperBase.initialize_from_config: 0.22.1
    # vllm/v1/worker/worker_base.py:315-319, 0.32.0 :340-344).
    with set_current_vllm_config(vllm_config):
        worker = NixlConnectorWorker(vllm_config, "probe-engine", kv_cache_config)
    worker.shutdown()


def resolve_layout_as_the_engine_does(
    vllm_config: VllmConfig, kv_cache_config: KVCacheConfig
) -> None:
    """Resolve the KV cache layout as the engine core does before its workers
    build their connectors (0.32.0 vllm/v1/engine/core.py:292-301), from the
    layouts the worker's attention backends support."""
    if resolve_kv_cache_layout is None:
        return
    backends = get_current_attn_backends(vllm_config)
    supported = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
    specs = [group.kv_cache_spec for group in kv_cache_config.kv_cache_groups]
    resolve_kv_cache_layout(vllm_config, [supported], specs)


@pytest.mark.usefixtures("nixl_host")
def test_explicit_binding_keeps_the_model_thread_on_its_cores(
    make_vllm_config: MakeVllmConfig,
    monkeypatch: pytest.MonkeyPatch,
    vllm_log_records: list[logging.LogRecord],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A prefill instance bound to core 0 of a two-core host (its decode
    instance has core 1): the thread that runs its model stays on core 0,
    and the log says why NIXL did not move it."""
    # Unless vLLM configured its logger, it takes the root logger's level
    # (WARNING), which would drop the info record.
    caplog.set_level(logging.INFO, logger="vllm")
    host = EmulatedHost(numa_nodes=ONE_NODE, thread_cores={0})
    build_worker(make_vllm_config, monkeypatch, "0", host)
    assert host.thread_cores == {0}, (
        f"NIXL moved the thread that runs the model to cores {host.moves}, "
        "outside VLLM_CPU_OMP_THREADS_BIND='0'"
    )
    assert host.moves == []
    explained = [
        record.getMessage()
        for record in vllm_log_records
        if record.levelno == logging.INFO
        and "VLLM_CPU_OMP_THREADS_BIND='0'" in record.getMessage()
    ]
    assert explained == [
        "NIXL leaves KV transfer on this worker's cores (0,): the cores it "
        "reserves for it, one per NUMA node ((1,)), lie outside "
        "VLLM_CPU_OMP_THREADS_BIND='0'."
    ]


@pytest.mark.usefixtures("nixl_host")
def test_explicit_binding_reserves_only_its_own_node_cores(
    make_vllm_config: MakeVllmConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank bound to cores 0-1 of a two-node host, whose other node belongs
    to another rank: NIXL reserves core 1 of its own node for KV transfer,
    not core 3 of the other one."""
    host = EmulatedHost(numa_nodes=TWO_NODES, thread_cores={0, 1})
    build_worker(make_vllm_config, monkeypatch, "0-1", host)
    assert host.thread_cores <= {0, 1}, (
        f"NIXL moved the thread that runs the model to cores {host.moves}, "
        "outside VLLM_CPU_OMP_THREADS_BIND='0-1'"
    )
    assert host.moves == [[1]]


@pytest.mark.usefixtures("nixl_host")
@pytest.mark.parametrize("binding", ["auto", "nobind"])
def test_auto_or_no_binding_keeps_upstream_reservation(
    make_vllm_config: MakeVllmConfig, monkeypatch: pytest.MonkeyPatch, binding: str
) -> None:
    """Without a core list of the user's, NIXL moves the thread to the last
    core of every NUMA node, as upstream does, even from cores outside them
    ("auto" keeps those cores out of the OpenMP binding for this)."""
    host = EmulatedHost(numa_nodes=TWO_NODES, thread_cores={0})
    build_worker(make_vllm_config, monkeypatch, binding, host)
    assert host.moves == [[1, 3]]


@pytest.mark.usefixtures("nixl_host")
def test_explicit_binding_with_the_reserved_cores_keeps_upstream_reservation(
    make_vllm_config: MakeVllmConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An explicit binding that holds every reserved core: NIXL moves the
    thread to them, as upstream does."""
    host = EmulatedHost(numa_nodes=TWO_NODES, thread_cores={0, 1, 2, 3})
    build_worker(make_vllm_config, monkeypatch, "0-3", host)
    assert host.moves == [[1, 3]]
