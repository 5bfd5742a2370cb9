"""A stopped rebase's merge conflicts: read from its scratch repository and
reported for a maintainer to resolve without opening it.

`rebase` cherry-picks with git's diff3 conflict style, so every conflict
region of a file holds three sides between git's markers: TO's, the merge
base (FROM's) and the patch's. The report quotes all three for each region
of each unmerged file, says how each file came to conflict (both changed
it, one side deleted it, ...), and ends with the ways on: `--continue`,
`--skip` or `--abort`.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vllm_overlay.common.git import git

# git's conflict markers (diff3 style) and their place: 0 opens the TO side,
# 1 the merge base, 2 the patch's side, 3 closes.
_MARKERS = ((0, "<<<<<<< "), (1, "||||||| "), (3, ">>>>>>> "))
_UNMERGED_STATES = {
    "UU": "both changed it",
    "AA": "both created it",
    "DU": "vLLM {to} deleted it; the patch changes it",
    "UD": "the patch deletes it; vLLM {to} changed it",
    "AU": "the patch created it; vLLM {to} has it",
    "UA": "vLLM {to} created it; the patch has it",
    "DD": "both deleted it",
}


@dataclass(frozen=True)
class ConflictHunk:
    """One conflict region of a file: the TO side, the merge base and the
    patch's side, as git left them between its markers."""

    line: int
    upstream: str
    base: str
    patch: str


@dataclass(frozen=True)
class FileConflict:
    path: str
    how: str
    hunks: tuple[ConflictHunk, ...]


class Stopped(Protocol):
    """What the report needs of a stopped rebase (`rebase.RebaseOutcome`)."""

    @property
    def stopped_at(self) -> str | None: ...
    @property
    def from_release(self) -> str: ...
    @property
    def to_release(self) -> str: ...
    @property
    def conflicts(self) -> tuple[FileConflict, ...]: ...
    @property
    def repo(self) -> Path | None: ...
    @property
    def source(self) -> str: ...


def conflicts_in(repo: Path, to_version: str) -> tuple[FileConflict, ...]:
    """Every unmerged file of the stopped cherry-pick, with its hunks."""
    conflicts = []
    for line in git(repo, "status", "--porcelain").splitlines():
        code, path = line[:2], line[3:]
        if code not in _UNMERGED_STATES:
            continue
        how = _UNMERGED_STATES[code].format(to=to_version)
        target = repo / path
        text = (
            target.read_text(encoding="utf-8", errors="replace")
            if target.is_file()
            else ""
        )
        conflicts.append(FileConflict(path, how, conflict_hunks(text)))
    return tuple(conflicts)


def conflict_hunks(text: str) -> tuple[ConflictHunk, ...]:
    """The diff3-style conflict regions of `text`: TO side, base, patch side."""
    hunks = []
    sides: list[list[str]] | None = None
    side = start = 0
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        marker = _marker(line)
        if sides is None:
            if marker == 0:
                sides, side, start = [[], [], []], 0, number
        elif marker in (1, 2):
            side = marker
        elif marker == 3:
            hunks.append(ConflictHunk(start, *("".join(s) for s in sides)))
            sides = None
        else:
            sides[side].append(line)
    return tuple(hunks)


def _marker(line: str) -> int | None:
    """Which of git's conflict markers `line` is, if any."""
    if line.rstrip("\n") == "=======":
        return 2
    return next((place for place, m in _MARKERS if line.startswith(m)), None)


def format_conflicts(outcome: Stopped) -> str:
    """The conflict report: enough to resolve without opening the repo."""
    lines = [
        f"{outcome.stopped_at} does not merge onto vLLM {outcome.to_release} "
        f"(3-way, from {outcome.from_release}):"
    ]
    for conflict in outcome.conflicts:
        lines.append(f"  {conflict.path}: {conflict.how}")
        for number, hunk in enumerate(conflict.hunks, start=1):
            lines.append(f"    conflict {number} at line {hunk.line}:")
            for label, text in (
                (f"vLLM {outcome.to_release}", hunk.upstream),
                (f"vLLM {outcome.from_release} (merge base)", hunk.base),
                ("the patch", hunk.patch),
            ):
                lines.append(f"      {label}:")
                lines.extend(f"      | {ln}" for ln in text.splitlines() or [""])
    # A rebase onto a git commit writes a folder, not a release's series:
    # nothing goes into the history.
    skip = (
        "to leave the patch out of the series written to --out (a rebase onto "
        "a git commit records nothing in the history), or `--abort` to give "
        "up. Nothing was written yet."
        if outcome.source
        else "to drop the patch (recorded in the history), or `--abort` to give "
        "up. Nothing under patches/ was written."
    )
    lines += [
        f"Resolve it in {outcome.repo}: edit the files, `git add` them, then run "
        "`vllm-overlay rebase --continue`;",
        f"or `vllm-overlay rebase --skip` {skip}",
    ]
    return "\n".join(lines) + "\n"
