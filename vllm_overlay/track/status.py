"""Where each patch stands against a vLLM release: `vllm-overlay status`.

For a release (pinned, or any other published one) this checks every patch of
the nearest series against the release's own files, with the earlier patches
applied where they applied, and gives each patch one verdict:

- "applies exactly": `git apply` places every hunk where the patch says;
- "applies only with offset": every hunk applies, but some only some lines
  away; the build refuses that (see `upstream/applier.py`), so the patch
  needs a refresh;
- "merges (3-way)": it does not apply as it stands, but git's 3-way merge
  with the series' own release as the merge base (what `rebase` does) takes
  it without a conflict; `rebase` keeps it, refreshed (see `_merge`);
- "already present": the patch reverse-applies, or merges to no change, so
  upstream has the change;
- "dropped by rebase": a `Backport <release>` patch that `rebase` onto this
  release drops unseen (`Patch.backport_drop`), so it is not applied either;
- "conflicts": a hunk's context no longer matches, and the 3-way merge
  conflicts too, so `rebase` stops at it; the detail names every failing hunk
  of every file. "conflicts (depends on P, which conflicts)"
  when every failure comes from an earlier patch P left out here, not from
  upstream (see `_dependency`).

A pinned release without a series yet (pinned, not rebased onto yet) is read
from its pinned wheel and, like an unpinned one, checked against the nearest
series that exists; `--record` keeps none of its verdicts. A commit of a vLLM
git clone (`--source`, `status_at`) is read from the clone (`git_source.py`)
and checked against the series of the newest release it contains.

The patches are judged in series order, each on the release's files with
the earlier patches applied (or merged) where they apply, as `rebase`
replays them. A patch that does not apply as it stands is merged as `rebase`
merges it: `git merge-file` (diff3, as `rebase`'s cherry-pick) of each file it
touches, with the series' own release plus the earlier patches as the base,
that plus the patch as theirs, and this release's files as ours. `git apply
--3way` cannot stand in for it: it merges from the preimage blobs named by the
patch's `index` lines, which a tree made from a release wheel lacks. Without
that merge, a patch whose context changed a few lines away from its own
change was called a conflict although `rebase` merges it (0.32.0's
`multi-connector-weighted-load-selection` on 0.31.0).

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
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from pathlib import Path

from packaging.version import Version

from vllm_overlay import atomic, cache_layout
from vllm_overlay.errors import OverlayError
from vllm_overlay.git import git_run
from vllm_overlay.locations import cache_root, patches_root
from vllm_overlay.locking import exclusive
from vllm_overlay.series.loader import (
    load_series,
    nearest_release,
    nearest_series,
    pinned_releases,
)
from vllm_overlay.series.model import (
    PACKAGE_DIR,
    TESTS_DIR,
    Patch,
    Series,
    has_series,
)
from vllm_overlay.series.pins import Dist, ReleasePin, find_pin, normalise_version
from vllm_overlay.track.git_source import GitSource
from vllm_overlay.track.probing import no_environment, probe_verdicts
from vllm_overlay.track.scratch_tree import pristine_files
from vllm_overlay.track.table import TABLE_FILE, render_table
from vllm_overlay.track.verdicts import record_verdicts
from vllm_overlay.trees import write_tree
from vllm_overlay.upstream.applier import (
    HunkProblem,
    apply_error,
    git_apply,
    hunk_problems,
)
from vllm_overlay.upstream.fetch import (
    fetch_sdist_tree,
    fetch_wheel,
    last_error_line,
    pip_download,
    wheel_members,
)


class Verdict(StrEnum):
    """How one patch meets one release (see the module docstring)."""

    EXACT = "applies exactly"
    OFFSET = "applies only with offset"
    MERGES = "merges (3-way)"
    PRESENT = "already present"
    CONFLICT = "conflicts"
    DROPPED = "dropped by rebase"


# `git apply --reject` error lines about a hunk (`hunk_problems` reads those).
_HUNK_ERROR = re.compile(r"error: (while searching for:|patch failed: )")
_COLUMNS = ("release", "series", "patch", "verdict", "detail")


@dataclass(frozen=True)
class PatchStatus:
    """One patch of a series against one release: a row of the table."""

    release: str
    pinned: bool
    series: str
    patch: str
    verdict: Verdict
    detail: str
    probe: str | None = None
    # For a git commit (`status --source`): the commit and its date.
    commit: str | None = None
    commit_date: str | None = None
    # A conflict that an earlier, left-out patch causes (`_dependency`).
    depends_on: str | None = None
    # The hunks that did not match (a conflict, or a patch that merges 3-way)
    # or applied only elsewhere (an offset), each with its file: what the
    # nightly names.
    hunks: tuple[HunkProblem, ...] = ()

    @property
    def verdict_text(self) -> str:
        """The verdict as the table, the JSON and `verdicts.toml` say it."""
        if self.depends_on is None:
            return str(self.verdict)
        return f"{self.verdict} (depends on {self.depends_on})"


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
    as it stands needs them (see `_merge` and `_dependency`)."""

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
        f"vllm=={version}", directory, ["--only-binary", ":all:", "-d", str(out)]
    )
    wheels = sorted(out.glob("vllm-*.whl"))
    if run.returncode != 0 or len(wheels) != 1:
        raise OverlayError(
            f"cannot download vllm=={version}; is it a published release, and is "
            f"the package index reachable? ({last_error_line(run.output)})"
        )
    return wheels[0]


