"""Where each patch stands against a vLLM release: `vllm-overlay status`.

For a release (pinned, or any other published one) this reads the files the
nearest series touches from the release's wheel and has every patch judged
on them (`judging.py`: the verdicts, and how a patch that does not apply as
it stands is merged as `rebase` merges it); then it records the verdicts
(`--record`) and prints them as a table or JSON.

A pinned release without a series yet (pinned, not rebased onto yet) is read
from its pinned wheel and, like an unpinned one, checked against the nearest
series that exists; `--record` keeps none of its verdicts. A commit of a vLLM
git clone (`--source`, `status_at`) is read from the clone (`git_source.py`)
and checked against the series of the newest release it contains.

For a release only hunks under `vllm/` are checked: those files come from
the wheel, and the hunks that update upstream's tests need the sdist, which
this does not fetch. A git commit holds both, so `--source` checks the test
hunks too, by the same rules: the harness applies them to upstream's tests
exactly, and a test hunk that conflicts or moved fails `tools/test.sh` as a
package hunk fails the build.

With `probe=True` each row also gets the verdict of the patch's probes on the
unpatched release (see `probing.py`): whether the patch is still needed even
where its text no longer applies, or upstream fixed it another way.
"""

import datetime
import functools
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from packaging.version import Version

from vllm_overlay.common import atomic, cache_layout
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import cache_root, patches_root
from vllm_overlay.common.locking import exclusive
from vllm_overlay.series.loader import (
    load_series,
    nearest_release,
    nearest_series,
    pinned_releases,
)
from vllm_overlay.series.model import (
    PACKAGE_DIR,
    TESTS_DIR,
    Series,
    has_series,
)
from vllm_overlay.series.pins import Dist, ReleasePin, find_pin, normalise_version
from vllm_overlay.track.records.table import TABLE_FILE, render_table
from vllm_overlay.track.records.verdicts import record_verdicts
from vllm_overlay.track.status.judging import PatchStatus, check_release
from vllm_overlay.track.status.probing import (
    INCONCLUSIVE,
    no_environment,
    probe_verdicts,
)
from vllm_overlay.track.workspace.git_source import GitSource
from vllm_overlay.track.workspace.scratch_tree import pristine_files
from vllm_overlay.upstream.fetch import (
    fetch_sdist_tree,
    fetch_wheel,
    last_error_line,
    on_terminal,
    pip_download,
    wheel_members,
)

_COLUMNS = ("release", "series", "patch", "verdict", "detail")


def status(
    versions: list[str],
    root: Path | None = None,
    cache: Path | None = None,
    probe: bool = False,
) -> list[PatchStatus]:
    """The verdict of every patch of the nearest series for each release in
    `versions` (every pinned release when empty), with the probe verdict on
    the unpatched release when `probe` is set."""
    root = root or patches_root()
    cache = cache or cache_root()
    pins = pinned_releases(root)
    wanted = [normalise_version(v) for v in versions] or sorted(pins, key=Version)
    rows: list[PatchStatus] = []
    for asked in wanted:
        pin = find_pin(pins, asked)
        version = pin.version if pin else asked
        nearest = nearest_series(root, pins, version)
        if nearest is None:
            raise OverlayError("no pinned release has a series yet: nothing to check")
        series = load_series(root, nearest)
        checking, first = _checking(version, pin is not None, nearest.version)
        print(f"vllm-overlay: {checking}", file=sys.stderr)
        wheel = _release_wheel(pin, version, cache)
        checked = check_release(
            series,
            version,
            pin is not None,
            wheel_members(wheel, series.touched_files),
            _own_files(series, cache, with_tests=False),
        )
        if probe:
            verdicts = probe_verdicts(series, version, root.parent, cache, first)
            checked = [replace(row, probe=verdicts[row.patch]) for row in checked]
        rows.extend(checked)
    return rows


