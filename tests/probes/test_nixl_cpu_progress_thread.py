"""Probe: on the CPU platform, NIXL's worker builds its agent without the
progress thread.

NIXL's Python agent runs a progress thread unless its config turns it off
(`nixl_agent_config(enable_prog_thread=True)` by default, kept as
`enable_pthread` and read back by the agent: nixl 1.4.1 `_api.py:169`,
`:179`, `:226`; 1.5.0, 0.33.0's, `:166`, `:176`, `:222`), and that thread
polls without pause (`pthrDelay = 0`, 1.4.1 `:230`, 1.5.0 `:226`). vLLM's
worker builds the config with the default (0.22.1 nixl/worker.py:283-293,
0.31.0 nixl/base_worker.py:669-679, 0.32.0 :634-644, 0.33.0 :733-746), in
the worker process's main thread, the OpenMP master thread that runs the
model, whose cores the progress thread inherits. On a
CPU it keeps one of the model's cores busy whether or not anything is in
flight, and the model computes at about half speed there. Patched, the CPU
platform's worker builds the agent without it, whatever the binding (and says
so once, at info level); it drives NIXL at every engine step, as it does
upstream.

The worker is NIXL's real `NixlConnectorWorker`, built by its real `__init__`
on vLLM's CPU platform with NIXL's real `nixl_agent_config` and stand-ins for
the agent, the tensor-parallel group and the host (`nixl_cpu_worker`).
"""

from __future__ import annotations

import pytest
from conftest import MakeVllmConfig
from nixl_cpu_worker import ONE_NODE, TWO_NODES, EmulatedHost, build_worker


@pytest.mark.usefixtures("nixl_host")
@pytest.mark.parametrize(
    ("binding", "host"),
    [
        ("0-1", EmulatedHost(numa_nodes=ONE_NODE, thread_cores={0, 1})),
        ("auto", EmulatedHost(numa_nodes=TWO_NODES, thread_cores={0})),
        ("nobind", EmulatedHost(numa_nodes=TWO_NODES, thread_cores={0, 1, 2, 3})),
    ],
    ids=["explicit", "auto", "nobind"],
)
def test_cpu_worker_builds_its_agent_without_a_progress_thread(
    make_vllm_config: MakeVllmConfig,
    monkeypatch: pytest.MonkeyPatch,
    binding: str,
    host: EmulatedHost,
) -> None:
    """A CPU worker bound to cores of its own, by vLLM or not at all: its
    NIXL agent gets no progress thread."""
    config = build_worker(make_vllm_config, monkeypatch, binding, host)
    assert config is not None, "NIXL's agent config is not importable here"
    assert config.enable_pthread is False, (
        "NIXL's worker built its agent with the progress thread, which polls "
        f"without pause on the model's cores (VLLM_CPU_OMP_THREADS_BIND={binding!r})"
    )
