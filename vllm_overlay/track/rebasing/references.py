"""The `path:line` references in a patch message, moved by a rebase.

A patch message cites the upstream code it talks to (`sched/scheduler.py:
1138-1142`, then `(:1288)` for another line of the same file). Those numbers
belong to the release the patch was written for; after a rebase they would
point at other code. When `rebase` writes the TO series, each reference in a
kept patch's message to a file of vLLM's package is looked up: the lines it
covers in FROM are found in TO, and the numbers are rewritten to where they
are now. The file is the one whose path ends with the cited one (of several,
the one the message cited last or before), and a bare `:N` is a line of the
file cited last. A reference is left as it is, and reported as stale for
the maintainer to fix, when its lines are not in TO's file exactly once or
its file is ambiguous. Lines that only gained or lost blank lines, or
trailing spaces, between them are the same code: such a range is found in
TO when its exact lines are not, and moved to its new span (longer or
shorter). A range that is exactly one function or class (from its `def`
or `class` line to its last) follows that definition, found once by its
qualified name in TO's file, even when its code changed: the reference
moves and is reported for review (`changed`), as the message's words about
it may no longer hold. A message line that names a release (`in 0.31.0`) is
about that release and is not touched; one that names the release the
series was written for is reported (`prose`), as what it says of that
release may not hold for the new one. A reference to upstream's tests
(`tests/...`, shipped in the sdist, not the wheel) moves the same way when
both releases' sources are at hand (`with_upstream_tests`); one to a file
outside both (LMCache) is left alone.
"""

import ast
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay.series.model import PACKAGE_DIR, TESTS_DIR
from vllm_overlay.upstream.fetch import wheel_members, wheel_names