def _checking(version: str, pinned: bool, nearest: str) -> tuple[str, str]:
    """What `status` says it checks `version` against, and the commands a
    release without a series of its own needs before `tools/test.sh` can
    build it (see `no_environment`): the documented flow, pin then rebase."""
    if nearest == version:
        return f"checking vLLM {version} against the {nearest} series", ""
    rebase = f"vllm-overlay rebase {nearest} {version}"
    how = (
        f"checking it against the {nearest} series, each patch in series order "
        f"on top of the earlier ones, as `{rebase}` would replay them"
    )
    if pinned:
        return (
            f"vLLM {version} is pinned but has no series yet (run `{rebase}`); {how}",
            f"{rebase}, then ",
        )
    return (
        f"vLLM {version} is not pinned and has no series: {how}; to make its "
        f"series, `vllm-overlay pin {version}`, then that rebase "
        "(docs/maintainer/releases.md)",
        f"vllm-overlay pin {version}, {rebase}, then ",
    )


def status_at(
    source: GitSource, root: Path | None = None, cache: Path | None = None
) -> list[PatchStatus]:
    """The verdict of every patch of the nearest series against a vLLM git
    commit (`git_source`): the series of the newest release the commit
    contains, else the newest series. The commit holds upstream's tests, so
    the hunks that update them are judged too."""
    root = root or patches_root()
    pins = pinned_releases(root)
    with_series = {v: pin for v, pin in pins.items() if has_series(root, v)}
    if not with_series:
        raise OverlayError("no pinned release has a series yet: nothing to check")
    if source.release:
        nearest = nearest_release(with_series, source.release)
        after = f"which contains v{source.release}"
    else:
        nearest = with_series[max(with_series, key=Version)]
        after = "which contains no release tag" + (
            " (a shallow clone: `git fetch --unshallow` brings its tags)"
            if source.shallow
            else ""
        )
    series = load_series(root, nearest)
    print(
        f"vllm-overlay: checking {source.repo} at {source.label} "
        f"({source.date}), {after}, against the {nearest.version} series",
        file=sys.stderr,
    )
    checked = check_release(
        series,
        source.release or nearest.version,
        False,
        source.files([*series.touched_files, *series.upstream_test_files]),
        _own_files(series, cache or cache_root(), with_tests=True),
        (PACKAGE_DIR, TESTS_DIR),
    )
    return [
        replace(
            row, release=source.label, commit=source.commit, commit_date=source.date
        )
        for row in checked
    ]


def _own_files(
    series: Series, cache: Path, with_tests: bool
) -> Callable[[], dict[str, bytes]]:
    """The files `series` touches as its own release ships them (upstream's
    tests too, from the pinned sdist, `with_tests`), read (and the pinned
    artifacts fetched) on first use only: just a patch that does not apply
    as it stands needs them (`judging._merge` and `judging._dependency`)."""

    @functools.cache
    def read() -> dict[str, bytes]:
        release = series.release
        wheel = fetch_wheel(release, Dist.VLLM, cache).path
        if not with_tests:
            return wheel_members(wheel, series.touched_files)
        tests = fetch_sdist_tree(release, cache) if series.upstream_test_files else None
        return pristine_files(series, wheel, tests)

    return read


def refuse_unrecordable(versions: list[str], root: Path | None = None) -> None:
    """`--record` keeps verdicts about a pinned release's own series only, so
    any other release named is refused before anything is downloaded,
    checked or printed."""
    root = root or patches_root()
    pins = pinned_releases(root)
    for asked in map(normalise_version, versions):
        pin = find_pin(pins, asked)
        if pin is None or not has_series(root, pin.version):
            raise OverlayError(
                f"vLLM {pin.version if pin else asked} has no series of its own; "
                "--record keeps the verdicts of a pinned release's own series only"
            )


def _release_wheel(pin: ReleasePin | None, version: str, cache: Path) -> Path:
    """A `vllm` wheel of the release: the pinned, sha256-verified one when the
    release is pinned, else whatever the index serves (nothing to verify)."""
    if pin is None:
        return download_unpinned(version, cache)
    return fetch_wheel(pin, Dist.VLLM, cache).path


def download_unpinned(version: str, cache: Path) -> Path:
    """The `vllm` wheel of an unpinned release, cached under `unpinned/`.

    No sha256 is pinned for it, so the output calls the release "unpinned";
    the wheel is only read, never built from.
    """
    target = cache_layout.unpinned(cache) / f"vllm-{version}"
    with exclusive(cache_layout.unpinned(cache)):
        cached = sorted(target.glob("*.whl"))
        if cached:
            return cached[0]
        print(
            f"vllm-overlay: downloading vllm=={version} (unpinned: no sha256 to check)",
            file=sys.stderr,
        )
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
            wheel = _pip_download_wheel(version, Path(tmp))
            target.mkdir(parents=True, exist_ok=True)
            return Path(shutil.move(wheel, target / wheel.name))


