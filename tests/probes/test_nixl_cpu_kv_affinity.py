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
on vLLM's CPU platform with stand-ins for the NIXL agent, the tensor-parallel
group and the host (`nixl_cpu_worker`).
"""

from __future__ import annotations

import logging

import pytest
from conftest import MakeVllmConfig
from nixl_cpu_worker import ONE_NODE, TWO_NODES, EmulatedHost, build_worker


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
