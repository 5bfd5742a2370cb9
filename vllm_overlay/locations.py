"""Where the project keeps its inputs (the series) and its cache (downloads).

Both can be moved with environment variables so that CI and tests can point
them elsewhere; the defaults suit a checkout of the repository.
"""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def patches_root() -> Path:
    """The `patches/` tree of the checkout (or `$VLLM_OVERLAY_PATCHES`)."""
    return Path(os.environ.get("VLLM_OVERLAY_PATCHES", REPO_ROOT / "patches"))


def cache_root() -> Path:
    """The download and build cache: `$VLLM_OVERLAY_CACHE`, else
    `$XDG_CACHE_HOME/vllm-overlay` (`~/.cache/vllm-overlay`).

    It lives outside the checkout on purpose: a fresh clone of the repository on
    the same machine (CI does exactly that) reuses the pinned wheels, sources and
    test environments instead of fetching gigabytes again.
    """
    explicit = os.environ.get("VLLM_OVERLAY_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "vllm-overlay"