# `dir/file.py:12`, `file.py:12-15`, or a bare `:12` starting a line or after a
# space, `(` or `,`.
_REFERENCE = re.compile(
    r"(?:(?<![\w/.-])(?P<path>(?:[\w.-]+/)*[\w.-]+\.py)|(?<![^\s(,]))"
    r":(?P<first>\d+)(?:-(?P<last>\d+))?(?![\w-])"
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
    # The definition a range followed although its code changed.
    changed: str = ""
    # A line of prose naming this release, which the series was written for
    # (`cited` holds the line): it may not hold for the new one.
    prose: str = ""


# The bytes of a file of the package by its path (b"" when absent).
FileReader = Callable[[str], bytes]


def wheel_reader(wheel: Path) -> FileReader:
    """A release's files, from its wheel."""
    return lambda path: wheel_members(wheel, [path]).get(path, b"")


def with_upstream_tests(reader: FileReader, sources: Path | None) -> FileReader:
    """`reader`, with upstream's tests (`tests/...`) read from the release's
    unpacked sdist `sources` (b"" when it lacks one, or there are none)."""

    def read(path: str) -> bytes:
        if not path.startswith(TESTS_DIR):
            return reader(path)
        file = sources / path if sources is not None else None
        return file.read_bytes() if file is not None and file.is_file() else b""

    return read


def release_files(wheel: Path, sources: Path | None) -> tuple[list[str], FileReader]:
    """The files of a release a message may cite, and their reader: its
    wheel's, and upstream's tests from its unpacked sdist `sources`, if any."""
    reader = with_upstream_tests(wheel_reader(wheel), sources)
    return [*wheel_names(wheel), *upstream_test_files(sources)], reader


def upstream_test_files(sources: Path | None) -> list[str]:
    """The Python files of upstream's tests in a release's unpacked sdist."""
    if sources is None:
        return []
    return sorted(
        path.relative_to(sources).as_posix()
        for path in (sources / TESTS_DIR).rglob("*.py")
    )


def retarget_series(
    exported: Mapping[str, bytes],
    python_files: list[str],
    old: FileReader,
    new: FileReader,
    from_release: str = "",
) -> tuple[dict[str, bytes], list[Reference]]:
    """`exported` (patch name -> format-patch bytes) with the references of
    every message moved from the lines of the release `old` reads (whose
    package files are `python_files`) to those of the one `new` reads;
    every reference that moved or could not be moved, and every line of
    prose that names `from_release` (the series' own release: "carries that
    behaviour to 0.31.0" in a series rebased from 0.31.0 no longer says
    what its new release does), for the maintainer to check."""

    @functools.cache
    def lines(reader: FileReader, path: str) -> tuple[str, ...]:
        return tuple(reader(path).decode("utf-8").splitlines())

    @functools.cache
    def definitions(reader: FileReader, path: str) -> dict[tuple[int, int], str]:
        return _definitions(reader(path))

    python_files = [
        name
        for name in python_files
        if name.startswith((PACKAGE_DIR, TESTS_DIR)) and name.endswith(".py")
    ]
    out, references = {}, []
    for name, data in exported.items():
        message, separator, rest = data.decode("utf-8").partition("\n---\n")
        mover = _Mover(
            name,
            from_release,
            python_files,
            functools.partial(lines, old),
            functools.partial(lines, new),
            functools.partial(definitions, old),
            functools.partial(definitions, new),
        )
        moved = "".join(mover.line(line) for line in message.splitlines(keepends=True))
        references += mover.references
        out[name] = (moved + separator + rest).encode("utf-8")
    return out, references


class _Mover:
    """One message's references, in order: the file cited last is the file
    of a bare `:N`, and settles which of several files a short path means."""

    def __init__(
        self,
        patch: str,
        from_release: str,
        python_files: list[str],
        old_lines: Callable[[str], tuple[str, ...]],
        new_lines: Callable[[str], tuple[str, ...]],
        old_definitions: Callable[[str], dict[tuple[int, int], str]],
        new_definitions: Callable[[str], dict[tuple[int, int], str]],
    ) -> None:
        self.patch = patch
        self.from_release = from_release
        self.python_files = python_files
        self.old_lines, self.new_lines = old_lines, new_lines
        self.old_definitions = old_definitions
        self.new_definitions = new_definitions
        self.cited: list[str] = []
        self.current: str | None = None
        self.references: list[Reference] = []

    def line(self, text: str) -> str:
        if self.from_release in _RELEASE.findall(text):
            self.references.append(
                Reference(self.patch, text.strip(), prose=self.from_release)
            )
        if _RELEASE.search(text):
            if _REFERENCE.search(text):
                self.current = None
            return text
        return _REFERENCE.sub(self._move, text)

    def _move(self, match: re.Match[str]) -> str:
        cited = match.group(0)
        if match.group("path"):
            # Upstream's tests are cited by their whole path (`tests/...`),
            # so that a short path means vLLM's package as before.
            tests = match["path"].startswith(TESTS_DIR)
            candidates = [
                f
                for f in self.python_files
                if f.startswith(TESTS_DIR) == tests
                and (f == match["path"] or f.endswith(f"/{match['path']}"))
            ]
            self.current = self._choose(candidates)
            if self.current is None:
                if len(candidates) > 1:
                    self._stale(cited, f"{len(candidates)} files of vLLM end so")
                return cited
            self.cited.append(self.current)
        if self.current is None:
            return cited
        first = int(match["first"])
        last = int(match["last"] or first)
        old = self.old_lines(self.current)
        if not 1 <= first <= last <= len(old):
            return self._stale(cited, "beyond the end of the file")
        block = list(old[first - 1 : last])
        new = self.new_lines(self.current)
        if list(new[first - 1 : last]) == block:
            return cited
        spans = [
            (i + 1, i + len(block))
            for i in range(len(new) - len(block) + 1)
            if list(new[i : i + len(block)]) == block
        ] or _spans_up_to_blank_lines(block, new)
        changed = ""
        if not spans and match["last"]:
            changed = self.old_definitions(self.current).get((first, last), "")
            if changed:
                spans = [
                    span
                    for span, name in self.new_definitions(self.current).items()
                    if name == changed
                ]
        if len(spans) != 1:
            why = "no longer there" if not spans else f"there {len(spans)} times"
            return self._stale(cited, f"the cited lines are {why}")
        start, end = spans[0]
        moved = f"{match['path'] or ''}:{f'{start}-{end}' if match['last'] else start}"
        self.references.append(
            Reference(self.patch, cited, moved_to=moved, changed=changed)
        )
        return moved

    def _choose(self, candidates: list[str]) -> str | None:
        if len(candidates) == 1:
            return candidates[0]
        earlier = [f for f in reversed(self.cited) if f in candidates]
        return earlier[0] if earlier else None

    def _stale(self, cited: str, why: str) -> str:
        self.references.append(Reference(self.patch, cited, stale=why))
        return cited


def _spans_up_to_blank_lines(
    block: list[str], lines: tuple[str, ...]
) -> list[tuple[int, int]]:
    """Where in `lines` the code of `block` is, up to blank lines and trailing
    spaces: the 1-based first and last line of each span whose non-blank
    lines are the block's, from the first of them to the last. Nothing for a
    block that starts or ends blank (its span would be a guess)."""
    if not block[0].strip() or not block[-1].strip():
        return []
    wanted = [text.rstrip() for text in block if text.strip()]
    numbered = [(n, text.rstrip()) for n, text in enumerate(lines, 1) if text.strip()]
    texts = [text for _, text in numbered]
    return [
        (numbered[k][0], numbered[k + len(wanted) - 1][0])
        for k in range(len(texts) - len(wanted) + 1)
        if texts[k : k + len(wanted)] == wanted
    ]


def _definitions(source: bytes) -> dict[tuple[int, int], str]:
    """Every function and class of a Python file by its span (first line,
    decorators aside, to last), named by its qualified name
    (`Scheduler.has_requests`); none for a file that does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    found: dict[tuple[int, int], str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                found[(child.lineno, child.end_lineno or child.lineno)] = name
                visit(child, f"{name}.")

    visit(tree, "")
    return found
