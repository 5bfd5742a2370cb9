"""Apply a series to upstream files exactly: zero fuzz, zero offset.

`git apply` never fuzzes (every context line must match), but it silently
accepts a hunk found some lines away from where the patch says it belongs.
Drift of that kind is the early warning that upstream moved code under a
patch, so it is an error here too: `git apply -v` reports every offset hunk,
and any report fails the series. All patches are applied in a scratch
directory first; callers write output only after the whole series applied.
"""

import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.git import git_run
from vllm_overlay.common.trees import write_tree
from vllm_overlay.series.model import PACKAGE_DIR, TESTS_DIR, Patch, Series

_CHECKING = re.compile(r"^Checking patch (\S+)\.\.\.$")
_OFFSET = re.compile(r"^Hunk #(\d+) succeeded at (\d+) \((offset|fuzz) .*\)\.$")
_FAILED = re.compile(r"^error: patch failed: (\S+):(\d+)$")
_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", re.MULTILINE)


def apply_series(
    series: Series, originals: Mapping[str, bytes], tree: str = PACKAGE_DIR
) -> dict[str, bytes | None]:
    """Patched content of every file under `tree` (`vllm/` or `tests/`) the
    series touches (None: deleted). Hunks for the other tree are skipped.

    `originals` holds the upstream bytes of those files that exist upstream; a
    file missing from it must be created by its first patch.
    """
    files = {PACKAGE_DIR: series.touched_files, TESTS_DIR: series.upstream_test_files}
    if tree not in files:
        raise ValueError(f"tree must be {PACKAGE_DIR!r} or {TESTS_DIR!r}, not {tree!r}")
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-apply-") as scratch:
        root = Path(scratch)
        write_tree(root, originals)
        for patch in series.patches:
            if any(f.startswith(tree) for f in patch.files):
                _apply_exactly(patch, root, series.release.version, tree)
        return {
            name: (root / name).read_bytes() if (root / name).exists() else None
            for name in files[tree]
        }


def _apply_exactly(patch: Patch, root: Path, version: str, tree: str) -> None:
    proc = git_apply(patch, root, tree)
    where = f"{patch.name} does not apply exactly to vLLM {version}"
    for problem in hunk_problems(patch, proc.stderr):
        if problem.kind == "mismatch":
            raise OverlayError(
                f"{where}: {problem.file} hunk #{problem.hunk} (at line "
                f"{problem.line}) does not match"
            )
        raise OverlayError(
            f"{where}: {problem.file} hunk #{problem.hunk} only applies at line "
            f"{problem.line} ({problem.kind}); refresh the patch"
        )
    if proc.returncode != 0:
        raise OverlayError(f"{where}: {apply_error(proc.stderr)}")


@dataclass(frozen=True)
class HunkProblem:
    """One hunk `git apply -v` did not place exactly where the patch says:
    `kind` is "offset" or "fuzz" (placed elsewhere), or "mismatch" (not placed;
    `line` is then where the patch expected it)."""

    file: str
    hunk: str
    line: int
    kind: str


def git_apply(
    patch: Patch, root: Path, tree: str | tuple[str, ...], *options: str
) -> subprocess.CompletedProcess[str]:
    """Run `git apply --verbose` on the files under `tree` (or under each of
    several) in `root`, which is not a repository; `options` adds e.g.
    `--check` or `--reverse`.

    Without the user's git config (`git_run`'s default): a setting such as
    `apply.ignoreWhitespace` would let it take context that differs in white
    space, which is fuzz."""
    trees = (tree,) if isinstance(tree, str) else tree
    return git_run(
        root,
        *("apply", "--verbose", "--whitespace=nowarn", *options),
        *(f"--include={name}*" for name in trees),
        str(patch.path),
        # Never let git discover a repository above the scratch directory.
        env={"GIT_CEILING_DIRECTORIES": str(root.parent)},
    )


def syntax_problem(path: Path) -> str | None:
    """Why git cannot read the patch file at `path` as a patch (a hunk whose
    header counts other lines than it holds, a broken file header), or None.

    Read as the build will apply it, with no sources: `git apply --numstat`
    parses every hunk and applies nothing, so a corrupt patch is found on a
    fresh clone, not first by a build."""
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-parse-") as scratch:
        proc = git_run(
            Path(scratch),
            *("apply", "--numstat", str(path.resolve())),
            env={"GIT_CEILING_DIRECTORIES": str(Path(scratch).parent)},
        )
    if proc.returncode == 0:
        return None
    return f"{path}: git cannot read it as a patch: {apply_error(proc.stderr)}"


def hunk_problems(patch: Patch, stderr: str) -> list[HunkProblem]:
    """Every misplaced or failed hunk `git apply -v` reported, in order: the
    zero-offset rule needs the former, naming a conflict needs the latter."""
    problems = []
    current = "?"
    for line in stderr.splitlines():
        if match := _CHECKING.match(line):
            current = match.group(1)
        elif match := _OFFSET.match(line):
            problems.append(
                HunkProblem(current, match.group(1), int(match.group(2)), match[3])
            )
        elif match := _FAILED.match(line):
            name, line_no = match.group(1), int(match.group(2))
            hunk = _hunk_number(patch, name, line_no)
            problems.append(HunkProblem(name, hunk, line_no, "mismatch"))
    return problems


def apply_error(stderr: str) -> str:
    """The one-line reason of a failed `git apply` with no hunk to blame (a
    missing file, a file that already exists)."""
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    reason = (errors or stderr.strip().splitlines() or ["git apply failed"])[-1]
    return reason.removeprefix("error: ")


def _hunk_number(patch: Patch, name: str, line_no: int) -> str:
    """The 1-based number, within its file, of the hunk starting at `line_no`."""
    text = patch.path.read_text(encoding="utf-8")
    section = text.split(f"diff --git a/{name} b/{name}\n", 1)[-1].split(
        "\ndiff --git ", 1
    )[0]
    starts = [int(m.group(1)) for m in _HUNK_HEADER.finditer(section)]
    return str(starts.index(line_no) + 1) if line_no in starts else "?"
