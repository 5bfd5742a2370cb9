"""Read the series manifest a patched vLLM carries, without importing vLLM.

Importing `vllm` runs its package initialisation (and, from the scheduler on,
loads torch); tools that only need to know which series is installed must not
pay for that, and must be able to look before any vLLM module is imported.
"""

import importlib.util
import json
from pathlib import Path
from typing import Any

from vllm_overlay.common.errors import OverlayError

# Where a patched build carries its series manifest, and its format.
MANIFEST_PATH = "vllm/_overlay_series.json"
MANIFEST_FORMAT = 1


def vllm_package_dir() -> Path | None:
    """The directory of the `vllm` package that `import vllm` would load,
    found without importing it; None when there is none."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def installed_vllm_dir() -> Path:
    """`vllm_package_dir`, or an `OverlayError` when vLLM is not installed."""
    package_dir = vllm_package_dir()
    if package_dir is None:
        raise OverlayError("vLLM is not installed in this environment")
    return package_dir


def read_installed_manifest() -> dict[str, Any] | None:
    """The installed series manifest, or None for an unpatched vLLM."""
    path = installed_vllm_dir().parent / MANIFEST_PATH
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != MANIFEST_FORMAT:
        raise OverlayError(f"{path}: unknown manifest format {manifest.get('format')}")
    return manifest