def check_release(
    series: Series,
    version: str,
    pinned: bool,
    files: Mapping[str, bytes],
    own_files: Callable[[], Mapping[str, bytes]],
    trees: tuple[str, ...] = (PACKAGE_DIR,),
) -> list[PatchStatus]:
    """Each patch's verdict against the release's `files` (those the series
    touches under `trees`, as vLLM `version` has them), as the rebased
    series would meet them: the patches that apply (exactly or with offset)
    are applied, and those that merge (`_merge`) merged, so later patches
    see their changes; one that `rebase` drops, or that conflicts, is left
    out. Only the hunks under `trees` are judged, and merged. `own_files`
    reads the same files as the series' own release ships them, for
    `_merge` and `_dependency`."""
    rows = []
    earlier: list[tuple[Patch, Verdict]] = []
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-status-") as scratch:
        root = Path(scratch) / "tree"
        _write(files, root)
        for patch in series.patches:
            verdict, detail, hunks = judge(patch, root, version, trees)
            depends_on = None
            if verdict is Verdict.CONFLICT:
                merged = _merge(patch, root, [p for p, _ in earlier], own_files, trees)
                if merged is not None:
                    verdict, detail = _merged_verdict(merged, root, series)
                    _write_files(root, merged)
                else:
                    depends_on = _dependency(patch, root, earlier, own_files, trees)
            if verdict in (Verdict.EXACT, Verdict.OFFSET):
                git_apply(patch, root, trees)
            earlier.append((patch, verdict))
            rows.append(
                PatchStatus(
                    version,
                    pinned,
                    series.release.version,
                    patch.name,
                    verdict,
                    detail,
                    depends_on=depends_on,
                    hunks=hunks,
                )
            )
    return rows


def _write(files: Mapping[str, bytes], root: Path) -> None:
    """Write `files` under `root`; a file upstream lacks is left out, as the
    patch that creates it expects."""
    root.mkdir(parents=True)
    write_tree(root, files)


