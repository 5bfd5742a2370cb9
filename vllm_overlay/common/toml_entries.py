"""One release's entry added to a table of a hand-kept TOML file (the release
facts), every other byte kept: the comments and layout maintainers wrote stay
as they are, which a TOML writer that re-renders the file would lose.

A table here is a header line (`[platform]`, `[test_env.pinned_as_tested]`)
followed by one-line entries keyed by release (`"0.30.0" = ...`), each
optionally after comment lines about it.
"""

import re
import tomllib
from typing import Any

from packaging.version import Version

_KEY_LINE = re.compile(r'^"([^"\\]+)" *=')


def _header(table: str) -> re.Pattern[str]:
    """The header line of the dotted `table`, spaces allowed as TOML allows."""
    parts = r" *\. *".join(re.escape(part) for part in table.split("."))
    return re.compile(rf"^\[ *{parts} *\] *(#.*)?$")


def entry_position(lines: list[str], table: str, version: str) -> int | None:
    """The line index at which `version`'s entry goes in `table` of a file's
    `lines`: before the comments that open the first later release's entry,
    else after the table's last non-blank line; None when the file has no
    such table header."""
    header = _header(table)
    start = next((n for n, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        return None
    end = next(
        (n for n in range(start + 1, len(lines)) if lines[n].startswith("[")),
        len(lines),
    )
    for n in range(start + 1, end):
        key = _KEY_LINE.match(lines[n])
        if key and Version(key.group(1)) > Version(version):
            while n > start + 1 and lines[n - 1].lstrip().startswith("#"):
                n -= 1
            return n
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    return end


def with_release_entry(
    text: str,
    table: str,
    version: str,
    entry: str,
    value: Any,
    comment: str | None = None,
) -> tuple[str, int] | None:
    """`text` with the one-line `entry` for `version` (after a `comment`
    line, if given) in `table`, in release order, and the entry's line
    number; None when `text` has no such table, or the result would not
    parse to the old data with `table`'s `version` set to `value`."""
    lines = text.splitlines(keepends=True)
    at = entry_position(lines, table, version)
    if at is None:
        return None
    if lines and not lines[-1].endswith("\n") and at == len(lines):
        lines[-1] += "\n"
    added = ([f"# {comment}\n"] if comment else []) + [entry + "\n"]
    new_text = "".join([*lines[:at], *added, *lines[at:]])
    expected = tomllib.loads(text)
    node = expected
    for part in table.split("."):
        node = node.setdefault(part, {})
    node[version] = value
    try:
        if tomllib.loads(new_text) != expected:
            return None
    except tomllib.TOMLDecodeError:
        return None
    return new_text, at + len(added)
