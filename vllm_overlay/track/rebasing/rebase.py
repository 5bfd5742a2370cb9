"""Move a series to another release: `vllm-overlay rebase FROM TO`.

StGit's `rebase --merged` and Electron's 3-way apply, offline: a scratch git
repository holds the files the FROM series touches as FROM ships them (tag
`upstream`), the series as one commit a patch on top, and, on a branch from
`upstream`, the same files as TO ships them (tag `upstream-to`). Each patch is
cherry-picked onto that branch (`replay.py`: the repository and the git side
of each pick), so git merges with the real FROM blobs as the merge base (a
real 3-way merge, which `status` cannot offer from a wheel):

- a patch that reverse-applies on TO, or whose merge leaves nothing to commit,
  was absorbed upstream, and so was a `Backport <release>` patch when TO is
  that release or later (upstream's own form of the change is in TO, even
  where it differs from the backport's text): it is dropped and recorded in the
  append-only history file with the release that absorbed it;
- a clean merge is kept, and re-exported against TO (trailers kept, context
  refreshed, so it applies to TO exactly);
- a conflict stops the run with a report (`conflicts.py`: patch, file, each
  conflicting hunk with the TO side, the merge base and the patch's side)
  and leaves the repository and a state file under `.vllm-overlay/rebase/`
  of the checkout, to be resolved there and resumed with `--continue` (or
  `--skip` the patch, or `--abort`).

Nothing under `patches/` is written before every patch has been replayed; then
the TO series directory appears whole (see `refresh.write_exported`), is
recorded for TO's revision in the pins (`pin.record_series`), CHANGELOG.md
gets TO's entry (`changelog.record_release`), and the history file is
replaced in one rename. A merge moves text, not meaning, so `probe_outcome`
then runs the probes of both series on TO patched by the new series (see
`probing.probe_rebased`). A TO older than FROM is allowed: it backports the
series, and says so.

TO may also be a commit of a vLLM git clone (`start_rebase_onto_source`,
`--source PATH[@REF] --out DIR`): the same replay, its TO files read from the
commit (`git_source.py`), the series written to the new directory DIR, nothing
else written. A kept patch's message has its `path:line` references moved to
TO's lines (`references.py`); those it cannot place are reported as stale.
"""

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import Version

from vllm_overlay.common import atomic
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.git import git, git_run
from vllm_overlay.common.locations import cache_root, patches_root
from vllm_overlay.series.loader import load_series, pinned_releases
from vllm_overlay.series.model import Patch, Series, series_dir
from vllm_overlay.series.pins import Dist, ReleasePin, resolve_release
from vllm_overlay.track.pinning.pin import record_series
from vllm_overlay.track.rebasing.conflicts import (
    FileConflict,
    conflicts_in,
    format_conflicts,
)
from vllm_overlay.track.rebasing.references import (
    FileReader,
    Reference,
    release_files,
    retarget_series,
)
from vllm_overlay.track.rebasing.refresh import (
    export_series,
    write_exported,
    write_series_dir,
)
from vllm_overlay.track.rebasing.replay import (
    TARGET_TAG,
    Picked,
    build_repo,
    cherry_pick_in_progress,
    commit_resolution,
    pick,
)
from vllm_overlay.track.records.changelog import record_release
from vllm_overlay.track.records.history import DroppedPatch, append_history
from vllm_overlay.track.status.probing import RebasedProbes, probe_rebased
from vllm_overlay.track.workspace.git_source import open_git_source
from vllm_overlay.track.workspace.scratch_tree import pristine_files
from vllm_overlay.upstream.fetch import cached_sdist_tree, fetch_sdist_tree, fetch_wheel

STATE_DIR = Path(".vllm-overlay") / "rebase"
_STATE_FILE = "state.json"
_REPORT_FILE = "conflict.txt"


@dataclass
class RebaseState:
    """What a stopped rebase needs to go on: saved as JSON next to its repo."""

    from_release: str
    to_release: str
    commits: dict[str, str]
    pending: list[str]
    kept: list[str] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)
    current: str | None = None
    # The pinned wheels read at the start, for the messages' references.
    from_wheel: str = ""
    to_wheel: str = ""
    # A rebase onto a git commit (`--source`): the clone and commit
    # (`PATH@SHA`), the release whose backports it holds, and the directory
    # the series goes to.
    to_source: str = ""
    to_version: str = ""
    out_dir: str = ""