def _pip_download_wheel(version: str, directory: Path) -> Path:
    """Download the one `vllm==version` wheel pip picks for this platform
    into `directory/out`."""
    out = directory / "out"
    run = pip_download(
        f"vllm=={version}",
        directory,
        ["--only-binary", ":all:", "-d", str(out)],
        progress=on_terminal(),
    )
    wheels = sorted(out.glob("vllm-*.whl"))
    if run.returncode != 0 or len(wheels) != 1:
        raise OverlayError(
            f"cannot download vllm=={version}; is it a published release, and is "
            f"the package index reachable? ({last_error_line(run.output)})"
        )
    return wheels[0]


@dataclass(frozen=True)
class Recorded:
    """What `record_status` recorded: the releases whose verdicts it wrote,
    those it left as recorded (no test environment here), and the patches it
    left as recorded because their probes proved nothing, each with why."""

    releases: list[str]
    no_environment: list[str]
    inconclusive: list[str]


def record_status(
    rows: list[PatchStatus], root: Path | None = None, checked: str | None = None
) -> Recorded:
    """Record the verdicts about each pinned release's own series (the
    release's patches against that release) and regenerate `PATCHES.md`.
    Rows about another release's series say nothing about any patch file's
    own release, so they are not kept; nor are a release's rows whose probes
    could not run (no test environment here), nor a patch's whose probes
    proved nothing (`probing.INCONCLUSIVE`): they know less than what was
    recorded, which stays."""
    root = root or patches_root()
    pins = pinned_releases(root)
    unknown = {
        row.release
        for row in rows
        if row.pinned
        and row.series == row.release
        and row.probe == no_environment(row.release)
    }
    own = [
        row
        for row in rows
        if row.pinned and row.series == row.release and row.release not in unknown
    ]
    inconclusive = [row for row in own if (row.probe or "").startswith(INCONCLUSIVE)]
    patches = {}
    for release in {row.release for row in own}:
        for patch in load_series(root, pins[release]).patches:
            patches[release, patch.name] = patch
    record_verdicts(
        root,
        [
            (row.release, patches[row.release, row.patch], row.verdict_text, row.probe)
            for row in own
            if row not in inconclusive
        ],
        checked or datetime.date.today().isoformat(),
        unchanged={(row.release, row.patch) for row in inconclusive},
    )
    atomic.write_text(root.parent / TABLE_FILE, render_table(root))
    return Recorded(
        sorted({row.release for row in own}, key=Version),
        sorted(unknown, key=Version),
        [f"{row.patch} on {row.release}: {row.probe}" for row in inconclusive],
    )


def format_table(rows: list[PatchStatus], probe: bool = False) -> str:
    """A plain-text table, one row per release x patch; the `probe` column
    comes before `detail`, whose conflict details are the long cells."""
    columns = (*_COLUMNS[:-1], "probe", _COLUMNS[-1]) if probe else _COLUMNS
    cells = [columns] + [
        (
            _release_label(row),
            row.series,
            row.patch,
            row.verdict_text,
            *((row.probe or "",) if probe else ()),
            row.detail,
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        + "\n"
        for line in cells
    )


def _release_label(row: PatchStatus) -> str:
    """The release cell: whether its verdicts are about its own series."""
    if row.commit is not None:
        return row.release
    if not row.pinned:
        return f"{row.release} (unpinned)"
    if row.series != row.release:
        return f"{row.release} (no series yet)"
    return row.release


def format_json(rows: list[PatchStatus], probe: bool = False) -> str:
    """The rows as a JSON list of objects, for scripts and CI; the `probe`
    field only when asked for, so the shape without `--probe` stays as it was."""
    objects = [{**asdict(row), "verdict": row.verdict_text} for row in rows]
    for obj in objects:
        del obj["depends_on"], obj["hunks"]
        if not probe:
            del obj["probe"]
        if obj["commit"] is None:
            del obj["commit"], obj["commit_date"]
    return json.dumps(objects, indent=2) + "\n"
