"""The triton-cpu stand-in (`vllm_overlay.testing.triton_cpu_standin`) stands
in for triton-cpu in the CPU platform's configuration check only, and starts
no engine: what it lets run of a release that refuses an x86 CPU without
triton-cpu (vLLM 0.34.0) is only what needs no Triton kernel.

These run in the releases the release facts name under `triton_cpu_standin`,
whose `tests/runtime` the suite runs with the plugin; elsewhere they are
skipped, saying so.
"""

import pytest

from vllm_overlay.series.facts import TRITON_CPU_STANDIN_PLUGIN


@pytest.fixture(autouse=True)
def _standin_loaded(request: pytest.FixtureRequest) -> None:
    if not request.config.pluginmanager.has_plugin(TRITON_CPU_STANDIN_PLUGIN):
        pytest.skip("this release's tests run without the triton-cpu stand-in")


def test_the_platform_check_passes_and_nothing_else_sees_triton():
    """A configuration builds, while vLLM's own answer, read anywhere
    but in that check, stays that this machine has no Triton."""
    import vllm.triton_utils as triton_utils
    from vllm.config import CacheConfig, VllmConfig
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.check_and_update_config(VllmConfig(cache_config=CacheConfig()))

    assert triton_utils.HAS_TRITON is False


def test_no_engine_starts_under_it():
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.core_client import EngineCoreClient

    from vllm_overlay.testing.triton_cpu_standin import REFUSAL

    with pytest.raises(RuntimeError, match="starts no engine"):
        EngineCore(None, None, None)
    with pytest.raises(RuntimeError) as refused:
        EngineCoreClient.make_client(False, False, None, None, None)
    assert str(refused.value) == REFUSAL
