"""pytest plugin: run probes against the *unpatched* sources of the installed
patched vLLM, and expect them to fail.

A probe proves its patch only if it fails without it. Installing a second,
unpatched vLLM next to every patched one would double the environments, so
this plugin takes the pristine upstream versions of exactly the files the
installed series changed (from the pinned source wheel recorded in the
installed manifest, re-verified against its sha256) and serves them in place
of the patched ones. Everything else is the same installed release.

Use: `pytest -p vllm_overlay.testing.unpatched PROBE_IDS...`. Each probe's
verdict is inverted: a call-phase failure passes ("still needed"), a pass
fails ("passes without the patch: upstream absorbed it, or the probe is
weak"). Setup and collection errors stay errors: they prove nothing.
"""

import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

import pytest

from vllm_overlay import source_overlay
from vllm_overlay.fetch import sha256_of
from vllm_overlay.locations import cache_root
from vllm_overlay.manifest import read_installed_manifest


def pristine_sources(
    manifest: dict, relatives: Iterable[str], scratch: Path
) -> dict[str, Path]:
    """Module name -> a file in `scratch` holding the upstream source of each
    of `relatives`, read from the pinned source wheel the manifest names
    (re-verified against its sha256)."""
    source = manifest["source"]
    wheel = cache_root() / "wheels" / source["filename"]
    if not wheel.is_file() or sha256_of(wheel) != source["sha256"]:
        raise pytest.UsageError(
            f"the pinned source wheel {source['filename']} is not in the cache "
            f"{wheel.parent} (build the release once with vllm-overlay first)"
        )
    sources = {}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for relative in sorted(relatives):
            if relative not in names:
                raise pytest.UsageError(
                    f"{relative} is new in the series; the unpatched release "
                    "has no such module to test against"
                )
            target = scratch / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(relative))
            sources[source_overlay.module_name(relative)] = target
    return sources


def installed_touched_files(manifest: dict) -> set[str]:
    """The package files the installed series changed."""
    return {f for patch in manifest["patches"] for f in patch["files"]}


_RELEASE = pytest.StashKey[str]()
_SCRATCH = pytest.StashKey[tempfile.TemporaryDirectory[str]]()


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Install the overlay before any conftest or test module imports vLLM."""
    manifest = read_installed_manifest()
    if manifest is None:
        raise pytest.UsageError(
            "the installed vLLM carries no vllm-overlay series: nothing to unpatch"
        )
    scratch = tempfile.TemporaryDirectory(prefix="vllm-overlay-unpatched-")
    early_config.stash[_SCRATCH] = scratch
    early_config.stash[_RELEASE] = manifest["release"]
    touched = installed_touched_files(manifest)
    source_overlay.install(pristine_sources(manifest, touched, Path(scratch.name)))


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash[_SCRATCH].cleanup()


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"vllm-overlay: probes run against UNPATCHED vLLM "
        f"{config.stash[_RELEASE]} sources and must fail"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when != "call" or hasattr(report, "wasxfail"):
        return
    release = item.config.stash[_RELEASE]
    if report.failed:
        report.outcome = "passed"
        report.sections.append(
            ("vllm-overlay", f"fails on unpatched vLLM {release}: still needed")
        )
    elif report.passed:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} passes on unpatched vLLM {release}: the probe does "
            "not prove its patch (upstream absorbed it, or the probe is weak)"
        )
