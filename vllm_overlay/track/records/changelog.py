"""CHANGELOG.md's entry for a newly pinned release, written by `rebase`.

A release's series is what its users get, so pinning one is a user-visible
change (Keep a Changelog, under "Unreleased", "Added"). The rebase that
writes the series knows all the entry says: the release, its builds (their
local versions, from the pins), the series it was replayed from, and the
patches kept and dropped, with why. What ran on the release is not the
rebase's to say: README's table takes that from the harness's record. A
maintainer may add to the entry; nothing else is asked of them.
"""

import textwrap
from collections.abc import Sequence
from pathlib import Path

from vllm_overlay.common import atomic
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.pins import Dist, ReleasePin

CHANGELOG = "CHANGELOG.md"
UNRELEASED = "## [Unreleased]"
ADDED = "### Added"
# Keep a Changelog's sections, in their order (a heading may say more after
# its name: "### Changed (in the tooling)").
SECTIONS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
WIDTH = 86


def release_entry(
    pin: ReleasePin,
    from_release: str,
    kept: Sequence[str],
    dropped: Sequence[tuple[str, str]],
) -> str:
    """The entry's text: `pin`'s release and builds, and the patches of
    `from_release`'s series kept and dropped (each with its reason)."""
    builds = " and ".join(
        f"`{pin.version}+{pin.label(dist)}` from `{dist}`"
        for dist in Dist
        if pin.has_dist(dist)
    )
    fate = (
        "every one kept"
        if not dropped
        else f"{len(kept)} kept, {len(dropped)} dropped ("
        + "; ".join(f"`{name}`: {reason}" for name, reason in dropped)
        + ")"
    )
    count = len(kept) + len(dropped)
    return (
        f"vLLM {pin.version} is pinned: {builds}, the {from_release} series' "
        f"{count} patch{'es' if count != 1 else ''}, {fate}."
    )


def add_release_entry(changelog: Path, release: str, entry: str) -> str:
    """`entry` added first under "Unreleased", "Added" (the section made
    where it is missing): what was done, in a line. An entry already there
    for `release` is left as it is, and said."""
    lines = changelog.read_text(encoding="utf-8").splitlines(keepends=True)
    heads = [i for i, line in enumerate(lines) if line.rstrip() == UNRELEASED]
    if not heads:
        raise OverlayError(f"{changelog} has no '{UNRELEASED}' heading")
    start = heads[0] + 1
    end = next(
        (i for i in range(start, len(lines)) if lines[i].startswith("## ")),
        len(lines),
    )
    opening = f"- vLLM {release} is pinned:"
    if any(line.startswith(opening) for line in lines[start:end]):
        return f"{changelog.name}: its entry for vLLM {release} kept as it is"
    bullet = textwrap.fill(
        entry,
        width=WIDTH,
        initial_indent="- ",
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    added = [i for i in range(start, end) if lines[i].rstrip() == ADDED]
    if added:
        at, new = added[0] + 1, [bullet + "\n"]
    else:
        # Before the first section that comes after "Added", else at the end.
        later = [
            i
            for i in range(start, end)
            if lines[i].startswith("### ")
            and lines[i][4:].split("(")[0].strip() in SECTIONS[1:]
        ]
        at = later[0] if later else end
        new = [f"{ADDED}\n", bullet + "\n", "\n"]
    atomic.write_text(changelog, "".join(lines[:at] + new + lines[at:]))
    return f"{changelog.name}: vLLM {release}'s entry written under Unreleased, Added"


def record_release(
    checkout: Path,
    pin: ReleasePin,
    from_release: str,
    kept: Sequence[str],
    dropped: Sequence[tuple[str, str]],
) -> str:
    """The release's entry in `checkout`'s CHANGELOG.md (`add_release_entry`
    of `release_entry`), or a line saying there is none to write to."""
    changelog = checkout / CHANGELOG
    if not changelog.is_file():
        return f"{CHANGELOG}: none in {checkout}, no entry written"
    entry = release_entry(pin, from_release, kept, dropped)
    return add_release_entry(changelog, pin.version, entry)
