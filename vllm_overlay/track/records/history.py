"""The record of dropped patches: `patches/vllm/history.toml`.

A patch leaves the series when upstream absorbs it (or a maintainer drops it
at a rebase). Its file is gone from the new series, but why it went, and in
which release, must stay findable: `rebase` appends one `[[dropped]]` table a
patch and never rewrites an entry, and `lint` checks every entry and that the
entries committed in git are still there, unchanged and first.
"""

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

import tomli_w

from vllm_overlay.common import atomic
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.model import Patch

HISTORY_FILE = Path("vllm") / "history.toml"
_HEADER = (
    "# Patches dropped from a series, appended by `vllm-overlay rebase`.\n"
    "# Append-only: an entry is never edited or removed.\n"
)


@dataclass(frozen=True)
class DroppedPatch:
    """One dropped patch: which series it left, for which release, and why."""

    patch: str
    subject: str
    series: str
    release: str
    reason: str
    upstream_status: str
    upstream_pr: str

    @classmethod
    def of(cls, patch: Patch, series: str, release: str, reason: str) -> "DroppedPatch":
        return cls(
            patch.name,
            patch.subject,
            series,
            release,
            reason,
            patch.upstream_status,
            patch.upstream_pr,
        )


_KEYS = tuple(f.name for f in fields(DroppedPatch))


def read_history(root: Path) -> list[DroppedPatch]:
    """Every entry, oldest first; an `OverlayError` naming the first defect."""
    path = root / HISTORY_FILE
    if not path.is_file():
        return []
    return parse_history(path.read_text(encoding="utf-8"), path)


def parse_history(text: str, path: Path | str) -> list[DroppedPatch]:
    """The entries of a history file's `text` (read from `path`, named in
    errors): the working copy, or the one committed in git."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise OverlayError(f"{path}: not valid TOML ({exc})") from None
    extra = set(data) - {"dropped"}
    if extra:
        raise OverlayError(f"{path}: unknown key(s) {', '.join(sorted(extra))}")
    entries = []
    for number, entry in enumerate(data.get("dropped", []), start=1):
        if not isinstance(entry, dict) or set(entry) != set(_KEYS):
            raise OverlayError(
                f"{path}: entry {number} must have exactly the keys {', '.join(_KEYS)}"
            )
        if not all(isinstance(value, str) and value for value in entry.values()):
            raise OverlayError(
                f"{path}: entry {number}: every value is a non-empty string"
            )
        entries.append(DroppedPatch(**entry))
    return entries


def history_changes(
    committed: list[DroppedPatch], current: list[DroppedPatch], path: Path
) -> list[str]:
    """How `current` breaks the append-only rule against the `committed`
    entries: each committed entry edited or removed, or, when every one is
    still there, that they no longer come first in their order."""
    if current[: len(committed)] == committed:
        return []
    problems = []
    for number, old in enumerate(committed, start=1):
        if old in current:
            continue
        key = (old.patch, old.series, old.release)
        edited = any((e.patch, e.series, e.release) == key for e in current)
        problems.append(
            f"{path}: committed entry {number} ({old.patch}, dropped from the "
            f"{old.series} series at {old.release}) was "
            f"{'edited' if edited else 'removed'}; the history is append-only"
        )
    return problems or [
        f"{path}: the committed entries were reordered or have new entries "
        "among them; the history is append-only (new entries go at the end)"
    ]


def append_history(root: Path, dropped: Iterable[DroppedPatch]) -> None:
    """Append `dropped` to the history in one rename: the old text stays
    byte for byte, so a `git diff` of the file only ever adds lines."""
    dropped = list(dropped)
    if not dropped:
        return
    path = root / HISTORY_FILE
    read_history(root)
    text = path.read_text(encoding="utf-8") if path.is_file() else _HEADER
    for entry in dropped:
        text += "\n[[dropped]]\n" + tomli_w.dumps(
            {key: getattr(entry, key) for key in _KEYS}
        )
    atomic.write_text(path, text)
