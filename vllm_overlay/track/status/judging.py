"""How one patch meets one release's files: the verdicts of `status`.

`status` (a release's wheel, or a commit of a vLLM clone) and `ci.track_main`
ask the same question of each patch of a series: what would `rebase` do with
it here? This module answers it on a tree of files, whatever they were read
from, so that the way the files are fetched (`status.py`) and the way a patch
is judged change apart. Each patch gets one verdict:

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
"""

import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from vllm_overlay.common.git import git_run
from vllm_overlay.common.trees import write_tree
from vllm_overlay.series.model import PACKAGE_DIR, Patch, Series
from vllm_overlay.upstream.applier import (
    HunkProblem,
    apply_error,
    git_apply,
    hunk_problems,
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