def judge(
    patch: Patch, root: Path, version: str, trees: tuple[str, ...] = (PACKAGE_DIR,)
) -> tuple[Verdict, str, tuple[HunkProblem, ...]]:
    """The verdict, its detail and the hunks to blame for one patch against
    the files under `trees` in `root`, those of vLLM `version`."""
    dropped = patch.backport_drop(version)
    if dropped is not None:
        return Verdict.DROPPED, dropped, ()
    forward = git_apply(patch, root, trees, "--check")
    if forward.returncode == 0:
        problems = tuple(hunk_problems(patch, forward.stderr))
        if not problems:
            return Verdict.EXACT, "", ()
        return (
            Verdict.OFFSET,
            "; ".join(
                f"{p.file} hunk #{p.hunk} at line {p.line} ({p.kind})" for p in problems
            ),
            problems,
        )
    if git_apply(patch, root, trees, "--check", "--reverse").returncode == 0:
        return Verdict.PRESENT, "reverse-applies", ()
    hunks, files = _failed(patch, root, trees)
    reasons = [_mismatch(p) for p in hunks] + files
    return (
        Verdict.CONFLICT,
        "; ".join(reasons) or apply_error(forward.stderr),
        tuple(hunks),
    )


def failures(
    patch: Patch, root: Path, trees: tuple[str, ...] = (PACKAGE_DIR,)
) -> list[str]:
    """Why `patch` does not apply to the files under `trees` in `root`: every
    hunk that does not match, then every file git cannot patch at all
    (missing, already there); empty when it applies."""
    hunks, files = _failed(patch, root, trees)
    return [_mismatch(p) for p in hunks] + files


def _failed(
    patch: Patch, root: Path, trees: tuple[str, ...]
) -> tuple[list[HunkProblem], list[str]]:
    """The hunks of `patch` that do not match, and the error of every file
    git cannot patch at all.

    Plain `git apply` stops checking a file at its first failing hunk; with
    `--reject` it tries every hunk. With `--check` that writes nothing, but
    exits 0 whatever failed, so only the error lines tell."""
    proc = git_apply(patch, root, trees, "--check", "--reject")
    hunks = [p for p in hunk_problems(patch, proc.stderr) if p.kind == "mismatch"]
    files = [
        line.removeprefix("error: ")
        for line in proc.stderr.splitlines()
        if line.startswith("error: ") and not _HUNK_ERROR.match(line)
    ]
    return hunks, files


def _mismatch(problem: HunkProblem) -> str:
    return (
        f"{problem.file} hunk #{problem.hunk} (at line {problem.line}) does not match"
    )


def _merge(
    patch: Patch,
    root: Path,
    earlier: list[Patch],
    own_files: Callable[[], Mapping[str, bytes]],
    trees: tuple[str, ...],
) -> dict[str, bytes | None] | None:
    """The files under `trees` `patch` touches as `rebase`'s 3-way merge
    leaves them on the release's files in `root` (None: deleted), or None
    when that merge conflicts.

    The base is the series' own release with every `earlier` patch of the
    series applied (the FROM side `rebase` picks from, whatever the earlier
    patches did here), theirs that plus `patch`. A file both sides create or
    delete differently, or that one side deleted and the other changed,
    conflicts, as in `rebase`'s cherry-pick."""
    names = [name for name in patch.files if name.startswith(trees)]
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-merge-") as scratch:
        side = Path(scratch) / "tree"
        _write(own_files(), side)
        for applied in earlier:
            if git_apply(applied, side, trees).returncode != 0:
                return None
        base = {name: _read(side / name) for name in names}
        if git_apply(patch, side, trees).returncode != 0:
            return None
        merged = {}
        for name in names:
            ours, old, theirs = _read(root / name), base[name], _read(side / name)
            if ours in (old, theirs):
                merged[name] = theirs
            elif old == theirs:
                merged[name] = ours
            elif ours is None or old is None or theirs is None:
                return None
            else:
                result = _merge_file(ours, old, theirs, Path(scratch) / "merge")
                if result is None:
                    return None
                merged[name] = result
        return merged


def _merge_file(ours: bytes, base: bytes, theirs: bytes, scratch: Path) -> bytes | None:
    """`git merge-file --diff3` of one file's three versions: the merged
    bytes, or None when the merge has a conflict (its exit status counts
    them)."""
    scratch.mkdir(exist_ok=True)
    paths = []
    for label, content in (("ours", ours), ("base", base), ("theirs", theirs)):
        paths.append(scratch / label)
        paths[-1].write_bytes(content)
    proc = git_run(
        scratch,
        *("merge-file", "--diff3", *map(str, paths)),
        env={"GIT_CEILING_DIRECTORIES": str(scratch.parent)},
    )
    if proc.returncode != 0:
        return None
    return paths[0].read_bytes()