@dataclass(frozen=True)
class RebaseOutcome:
    """Either finished (`directory` written) or stopped at `conflicts`."""

    from_release: str
    to_release: str
    kept: tuple[str, ...]
    dropped: tuple[DroppedPatch, ...]
    directory: Path | None = None
    stopped_at: str | None = None
    conflicts: tuple[FileConflict, ...] = ()
    repo: Path | None = None
    # The messages' `path:line` references that moved, or could not.
    references: tuple[Reference, ...] = ()
    # Set for a rebase onto a git commit: the clone and commit it read.
    source: str = ""
    # What became of CHANGELOG.md's entry for TO, in a line.
    changelog: str = ""


def state_dir(root: Path) -> Path:
    """Where a stopped rebase waits: in the checkout that holds `root`."""
    return root.parent / STATE_DIR


def start_rebase(
    from_version: str,
    to_version: str,
    root: Path | None = None,
    cache: Path | None = None,
) -> RebaseOutcome:
    """`vllm-overlay rebase FROM TO`: every check before any download, so a
    bad argument costs nothing and leaves nothing behind."""
    root = root or patches_root()
    cache = cache or cache_root()
    _refuse_in_progress(root)
    _check_work_tree(root)
    pins = pinned_releases(root)
    source = resolve_release(pins, from_version)
    target = resolve_release(pins, to_version)
    if source.version == target.version:
        raise OverlayError(f"FROM and TO are the same release ({source.version})")
    series = load_series(root, source)
    existing = series_dir(root, target.version)
    if existing.exists():
        raise OverlayError(
            f"vLLM {target.version} already has a series ({existing}); rebase "
            "writes a new one: remove it first (git keeps the old one)"
        )
    _progress(
        f"rebasing the {source.version} series ({len(series.patches)} patches) "
        f"onto vLLM {target.version}"
    )
    if Version(target.version) < Version(source.version):
        _progress(
            f"vLLM {target.version} is older than {source.version}: this "
            "rebase is a backport"
        )
    from_wheel = fetch_wheel(source, Dist.VLLM, cache).path
    to_wheel = fetch_wheel(target, Dist.VLLM, cache).path
    return _begin(
        root,
        series,
        lambda: _release_files(series, source, from_wheel, cache),
        lambda: _release_files(series, target, to_wheel, cache),
        RebaseState(
            source.version,
            target.version,
            {},
            [p.name for p in series.patches],
            from_wheel=str(from_wheel),
            to_wheel=str(to_wheel),
        ),
    )


def start_rebase_onto_source(
    from_version: str,
    spec: str,
    out: Path,
    root: Path | None = None,
    cache: Path | None = None,
) -> RebaseOutcome:
    """`vllm-overlay rebase FROM --source PATH[@REF] --out DIR`: the FROM
    series replayed onto a vLLM git commit (`git_source`) as onto a release,
    and written to the new directory `out`. Nothing is pinned or recorded and
    the history is not touched: the commit is not a release. A `Backport
    <release>` patch is dropped when the commit contains that release's tag."""
    root = root or patches_root()
    cache = cache or cache_root()
    _refuse_in_progress(root)
    if out.exists():
        raise OverlayError(f"{out} exists; --out names a directory to create")
    release = resolve_release(pinned_releases(root), from_version)
    target = open_git_source(spec)
    series = load_series(root, release)
    _progress(
        f"rebasing the {release.version} series ({len(series.patches)} patches) "
        f"onto {target.repo} at {target.label} ({target.date})"
    )
    from_wheel = fetch_wheel(release, Dist.VLLM, cache).path
    return _begin(
        root,
        series,
        lambda: _release_files(series, release, from_wheel, cache),
        lambda: target.files([*series.touched_files, *series.upstream_test_files]),
        RebaseState(
            release.version,
            target.label,
            {},
            [p.name for p in series.patches],
            from_wheel=str(from_wheel),
            to_source=f"{target.repo.resolve()}@{target.commit}",
            to_version=target.release or release.version,
            out_dir=str(out.resolve()),
        ),
    )


def _begin(
    root: Path,
    series: Series,
    from_files: Callable[[], dict[str, bytes]],
    to_files: Callable[[], dict[str, bytes]],
    state: RebaseState,
) -> RebaseOutcome:
    """Build the scratch repository from both sides' files, save `state`
    with the commits to replay, and replay them; a failure leaves nothing."""
    state_path = state_dir(root)
    try:
        originals = from_files()
        state_path.mkdir(parents=True)
        state.commits = build_repo(
            series, originals, to_files(), state.to_release, state_path / "repo"
        )
    except BaseException:
        shutil.rmtree(state_path, ignore_errors=True)
        raise
    _save(state, root)
    return _replay(state, root)


