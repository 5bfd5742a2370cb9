"""pytest plugin for upstream vLLM's tests on a CPU machine: skip the global
cleanup after tests that never start an engine or a distributed environment.

Upstream's `tests/conftest.py` runs `cleanup_dist_env_and_memory()` after every
test unless the test carries the `skip_global_cleanup` marker; its docstring
says the marker "can provide a ~10x speedup for non-GPU unit tests". The
cleanup ends in a full `gc.collect()` over vLLM's and torch's heap, which takes
seconds on a 2-core machine: with ~1,000 scheduler and connector unit tests per
release it costs most of the run. This plugin adds upstream's own marker to the
tests that cannot need the cleanup (their source and fixtures mention no engine
and no distributed set-up) and leaves every other test as upstream runs it.
"""

import inspect

import pytest

# What a test touches when it needs the distributed environment or an engine
# torn down after it.
NEEDS_CLEANUP = (
    "LLM(",
    "AsyncLLM",
    "LLMEngine",
    "EngineCore",
    "vllm_runner",
    "dist_init",
    "init_distributed_environment",
    "initialize_model_parallel",
)


def _needs_cleanup(item: pytest.Item) -> bool:
    if any(name in NEEDS_CLEANUP for name in getattr(item, "fixturenames", ())):
        return True
    function = getattr(item, "function", None)
    if function is None:
        return True
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return True
    return any(marker in source for marker in NEEDS_CLEANUP)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not _needs_cleanup(item):
            item.add_marker(pytest.mark.skip_global_cleanup)
