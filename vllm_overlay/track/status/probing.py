"""Probes run in a release's cached test environment: `vllm-overlay status
--probe` runs each patch's probes on the *unpatched* release, `vllm-overlay
rebase` runs the probes of both series on the release it rebased onto.

A patch is still needed as long as its probes fail without it; once they pass
on upstream's own files, upstream has an equivalent change even if the patch
text no longer says so (a rewrite rather than a verbatim merge). The harness
keeps one environment per pinned release (`cache_root()/envs/<release>`) with
a patched build installed; the pytest plugin `vllm_overlay.testing.pristine`
serves the pristine upstream files in place of the patched ones, and the raw
verdict of each probe is read from a JUnit report. After a rebase the plugin
`vllm_overlay.testing.worktree` serves the release's files patched by the
series just written instead, without rebuilding or reinstalling anything.
"""

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from vllm_overlay.common import cache_layout
from vllm_overlay.common.locations import REPO_ROOT
from vllm_overlay.series.facts import triton_cpu_standin_args
from vllm_overlay.series.model import Series
from vllm_overlay.testing.outcomes import FAILED_OUTSIDE_ASSERTION, outside_assertion
from vllm_overlay.upstream.fetch import last_error_line

STILL_NEEDED = "still needed"
EQUIVALENT = "upstream-equivalent"
INCONCLUSIVE = "inconclusive"
PASSED, FAILED = "passed", "failed"
PRISTINE_PLUGIN = "vllm_overlay.testing.pristine"
WORKTREE_PLUGIN = "vllm_overlay.testing.worktree"

_INSTALLED_RELEASE = (
    "from vllm_overlay.series.manifest import read_installed_manifest\n"
    "print((read_installed_manifest() or {}).get('release', ''))\n"
)


def no_environment(release: str, first: str = "") -> str:
    """The probe verdict of a release without a test environment here, with
    what makes one: `tools/test.sh RELEASE`, after `first`, the commands a
    release without a series of its own needs before it (`tools/test.sh`
    builds pinned releases with a series only)."""
    return f"no environment (run {first}tools/test.sh {release})"


def env_python(release: str, cache: Path) -> Path | None:
    """The python of the release's cached test environment, if it holds a
    patched build of that very release (an environment left from another
    release, or a half-built one, would give verdicts about the wrong files)."""
    python = cache_layout.release_env(cache, release) / "bin" / "python"
    if not python.is_file():
        return None
    proc = subprocess.run(
        [str(python), "-c", _INSTALLED_RELEASE],
        capture_output=True,
        text=True,
        env=_probe_env(),
        check=False,
    )
    return python if proc.stdout.strip() == release else None


def _probe_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The inherited environment, importing vllm_overlay from this checkout
    (the release environment lacks it) and never reaching the hub."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "HF_HUB_OFFLINE": "1",
        **(extra or {}),
    }


def run_pristine(
    probes: list[str], release: str, python: Path, repo: Path
) -> dict[str, str]:
    """Run `probes` in one pytest process on `release`'s pristine sources and
    return each probe's outcome: "passed", "failed", or what kept it from a
    verdict."""
    return run_probes(probes, release, python, repo, PRISTINE_PLUGIN)


