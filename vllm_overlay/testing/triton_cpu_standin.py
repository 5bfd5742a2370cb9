"""pytest plugin: stand in for triton-cpu's presence in the CPU platform's
configuration check, and nowhere else, for tests that launch no kernel.

vLLM 0.34.0's CPU platform refuses every configuration on an x86 CPU whose
Python has no Triton with a CPU backend (`CpuPlatform.check_and_update_config`,
vllm/platforms/cpu.py:233-243 there; 0.33.0 only warned), and triton-cpu comes
only from a GitHub release URL (requirements/cpu.txt:24-26), on no index the
test machines reach. So every test that builds a `VllmConfig` fails there
before it reaches what it tests: upstream's scheduler and connector unit tests,
and our probes, which drive those classes directly.

This plugin answers that one check as a host with triton-cpu would: while
`check_and_update_config` runs, `vllm.triton_utils.HAS_TRITON` reads True, and
only there, so no kernel choice, import or other check sees a Triton the
machine does not have. A test that launches a Triton kernel still fails as it
would without the plugin. An engine is refused outright (`EngineCore` and the
engine-core clients raise): an engine on such a CPU runs Triton kernels, and a
result from an engine under a stand-in would claim what never ran. The
releases that take this plugin, and why, are in the release facts
(`triton_cpu_standin`); docs/maintainer/testing.md says what it leaves untested.

Use: `pytest -p vllm_overlay.testing.triton_cpu_standin TESTS...`
(`facts.triton_cpu_standin_args(release)` gives those arguments).
"""

import functools
from collections.abc import Callable
from typing import Any

import pytest

REFUSAL = (
    "vllm-overlay's triton-cpu stand-in (vllm_overlay.testing.triton_cpu_standin) "
    "starts no engine: on an x86 CPU an engine of this release runs triton-cpu "
    "kernels, which this machine does not have"
)


def _with_triton_present(check: Callable[..., Any]) -> Callable[..., Any]:
    """`check` (a classmethod's function) run while `vllm.triton_utils`
    says Triton is present."""

    @functools.wraps(check)
    def checked(cls: type, *args: Any, **kwargs: Any) -> Any:
        import vllm.triton_utils as triton_utils

        real = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            return check(cls, *args, **kwargs)
        finally:
            triton_utils.HAS_TRITON = real

    return checked


def _refused(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(REFUSAL)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Wrap the check and refuse engines once every other plugin (the
    pristine sources of `vllm_overlay.testing.pristine` among them) is in
    place, so that the classes wrapped are those the tests will use."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.core_client import EngineCoreClient

    check = CpuPlatform.__dict__["check_and_update_config"].__func__
    CpuPlatform.check_and_update_config = classmethod(_with_triton_present(check))
    EngineCore.__init__ = _refused  # type: ignore[method-assign]
    EngineCoreClient.make_client = staticmethod(_refused)  # type: ignore[method-assign]
    EngineCoreClient.make_async_mp_client = staticmethod(_refused)  # type: ignore[method-assign]


def pytest_report_header(config: pytest.Config) -> str:
    return (
        "vllm-overlay: triton-cpu stood in for in the CPU platform's "
        "configuration check only; no engine starts"
    )
