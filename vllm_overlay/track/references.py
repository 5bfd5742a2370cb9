"""The `path:line` references in a patch message, moved by a rebase.

A patch message cites the upstream code it talks to (`sched/scheduler.py:
1138-1142`). Those numbers belong to the release the patch was written for;
after a rebase they would point at other code. When `rebase` writes the TO
series, each reference in a kept patch's message that names a file of
FROM's `vllm/` package (a unique path suffix in FROM's wheel) is looked up:
the lines it covers in FROM are found in TO, and the numbers are rewritten
to where they are now. A reference is left as it is, and reported as stale
for the maintainer to fix, when those lines are not in TO's file exactly
once. A reference on a message line that names a release (`in 0.31.0`) is
about that release and is not touched; nor is one to a file outside vLLM's
package (LMCache, upstream's tests).
"""

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay.build.fetch import wheel_members, wheel_names
from vllm_overlay.series.model import PACKAGE_DIR

_REFERENCE = re.compile(
    r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.py):(\d+)(?:-(\d+))?(?![\d-])"
)
_RELEASE = re.compile(r"(?<![\w.])\d+\.\d+\.\d+(?![\w.]*\d)")


@dataclass(frozen=True)
class Reference:
    """One reference of one patch: where it pointed, and where it points now
    (`moved_to`), or why it could not be moved (`stale`)."""

    patch: str
    cited: str
    moved_to: str = ""
    stale: str = ""


def retarget_series(
    exported: Mapping[str, bytes], from_wheel: Path, to_wheel: Path
) -> tuple[dict[str, bytes], list[Reference]]:
    """`exported` (patch name -> format-patch bytes) with the references of
    every message moved from `from_wheel`'s lines to `to_wheel`'s; every
    reference that moved or could not be moved."""
    python_files = [
        name
        for name in wheel_names(from_wheel)
        if name.startswith(PACKAGE_DIR) and name.endswith(".py")
    ]
    out, references = {}, []
    for name, data in exported.items():
        message, separator, rest = data.decode("utf-8").partition("\n---\n")
        lines = message.splitlines(keepends=True)
        ours = [line for line in lines if not _RELEASE.search(line)]
        cited = {
            path
            for line in ours
            for match in _REFERENCE.finditer(line)
            if (path := _resolve(match.group(1), python_files))
        }
        move = functools.partial(
            _move,
            patch=name,
            python_files=python_files,
            from_files=wheel_members(from_wheel, cited),
            to_files=wheel_members(to_wheel, cited),
            references=references,
        )
        message = "".join(
            line if _RELEASE.search(line) else _REFERENCE.sub(move, line)
            for line in lines
        )
        out[name] = (message + separator + rest).encode("utf-8")
    return out, references


def _resolve(cited: str, python_files: list[str]) -> str | None:
    """The one file of the package whose path ends with `cited`, else None."""
    matches = [f for f in python_files if f == cited or f.endswith(f"/{cited}")]
    return matches[0] if len(matches) == 1 else None


def _move(
    match: re.Match[str],
    *,
    patch: str,
    python_files: list[str],
    from_files: Mapping[str, bytes],
    to_files: Mapping[str, bytes],
    references: list[Reference],
) -> str:
    path = _resolve(match.group(1), python_files)
    if path is None or path not in from_files:
        return match.group(0)
    first = int(match.group(2))
    last = int(match.group(3) or first)
    old = from_files[path].decode("utf-8").splitlines()
    cited = match.group(0)
    if not 1 <= first <= last <= len(old):
        references.append(Reference(patch, cited, stale="beyond the end of the file"))
        return cited
    block = old[first - 1 : last]
    new = to_files.get(path, b"").decode("utf-8").splitlines()
    starts = [
        i + 1
        for i in range(len(new) - len(block) + 1)
        if new[i : i + len(block)] == block
    ]
    if len(starts) != 1:
        why = "no longer there" if not starts else f"there {len(starts)} times"
        references.append(Reference(patch, cited, stale=f"the cited lines are {why}"))
        return cited
    start = starts[0]
    if start == first:
        return cited
    span = f"{start}-{start + last - first}" if match.group(3) else str(start)
    moved = f"{match.group(1)}:{span}"
    references.append(Reference(patch, cited, moved_to=moved))
    return moved