def run_probes(
    probes: list[str],
    release: str,
    python: Path,
    repo: Path,
    plugin: str,
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Run `probes` in one pytest process of `release`'s environment with the
    source plugin `plugin` (and the triton-cpu stand-in where the release
    facts ask for it; `env` added to the environment) and return each
    probe's outcome."""
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-probe-") as scratch:
        report = Path(scratch) / "probes.xml"
        command = [str(python), "-m", "pytest", "-p", "no:cacheprovider"]
        command += ["-p", plugin, *triton_cpu_standin_args(release), "-q", "--tb=no"]
        command += ["--junit-xml", str(report), *probes]
        proc = subprocess.run(
            command,
            cwd=repo,
            env=_probe_env(env),
            capture_output=True,
            text=True,
            check=False,
        )
        if not report.is_file():
            reason = last_error_line(proc.stdout + proc.stderr)
            return dict.fromkeys(probes, f"not run ({reason})")
        return probe_outcomes(probes, report)


def probe_outcomes(probes: Iterable[str], report: Path) -> dict[str, str]:
    """Each probe id's outcome in a JUnit report; a parametrised probe passes
    (fails) only if every case does."""
    cases = [_case_outcome(case) for case in ET.parse(report).iter("testcase")]
    outcomes = {}
    for probe in probes:
        address = _junit_address(probe)
        found = {o for where, o in cases if _belongs(where, address)}
        outcomes[probe] = found.pop() if len(found) == 1 else _combined(found)
    return outcomes


def _junit_address(node_id: str) -> tuple[str, str]:
    """A node id as JUnit's (classname, name): `tests/x.py::C::t` ->
    (`tests.x.C`, `t`), the way pytest's junitxml writes it."""
    path, *names = node_id.split("::")
    parts = [path.removesuffix(".py").replace("/", "."), *names]
    return ".".join(parts[:-1]), parts[-1]


def _belongs(case: tuple[str, str], probe: tuple[str, str]) -> bool:
    return case[0] == probe[0] and (
        case[1] == probe[1] or case[1].startswith(probe[1] + "[")
    )


def _case_outcome(case: ET.Element) -> tuple[tuple[str, str], str]:
    """A test case's address and outcome; a setup error, a skip or a failure
    outside the test's assertion (`vllm_overlay.testing.outcomes`) proves
    nothing either way, so it is neither "passed" nor "failed"."""
    address = (case.get("classname", ""), case.get("name", ""))
    for tag in ("error", "skipped"):
        if case.find(tag) is not None:
            return address, tag
    if case.find("failure") is None:
        return address, PASSED
    for prop in case.iter("property"):
        if prop.get("name") == FAILED_OUTSIDE_ASSERTION:
            return address, outside_assertion(prop.get("value", "an exception"))
    return address, FAILED


def _combined(found: set[str]) -> str:
    """The outcome of a probe whose cases did not all end alike (or that has
    no case in the report: its id names no test, or collection failed); a
    case without a verdict makes the probe's the same."""
    if not found:
        return "not run"
    if "error" in found:
        return "error"
    odd = sorted(found - {PASSED, FAILED})
    return odd[0] if odd else "mixed cases"


def probe_verdict(probes: Iterable[str], outcomes: dict[str, str]) -> str:
    """One patch's verdict from its probes' outcomes on the unpatched release:
    every probe failing means the patch is still needed, every one passing
    that upstream has an equivalent; a probe without a verdict (an error, a
    skip) makes the whole verdict inconclusive, since it proves nothing."""
    results = {probe: outcomes.get(probe, "not run") for probe in probes}
    if all(r == FAILED for r in results.values()):
        return STILL_NEEDED
    if all(r == PASSED for r in results.values()):
        return EQUIVALENT
    odd = [f"{_short(p)} {r}" for p, r in results.items() if r not in (PASSED, FAILED)]
    if odd:
        return f"{INCONCLUSIVE}: " + ", ".join(odd)
    passed = [_short(p) for p, r in results.items() if r == PASSED]
    return "mixed: passes: " + ", ".join(passed)


def _short(probe: str) -> str:
    """`tests/probes/test_x.py::test_y` -> `test_x.py::test_y`."""
    return probe.rsplit("/", 1)[-1]


def probe_verdicts(
    series: Series, release: str, repo: Path, cache: Path, first: str = ""
) -> dict[str, str]:
    """Patch name -> probe verdict for every patch of `series` on `release`,
    running all the series' probes in one pytest process; without an
    environment, `no_environment(release, first)`."""
    python = env_python(release, cache)
    if python is None:
        missing = no_environment(release, first)
        return {patch.name: missing for patch in series.patches}
    probes = series.probe_ids
    print(
        f"vllm-overlay: running {len(probes)} probes for vLLM {release} "
        "on its unpatched sources ...",
        file=sys.stderr,
    )
    outcomes = run_pristine(probes, release, python, repo)
    return {
        patch.name: probe_verdict(patch.probes, outcomes) for patch in series.patches
    }


@dataclass(frozen=True)
class RebasedProbes:
    """The probes of a rebase run on the release it rebased onto, patched by
    the series it wrote: each kept patch's own, and every probe of the old
    series that the new one cites no more (a dropped patch's, or a `Probe:`
    trailer lost on the way). A merge moves text, not meaning: a probe that
    fails here is a change the rebase lost."""

    from_release: str
    release: str
    kept: dict[str, tuple[str, ...]]
    uncited: dict[str, tuple[str, ...]]
    outcomes: dict[str, str]
    skipped: str | None = None

    @property
    def failing(self) -> list[str]:
        """Every probe that ran without passing, sorted."""
        return sorted(p for p, outcome in self.outcomes.items() if outcome != PASSED)


def probe_rebased(
    from_series: Series, to_series: Series, patches: Path, cache: Path
) -> RebasedProbes:
    """Run the probes of both series (see `RebasedProbes`) in one pytest
    process in the new release's cached test environment, which serves its
    files patched by the series under `patches` (the checkout's)."""
    release = to_series.release.version
    cited = set(to_series.probe_ids)
    uncited = {
        probe: tuple(p.name for p in from_series.patches if probe in p.probes)
        for probe in from_series.probe_ids
        if probe not in cited
    }
    kept = {patch.name: patch.probes for patch in to_series.patches}
    report = RebasedProbes(from_series.release.version, release, kept, uncited, {})
    python = env_python(release, cache)
    if python is None:
        return replace(report, skipped=_no_rebase_environment(release))
    probes = sorted(cited | set(uncited))
    print(
        f"vllm-overlay: running {len(probes)} probes on vLLM {release} patched "
        "by the new series ...",
        file=sys.stderr,
    )
    outcomes = run_probes(
        probes,
        release,
        python,
        patches.parent,
        WORKTREE_PLUGIN,
        {"VLLM_OVERLAY_PATCHES": str(patches)},
    )
    return replace(report, outcomes=outcomes)


def _no_rebase_environment(release: str) -> str:
    return (
        f"vLLM {release} has no cached test environment holding its build; "
        f"`tools/test.sh {release}` builds one and runs every test under "
        "tests/probes/ on the new series"
    )


def format_rebased(report: RebasedProbes) -> list[str]:
    """The report's lines: one a kept patch, one a probe the new series no
    longer cites, or the one line saying why no probe ran."""
    if report.skipped is not None:
        return [f"probes   skipped: {report.skipped}"]
    lines = []
    for patch, probes in report.kept.items():
        failing = [
            f"{_short(p)} {report.outcomes.get(p, 'not run')}"
            for p in probes
            if report.outcomes.get(p) != PASSED
        ]
        verdict = f"fail: {', '.join(failing)}" if failing else "pass"
        lines.append(f"probes   {patch}: {verdict}")
    for probe, cited_by in report.uncited.items():
        lines.append(
            f"probes   {_short(probe)} {report.outcomes.get(probe, 'not run')}: "
            f"cited by no patch of {report.release} (in {report.from_release}: "
            f"{', '.join(cited_by)})"
        )
    return lines