def continue_rebase(root: Path | None = None) -> RebaseOutcome:
    """`--continue`: commit the maintainer's resolution of the stopped patch
    (or drop it when the resolution is to change nothing), then go on."""
    root = root or patches_root()
    state, repo = _load(root)
    if state.current is not None:
        _commit_resolution(state, repo)
        _save(state, root)
    return _replay(state, root)


def skip_patch(root: Path | None = None) -> RebaseOutcome:
    """`--skip`: drop the stopped patch (recorded in the history with the
    maintainer's decision as the reason, unless TO is a git commit, which
    records nothing), then go on."""
    root = root or patches_root()
    state, repo = _load(root)
    if state.current is None:
        raise OverlayError("the rebase is not stopped at a patch; nothing to skip")
    if cherry_pick_in_progress(repo):
        git(repo, "cherry-pick", "--abort")
    _drop(state, state.current, "skipped by the maintainer at a merge conflict")
    state.current = None
    _save(state, root)
    return _replay(state, root)


def abort_rebase(root: Path | None = None) -> str:
    """`--abort`: forget the rebase; `patches/` was never written."""
    root = root or patches_root()
    path = state_dir(root)
    if not (path / _STATE_FILE).is_file():
        raise OverlayError("no rebase in progress")
    try:
        saved = json.loads((path / _STATE_FILE).read_text(encoding="utf-8"))
        label = f"{saved['from_release']} -> {saved['to_release']}"
    except (ValueError, KeyError, TypeError):
        label = "(its state file was unreadable)"
    shutil.rmtree(path)
    return label


def probe_outcome(
    outcome: RebaseOutcome, root: Path | None = None, cache: Path | None = None
) -> RebasedProbes:
    """The probes of a finished rebase on the TO release, patched by the TO
    series it wrote, in TO's cached test environment (skipped without one)."""
    root = root or patches_root()
    pins = pinned_releases(root)
    return probe_rebased(
        load_series(root, pins[outcome.from_release]),
        load_series(root, pins[outcome.to_release]),
        root,
        cache or cache_root(),
    )


def _refuse_in_progress(root: Path) -> None:
    path = state_dir(root)
    if path.exists():
        raise OverlayError(
            f"a rebase is already in progress ({path}); finish it with "
            "`vllm-overlay rebase --continue` or `--skip`, or drop it with `--abort`"
        )


def _check_work_tree(root: Path) -> None:
    """The series is written into a git work tree whose `patches/` has no
    uncommitted change: the result is reviewed with `git diff`, and nothing a
    maintainer has not committed is overwritten."""
    if not root.is_dir():
        raise OverlayError(f"{root} does not exist: no series work tree to write into")
    proc = git_run(root, "status", "--porcelain", "--", ".", user_config=True)
    if proc.returncode != 0:
        raise OverlayError(
            f"{root} is not in a git work tree; rebase writes the new series "
            "there for review with `git diff`"
        )
    if proc.stdout.strip():
        first = proc.stdout.splitlines()[0][3:]
        raise OverlayError(
            f"{root} has uncommitted changes ({first}, ...); commit or stash them first"
        )


def _release_files(
    series: Series, release: ReleasePin, wheel: Path, cache: Path
) -> dict[str, bytes]:
    """The files `series` touches as `release` ships them: `vllm/` from its
    pinned `wheel`, `tests/` from the pinned sdist (only when needed)."""
    sdist = fetch_sdist_tree(release, cache) if series.upstream_test_files else None
    return pristine_files(series, wheel, sdist)


def _replay(state: RebaseState, root: Path) -> RebaseOutcome:
    """Cherry-pick the pending patches one by one; stop at the first conflict,
    else write the TO series and the history and remove the state."""
    repo = state_dir(root) / "repo"
    patches = _from_patches(state, root)
    while state.pending:
        name = state.pending[0]
        picked, reason = pick(
            repo,
            patches[name],
            state.commits[name],
            state.to_version or state.to_release,
            state.to_release,
        )
        state.pending.pop(0)
        if picked is Picked.CONFLICT:
            state.current = name
            _save(state, root)
            conflicts = conflicts_in(repo, state.to_release)
            outcome = _outcome(
                state, root, stopped_at=name, conflicts=conflicts, repo=repo
            )
            (state_dir(root) / _REPORT_FILE).write_text(
                format_conflicts(outcome), encoding="utf-8"
            )
            return outcome
        if picked is Picked.DROPPED:
            _drop(state, name, reason)
        else:
            state.kept.append(name)
        _save(state, root)
    return _finish(state, root)


