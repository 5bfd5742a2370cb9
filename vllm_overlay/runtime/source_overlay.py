"""Serve chosen modules of an installed package from other source files.

A meta-path finder placed before the standard ones: for a listed module it
takes the spec the standard path finder would have produced and swaps in the
replacement file, so the module keeps its package, its submodule search path
and its name, and tracebacks point at the replacement's real lines. Every
process that should see the overlay must install it before the first import
of a listed module; `install` refuses when one is already imported.
"""

import importlib.machinery
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

from vllm_overlay.common.errors import OverlayError


def module_name(relative_path: str) -> str:
    """`vllm/v1/core/sched/scheduler.py` -> `vllm.v1.core.sched.scheduler`."""
    parts = relative_path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class SourceOverlayFinder:
    """Finds the listed modules at their replacement source files.

    A meta-path finder is any object with `find_spec` (PEP 451); it does not
    derive from `importlib.abc.MetaPathFinder`, whose import (`importlib.
    resources` and more) would add milliseconds to every process that
    `vllm-overlay serve` starts, all of which load this module first."""

    def __init__(self, sources: Mapping[str, Path]) -> None:
        self._sources = dict(sources)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        replacement = self._sources.get(fullname)
        if replacement is None:
            return None
        original = importlib.machinery.PathFinder.find_spec(fullname, path)
        if original is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname,
            replacement,
            submodule_search_locations=original.submodule_search_locations,
        )


def install(sources: Mapping[str, Path]) -> SourceOverlayFinder:
    """Put a finder for `sources` (module name -> file) first on `sys.meta_path`."""
    already = sorted(name for name in sources if name in sys.modules)
    if already:
        raise OverlayError(
            f"cannot overlay modules that are already imported: {', '.join(already)}"
        )
    finder = SourceOverlayFinder(sources)
    sys.meta_path.insert(0, finder)
    return finder
