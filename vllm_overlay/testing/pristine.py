"""pytest plugin: run tests against the *unpatched* sources of the installed
patched vLLM, with their verdicts as they are.

Installing a second, unpatched vLLM next to every patched one would double the
environments, so this plugin takes the pristine upstream versions of exactly
the files the installed series changed (from the pinned source wheel recorded
in the installed manifest, re-verified against its sha256) and serves them in
place of the patched ones. Everything else is the same installed release.

Use: `pytest -p vllm_overlay.testing.pristine TESTS...`. `vllm-overlay status
--probe` reads the raw verdicts (a probe that passes here no longer needs its
patch); `vllm_overlay.testing.unpatched` builds on this plugin and inverts them.
A test whose call fails outside its assertion is marked so in the JUnit report
(`outcomes.FAILED_OUTSIDE_ASSERTION`): such a failure proves nothing.
"""

import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest

from vllm_overlay.common import cache_layout
from vllm_overlay.common.locations import cache_root
from vllm_overlay.runtime import source_overlay
from vllm_overlay.series.manifest import read_installed_manifest
from vllm_overlay.testing.outcomes import FAILED_OUTSIDE_ASSERTION
from vllm_overlay.upstream.fetch import sha256_of, wheel_members

RELEASE = pytest.StashKey[str]()
_SCRATCH = pytest.StashKey[tempfile.TemporaryDirectory[str]]()


def pristine_sources(
    manifest: dict, relatives: Iterable[str], scratch: Path
) -> dict[str, Path]:
    """Module name -> a file in `scratch` holding the upstream source of each
    of `relatives`, read from the pinned source wheel the manifest names
    (re-verified against its sha256)."""
    source = manifest["source"]
    wheel = cache_layout.wheels(cache_root()) / source["filename"]
    if not wheel.is_file() or sha256_of(wheel) != source["sha256"]:
        raise pytest.UsageError(
            f"the pinned source wheel {source['filename']} is not in the cache "
            f"{wheel.parent} (build the release once with vllm-overlay first)"
        )
    relatives = sorted(relatives)
    members = wheel_members(wheel, relatives)
    sources = {}
    for relative in relatives:
        if relative not in members:
            raise pytest.UsageError(
                f"{relative} is new in the series; the unpatched release "
                "has no such module to test against"
            )
        target = scratch / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(members[relative])
        sources[source_overlay.module_name(relative)] = target
    return sources


def installed_touched_files(manifest: dict) -> set[str]:
    """The package files the installed series changed."""
    return {f for patch in manifest["patches"] for f in patch["files"]}


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Install the overlay before any conftest or test module imports vLLM."""
    manifest = read_installed_manifest()
    if manifest is None:
        raise pytest.UsageError(
            "the installed vLLM carries no vllm-overlay series: nothing to unpatch"
        )
    scratch = tempfile.TemporaryDirectory(prefix="vllm-overlay-pristine-")
    early_config.stash[_SCRATCH] = scratch
    early_config.stash[RELEASE] = manifest["release"]
    touched = installed_touched_files(manifest)
    source_overlay.install(pristine_sources(manifest, touched, Path(scratch.name)))


def failed_outside_assertion(call: pytest.CallInfo[None]) -> str | None:
    """The type of the exception `call` raised, unless it failed its
    assertion (an `assert` or `pytest.fail`, "DID NOT RAISE" included) or
    did not fail: only a failed assertion is the behaviour a probe names
    (`vllm_overlay.testing.outcomes`)."""
    return None if call.excinfo is None else _outside(call.excinfo.value)


def _outside(exception: BaseException) -> str | None:
    """`exception`'s type unless it is a failed assertion; for a group (a
    property test's distinct failures), the first member's that is not."""
    if isinstance(exception, BaseExceptionGroup):
        kinds = (_outside(member) for member in exception.exceptions)
        return next((kind for kind in kinds if kind is not None), None)
    if isinstance(exception, (AssertionError, pytest.fail.Exception)):
        return None
    return type(exception).__name__


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Mark a test whose call failed outside its assertion; JUnit writes the
    mark as a property of the test case (with its teardown report)."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "call" and report.failed:
        kind = failed_outside_assertion(call)
        if kind is not None:
            item.user_properties.append((FAILED_OUTSIDE_ASSERTION, kind))


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash[_SCRATCH].cleanup()


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"vllm-overlay: probes run against UNPATCHED vLLM {config.stash[RELEASE]} "
        "sources"
    )
