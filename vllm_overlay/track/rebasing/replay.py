"""The scratch repository of `vllm-overlay rebase`, and one patch replayed in it.

`rebase.py` keeps the run: what is pending, kept and dropped, the state file
that lets a stopped run go on, and what is written at the end. This module is
git's side of it, one patch at a time, so that the bookkeeping and the merge
mechanics change apart: the repository built from both releases' files
(`build_repo`), the cherry-pick of one patch with its verdict (`pick`: kept,
dropped because TO has it, or stopped at a conflict), and the acceptance of
the maintainer's resolution of a conflict (`commit_resolution`), which must
leave no unmerged file, unstaged change or conflict marker behind.
"""

import subprocess
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.git import git, git_bytes, git_run
from vllm_overlay.common.trees import write_tree
from vllm_overlay.series.model import Patch, Series
from vllm_overlay.track.rebasing.conflicts import conflict_hunks
from vllm_overlay.track.workspace.scratch_tree import (
    UPSTREAM_TAG,
    commit_identity,
    materialize,
)

TARGET_TAG = "upstream-to"


def build_repo(
    series: Series,
    from_files: Mapping[str, bytes],
    to_files: Mapping[str, bytes],
    to_version: str,
    repo: Path,
) -> dict[str, str]:
    """The scratch repository at `repo`: the files `series` touches as FROM
    ships them (tag `upstream`) with the series as one commit a patch on top,
    and, on the branch `rebased` from `upstream`, the same files as TO ships
    them (tag `upstream-to`), each patch to be cherry-picked onto it, so that
    git merges with the real FROM blobs as the merge base. Returns each
    patch's commit on the FROM side."""
    materialize(series, from_files, repo)
    picks = git(repo, "rev-list", "--reverse", f"{UPSTREAM_TAG}..HEAD").split()
    git(repo, "checkout", "-q", "-b", "rebased", UPSTREAM_TAG)
    for name in from_files:
        if name not in to_files:
            (repo / name).unlink()
    write_tree(repo, to_files)
    git(repo, "add", "-A")
    git(
        repo,
        *("commit", "-q", "--allow-empty", "-m", f"upstream {to_version}"),
        env=commit_identity(),
    )
    git(repo, "tag", TARGET_TAG)
    return {
        patch.name: commit for patch, commit in zip(series.patches, picks, strict=True)
    }


class Picked(StrEnum):
    """How the replay of one patch ended."""

    KEPT = "kept"
    CONFLICT = "conflict"
    DROPPED = "dropped"


def pick(
    repo: Path, patch: Patch, commit: str, to_version: str, to_name: str
) -> tuple[Picked, str]:
    """Replay one patch: how it ended, and why when it was dropped. A
    `Backport` patch is judged by the release `to_version`; the reason names
    TO as `to_name` (the release, or the git commit as `REF@SHA`)."""
    dropped = patch.backport_drop(to_version)
    if dropped is not None:
        return Picked.DROPPED, dropped
    if _reverse_applies(repo, patch):
        return (
            Picked.DROPPED,
            f"reverse-applies: vLLM {to_name} already has the change",
        )
    proc = _git_run(
        repo,
        *("-c", "merge.conflictStyle=diff3"),
        *("cherry-pick", "--keep-redundant-commits", commit),
    )
    if proc.returncode != 0:
        if unmerged(repo):
            return Picked.CONFLICT, ""
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["failed"]
        raise OverlayError(f"git cherry-pick of {patch.name} in {repo}: {lines[-1]}")
    if _git_run(repo, "diff", "--quiet", "HEAD^", "HEAD").returncode == 0:
        git(repo, "reset", "-q", "--hard", "HEAD^")
        return (
            Picked.DROPPED,
            f"empty after a 3-way merge: vLLM {to_name} already has the change",
        )
    return Picked.KEPT, ""


def _reverse_applies(repo: Path, patch: Patch) -> bool:
    return (
        _git_run(repo, "apply", "--check", "--reverse", str(patch.path)).returncode == 0
    )


def commit_resolution(repo: Path, name: str, commit: str) -> bool:
    """Accept the maintainer's resolution of the stopped patch `name` (its
    FROM commit `commit`): every conflict resolved and staged, no marker
    left. True when it is committed with the patch's message, False when
    the resolution changes nothing and the patch is to be dropped."""
    if not cherry_pick_in_progress(repo):
        raise OverlayError(
            f"{repo} is no longer cherry-picking {name}; "
            "`vllm-overlay rebase --skip` or `--abort`"
        )
    still = unmerged(repo)
    if still:
        raise OverlayError(
            f"{name}: still unmerged in {repo}: {', '.join(still)} "
            "(resolve, then `git add` them)"
        )
    if _git_run(repo, "diff", "--quiet").returncode != 0:
        raise OverlayError(f"{name}: {repo} has unstaged changes; `git add` them first")
    marked = _files_with_markers(repo)
    if marked:
        raise OverlayError(f"{name}: conflict markers left in {', '.join(marked)}")
    if _git_run(repo, "diff", "--cached", "--quiet", "HEAD").returncode == 0:
        git(repo, "cherry-pick", "--skip")
        return False
    _commit_with_message_of(repo, commit)
    return True


def _commit_with_message_of(repo: Path, commit: str) -> None:
    """Commit the staged resolution with `commit`'s message, byte for byte.

    Not `cherry-pick --continue`: that commits through git's message clean-up,
    which drops every line starting with `#` (a patch message may hold one)
    and cannot be told otherwise. `git commit` still takes the author from
    CHERRY_PICK_HEAD and ends the cherry-pick."""
    raw = git_bytes(repo, "cat-file", "commit", commit)
    message = repo / ".git" / "MERGE_MSG"
    message.write_bytes(raw.partition(b"\n\n")[2])
    git(
        repo,
        *("commit", "-q", "--cleanup=verbatim", "--file", str(message)),
        env=commit_identity(),
    )


def cherry_pick_in_progress(repo: Path) -> bool:
    return (
        _git_run(repo, "rev-parse", "-q", "--verify", "CHERRY_PICK_HEAD").returncode
        == 0
    )


def unmerged(repo: Path) -> list[str]:
    return git(repo, "diff", "--name-only", "--diff-filter=U").split()


def _files_with_markers(repo: Path) -> list[str]:
    staged = git(repo, "diff", "--cached", "--name-only", "HEAD").split()
    return [
        name
        for name in staged
        if (repo / name).is_file()
        and conflict_hunks((repo / name).read_text(encoding="utf-8", errors="replace"))
    ]


def _git_run(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """git in the scratch repository as its fixed identity, its exit status
    for the caller to read."""
    return git_run(repo, *args, env=commit_identity())
