"""Where the project keeps its inputs (the series) and its cache (downloads).

Both can be moved with environment variables so that CI and tests can point
them elsewhere; the defaults suit a checkout of the repository.
"""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# An installed vllm-overlay wheel carries `patches/` as this package data
# (see `pyproject.toml`); a checkout has it at `REPO_ROOT / "patches"`.
PACKAGED_PATCHES = Path(__file__).resolve().parent / "patches"
PINS_FILE = Path("vllm") / "releases.toml"


def patches_root() -> Path:
    """The `patches/` tree of the checkout (or `$VLLM_OVERLAY_PATCHES`)."""
    return Path(os.environ.get("VLLM_OVERLAY_PATCHES", REPO_ROOT / "patches"))


def series_root() -> Path:
    """Where `serve` and `doctor` find the series: `$VLLM_OVERLAY_PATCHES`
    when set, else the checkout's `patches/`, else the copy packaged with
    vllm-overlay (an installed wheel has no checkout)."""
    root = patches_root()
    if "VLLM_OVERLAY_PATCHES" in os.environ or (root / PINS_FILE).is_file():
        return root
    return PACKAGED_PATCHES


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
