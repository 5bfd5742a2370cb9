"""The requirement lines of a pip requirements file, read one way for every
reader: the release watch (the versions our hash-pinned files pin), the
rebase (the NIXL a release's sources pin) and the test environments (the
version a release's test requirements pin)."""

import re
from collections.abc import Iterator

from packaging.requirements import InvalidRequirement, Requirement

# A comment, a `--hash=` of a hash-pinned line, or its continuation
# backslash: none is part of the requirement.
_NOT_REQUIREMENT = re.compile(r"(^|\s)(#|--hash=|\\$).*$")


def requirement_lines(text: str) -> Iterator[tuple[int, Requirement]]:
    """Each line of `text` that holds a requirement: its 1-based number and
    the requirement. Blank lines, comments, options (`-r`, `--index-url`,
    a hash's own line) and what does not parse as a requirement (a URL line)
    are skipped."""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _NOT_REQUIREMENT.sub("", raw).strip()
        if not line or line.startswith("-"):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        yield number, requirement
