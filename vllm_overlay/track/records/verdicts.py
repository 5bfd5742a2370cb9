"""The last `status` verdict of each patch: `patches/vllm/verdicts.toml`.

`PATCHES.md` shows, for every patch of a pinned release's own series, what the
last `vllm-overlay status --record` said about it (and, with `--probe`, what
its probes said on the unpatched release). The verdict belongs to the bytes
of the patch that was checked: each entry keeps that patch's sha256, so a
patch edited since shows as "stale" instead of borrowing an old verdict.
"""

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from vllm_overlay.common import atomic
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.toml_files import read_toml
from vllm_overlay.series.model import Patch

VERDICTS_FILE = Path("vllm") / "verdicts.toml"
_HEADER = (
    "# The last `vllm-overlay status --record` verdict of each patch of each\n"
    "# pinned release's own series. Written by that command; do not edit.\n"
)


@dataclass(frozen=True)
class RecordedVerdict:
    """What `status` said about one patch file, and when."""

    verdict: str
    probe: str | None
    patch_sha256: str
    checked: str


def read_verdicts(root: Path) -> dict[tuple[str, str], RecordedVerdict]:
    """(release, patch name) -> its recorded verdict."""
    path = root / VERDICTS_FILE
    if not path.is_file():
        return {}
    data = read_toml(path, "verdicts file")
    recorded = {}
    for release, patches in data.get("verdicts", {}).items():
        for name, entry in patches.items():
            recorded[release, name] = _entry(path, f"{release} {name}", entry)
    return recorded


def _entry(path: Path, where: str, entry: object) -> RecordedVerdict:
    """One entry, or an `OverlayError`: every value a string, `probe` optional."""
    required = {"verdict", "patch_sha256", "checked"}
    if (
        not isinstance(entry, dict)
        or not required <= set(entry) <= required | {"probe"}
        or not all(isinstance(value, str) for value in entry.values())
    ):
        raise OverlayError(
            f"{path}: entry {where} needs the strings verdict, patch_sha256 "
            "and checked (and optionally probe), nothing else"
        )
    return RecordedVerdict(
        entry["verdict"], entry.get("probe"), entry["patch_sha256"], entry["checked"]
    )


def record_verdicts(
    root: Path,
    rows: Iterable[tuple[str, Patch, str, str | None]],
    checked: str,
    unchanged: Collection[tuple[str, str]] = (),
) -> None:
    """Replace the recorded verdicts of every release in `rows` ((release,
    patch, verdict, probe verdict or None)); other releases keep theirs, and
    so do the (release, patch name) pairs in `unchanged`."""
    rows = list(rows)
    recorded = read_verdicts(root)
    releases = {release for release, *_ in rows}
    recorded = {
        key: v
        for key, v in recorded.items()
        if key[0] not in releases or key in unchanged
    }
    for release, patch, verdict, probe in rows:
        recorded[release, patch.name] = RecordedVerdict(
            verdict, probe, patch.sha256, checked
        )
    tables: dict[str, dict[str, dict[str, str]]] = {}
    for (release, name), entry in sorted(recorded.items()):
        table = {"verdict": entry.verdict}
        if entry.probe is not None:
            table["probe"] = entry.probe
        table |= {"patch_sha256": entry.patch_sha256, "checked": entry.checked}
        tables.setdefault(release, {})[name] = table
    text = f"{_HEADER}\n{tomli_w.dumps({'verdicts': tables})}" if tables else _HEADER
    atomic.write_text(root / VERDICTS_FILE, text)


def verdict_cell(recorded: RecordedVerdict | None, patch: Patch) -> str:
    """The `PATCHES.md` cell for one patch."""
    if recorded is None:
        return "not checked yet"
    if recorded.patch_sha256 != patch.sha256:
        return f"stale: the patch changed after the check of {recorded.checked}"
    probe = f"; probes: {recorded.probe}" if recorded.probe else ""
    return f"{recorded.verdict}{probe} ({recorded.checked})"