def _merged_verdict(
    merged: Mapping[str, bytes | None], root: Path, series: Series
) -> tuple[Verdict, str]:
    """A merged patch's verdict: "already present" when the merge changes
    nothing (`rebase` drops it), else "merges (3-way)"."""
    changed = [
        name for name, content in merged.items() if _read(root / name) != content
    ]
    if not changed:
        return Verdict.PRESENT, "merges to no change (3-way): rebase drops it"
    return Verdict.MERGES, (
        f"{', '.join(changed)}: merged with {series.release.version} as the base, "
        "as rebase merges it; rebase keeps it, refreshed"
    )


def _write_files(root: Path, files: Mapping[str, bytes | None]) -> None:
    """Put `files` in `root`, deleting those that are None."""
    write_tree(root, {n: c for n, c in files.items() if c is not None})
    for name, content in files.items():
        if content is None and (root / name).exists():
            (root / name).unlink()


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def _dependency(
    patch: Patch,
    root: Path,
    earlier: list[tuple[Patch, Verdict]],
    own_files: Callable[[], Mapping[str, bytes]],
    trees: tuple[str, ...],
) -> str | None:
    """The earlier patches left out on this release that a conflicting
    `patch` fails for want of (and why each is left out), or None.

    On its own release's files the series applies in order. There, without
    the earlier patches left out here (`earlier`: each with its verdict), the
    failures left need them; when every failure on this release is among
    those, an earlier patch caused the conflict, not upstream. The answer
    names each left-out patch without which alone `patch` fails there."""
    applied = (Verdict.EXACT, Verdict.OFFSET, Verdict.MERGES, Verdict.PRESENT)
    left_out = [(p, v) for p, v in earlier if v not in applied]
    if not left_out:
        return None

    def failing_without(skipped: set[str]) -> set[str]:
        applied = [p for p, _ in earlier if p.name not in skipped]
        return _failures_on(own_files(), applied, patch, trees)

    wanting = failing_without({p.name for p, _ in left_out})
    if not wanting or not set(failures(patch, root, trees)) <= wanting:
        return None
    needed = [(p, v) for p, v in left_out if failing_without({p.name})]
    if not needed:
        return None
    return ", and ".join(
        f"{p.name}, which {'rebase drops' if v is Verdict.DROPPED else 'conflicts'}"
        for p, v in needed
    )


def _failures_on(
    files: Mapping[str, bytes],
    applied: list[Patch],
    patch: Patch,
    trees: tuple[str, ...],
) -> set[str]:
    """`failures` of `patch` on `files` once `applied` are applied in order
    (those that do not apply are skipped, as git applies a patch whole)."""
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-status-own-") as scratch:
        root = Path(scratch) / "tree"
        _write(files, root)
        for earlier in applied:
            git_apply(earlier, root, trees)
        return set(failures(patch, root, trees))


def record_status(
    rows: list[PatchStatus], root: Path | None = None, checked: str | None = None
) -> tuple[list[str], list[str]]:
    """Record the verdicts about each pinned release's own series (the
    release's patches against that release) and regenerate `PATCHES.md`;
    returns the releases recorded and those left as they were recorded
    before. Rows about another release's series say nothing about any patch
    file's own release, so they are not kept; nor are a release's rows whose
    probes could not run (no test environment here): they know less than
    what was recorded."""
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
    patches = {}
    for release in {row.release for row in own}:
        for patch in load_series(root, pins[release]).patches:
            patches[release, patch.name] = patch
    record_verdicts(
        root,
        [
            (row.release, patches[row.release, row.patch], row.verdict_text, row.probe)
            for row in own
        ],
        checked or datetime.date.today().isoformat(),
    )
    atomic.write_text(root.parent / TABLE_FILE, render_table(root))
    return (
        sorted({row.release for row in own}, key=Version),
        sorted(unknown, key=Version),
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
