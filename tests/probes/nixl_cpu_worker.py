"""NIXL's real worker built on vLLM's CPU platform, for the probes of what
its `__init__` does there (the thread it moves, the agent it builds).

The worker is NIXL's real `NixlConnectorWorker`, built by its real `__init__`,
with stand-ins for a NIXL agent that records the config it was built with and
does nothing else (no transfer happens here), for a single-rank
tensor-parallel group (`stand_in_nixl`), and for the host (`EmulatedHost`).
"""

from __future__ import annotations

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
    only creates it, with the config NIXL's real agent would read (the real
    `nixl_agent_config`, when NIXL is installed)."""

    def __init__(self, agent_name: str, config: Any) -> None:
        self.agent_name = agent_name
        self.config = config


def stand_in_nixl(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NIXL agent and the tensor-parallel group the worker is built with."""
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
) -> Any:
    """Build NIXL's worker on `host` with `VLLM_CPU_OMP_THREADS_BIND` set to
    `binding`, as a CPU worker process of one rank builds it; the config its
    NIXL agent was built with."""
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
    return worker.nixl_wrapper.config


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