def _from_patches(state: RebaseState, root: Path) -> dict[str, Patch]:
    """The FROM series' patches by name: their trailers go into the history."""
    pins = pinned_releases(root)
    series = load_series(root, resolve_release(pins, state.from_release))
    return {patch.name: patch for patch in series.patches}


def _commit_resolution(state: RebaseState, repo: Path) -> None:
    """Accept the maintainer's resolution of `state.current` (`replay`'s
    rules); an empty result drops the patch."""
    name = state.current
    assert name is not None
    if commit_resolution(repo, name, state.commits[name]):
        state.kept.append(name)
    else:
        _drop(state, name, "empty after the maintainer resolved its merge conflict")
    state.current = None


def _drop(state: RebaseState, name: str, reason: str) -> None:
    state.dropped.append({"patch": name, "reason": reason})


def _finish(state: RebaseState, root: Path) -> RebaseOutcome:
    """Write the TO series, record it for TO's revision (`pin.record_series`)
    and append the dropped patches to the history; the state goes last, so a
    failure here can be resumed."""
    repo, cache = state_dir(root) / "repo", cache_root()
    exported = export_series(
        repo,
        TARGET_TAG,
        state.to_release,
        root,
        names_from=series_dir(root, state.from_release),
        allow_empty=True,
    )
    # Upstream's tests, from the sdists cached by the rebase or a test run.
    pins = pinned_releases(root)
    files, old = release_files(
        Path(state.from_wheel), cached_sdist_tree(pins[state.from_release], cache)
    )
    new = (
        _git_reader(state.to_source)
        if state.to_source
        else release_files(
            Path(state.to_wheel), cached_sdist_tree(pins[state.to_release], cache)
        )[1]
    )
    exported, references = retarget_series(
        exported, files, old, new, state.from_release
    )
    entry = ""
    if state.out_dir:
        directory = Path(state.out_dir)
        write_series_dir(exported, state.to_release, directory)
    else:
        directory, _ = write_exported(exported, state.to_release, root)
        record_series(state.to_release, root)
        gone = [(d["patch"], d["reason"]) for d in state.dropped]
        pin = pinned_releases(root)[state.to_release]
        entry = record_release(root.parent, pin, state.from_release, state.kept, gone)
    outcome = _outcome(
        state, root, directory=directory, references=tuple(references), changelog=entry
    )
    if not state.out_dir:
        append_history(root, outcome.dropped)
    shutil.rmtree(state_dir(root))
    return outcome


def _git_reader(spec: str) -> FileReader:
    """The files of the commit a source rebase was started on."""
    source = open_git_source(spec)
    return lambda path: source.files([path]).get(path, b"")


def _outcome(state: RebaseState, root: Path, **fields: object) -> RebaseOutcome:
    patches = _from_patches(state, root)
    dropped = tuple(
        DroppedPatch.of(
            patches[d["patch"]], state.from_release, state.to_release, d["reason"]
        )
        for d in state.dropped
    )
    return RebaseOutcome(
        state.from_release,
        state.to_release,
        tuple(state.kept),
        dropped,
        source=state.to_source,
        **fields,
    )


def _load(root: Path) -> tuple[RebaseState, Path]:
    path = state_dir(root)
    if not (path / _STATE_FILE).is_file():
        raise OverlayError("no rebase in progress")
    state = RebaseState(**json.loads((path / _STATE_FILE).read_text(encoding="utf-8")))
    repo = path / "repo"
    if not (repo / ".git").is_dir():
        raise OverlayError(
            f"the rebase work tree {repo} is missing; `vllm-overlay rebase --abort`"
        )
    return state, repo


def _save(state: RebaseState, root: Path) -> None:
    """Write the state in one rename, so an interrupted run leaves the old one."""
    atomic.write_text(
        state_dir(root) / _STATE_FILE, json.dumps(asdict(state), indent=2) + "\n"
    )


def _progress(message: str) -> None:
    print(f"vllm-overlay: {message}", file=sys.stderr)
