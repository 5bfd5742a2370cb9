"""Loading the series: the one way every tool and the runtime get a `Series`.

The maintainer's tools take a series only when it is well-formed
(`load_series`, which runs `checks`); the runtime reads the series an
installed vllm-overlay carries without the checks (`read_series`), since
those need the probe files that only a checkout has, and every series was
linted before it was committed.
"""

import itertools
from pathlib import Path

from packaging.version import Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import PINS_FILE, patches_root
from vllm_overlay.series.checks import series_problems
from vllm_overlay.series.model import (
    SERIES_FILE,
    Series,
    has_series,
    parse_patch,
    read_series_file,
    series_dir,
)
from vllm_overlay.series.pins import ReleasePin, load_pins, resolve_release


def read_series(patches_root: Path, release: ReleasePin) -> Series:
    """The release's series as its files say, each patch parsed (a malformed
    one is an `OverlayError`) but the series not linted."""
    directory = series_dir(patches_root, release.version)
    names = read_series_file(directory / SERIES_FILE)
    return Series(release, directory, tuple(parse_patch(directory / n) for n in names))


def load_series(patches_root: Path, release: ReleasePin) -> Series:
    """The release's series, or an `OverlayError` naming its first defect."""
    directory = series_dir(patches_root, release.version)
    if not has_series(patches_root, release.version):
        raise OverlayError(
            f"vLLM {release.version} has no series ({directory / SERIES_FILE} "
            "does not exist)"
        )
    problems = series_problems(directory, patches_root.parent)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise OverlayError(problems[0] + more)
    return read_series(patches_root, release)


def carried_series(root: Path, release: ReleasePin) -> Series:
    """The release's series as this vllm-overlay carries it, for the commands
    a user runs where no checkout may be (`install`, `verify`): read as the
    runtime reads it, without the checks that need a checkout's probe files,
    and held to the digest its pin records, so that a build from it is the
    revision its version names. An `OverlayError` when it is not."""
    series = read_series(root, release)
    if series.digest != release.series_digest:
        raise OverlayError(
            f"this vllm-overlay's series of vLLM {release.version} is not the one "
            f"recorded for revision {release.revision} (`vllm-overlay pin --bump "
            f"{release.version}` records a changed series under a new revision): "
            "use the series as committed"
        )
    return series


def pinned_releases(root: Path | None = None) -> dict[str, ReleasePin]:
    root = root or patches_root()
    return load_pins(root / PINS_FILE)


def nearest_release(pins: dict[str, ReleasePin], version: str) -> ReleasePin:
    """The pinned release whose series best fits `version`: the nearest in
    release order (fewest major, then minor, then micro releases apart, a
    pre-release counting as its release: 0.30.0 is one minor release from
    0.31.0 and eight from 0.22.1), the older one of two equally near (a
    series meets upstream's changes in the order they were made)."""
    wanted = Version(version).release

    def distance(pinned: str) -> tuple[tuple[int, ...], bool]:
        have = Version(pinned).release
        steps = tuple(
            abs(a - b)
            for a, b in itertools.zip_longest(have[:3], wanted[:3], fillvalue=0)
        )
        return steps, Version(pinned) > Version(version)

    return pins[min(pins, key=distance)]


def nearest_series(
    root: Path, pins: dict[str, ReleasePin], version: str
) -> ReleasePin | None:
    """`nearest_release` among the pinned releases that have a series (None
    when none has one yet): a release pinned but not rebased onto yet has
    nothing to offer."""
    with_series = {v: pin for v, pin in pins.items() if has_series(root, v)}
    return nearest_release(with_series, version) if with_series else None


def release_series(version: str | None, root: Path | None = None) -> Series:
    """The validated series of a pinned release (the newest when None)."""
    root = root or patches_root()
    release = resolve_release(pinned_releases(root), version)
    return load_series(root, release)
