"""Where the project keeps its inputs (the series) and its cache (downloads).

Both can be moved with environment variables so that CI and tests can point
them elsewhere; the defaults suit a checkout of the repository.
"""

import os
from pathlib import Path

from vllm_overlay.common.errors import OverlayError

REPO_ROOT = Path(__file__).resolve().parents[2]
# An installed vllm-overlay wheel carries `patches/` as this package data
# (see `pyproject.toml`); a checkout has it at `REPO_ROOT / "patches"`.
PACKAGED_PATCHES = Path(__file__).resolve().parents[1] / "patches"
PINS_FILE = Path("vllm") / "releases.toml"


def patches_root() -> Path:
    """The `patches/` tree of the checkout (or `$VLLM_OVERLAY_PATCHES`).

    The commands that read or write the series as a maintainer does (`build`
    among them) need the checkout: an installed vllm-overlay is refused
    here, with what to run instead, rather than pointed at a pins file
    under site-packages that does not exist."""
    root = _checkout_patches()
    if root is None:
        raise OverlayError(
            "this command needs a checkout of the vllm-overlay repository, and "
            f"this vllm-overlay is installed ({PACKAGED_PATCHES.parent}): run "
            "`vllm-overlay serve` for vLLM with the series this install carries, "
            "or git clone the repository and run the command there"
        )
    return root


def series_root() -> Path:
    """Where `serve` and `doctor` find the series: `$VLLM_OVERLAY_PATCHES`
    when set, else the checkout's `patches/`, else the copy packaged with
    vllm-overlay (an installed wheel has no checkout)."""
    return _checkout_patches() or PACKAGED_PATCHES


def _checkout_patches() -> Path | None:
    """`$VLLM_OVERLAY_PATCHES` when set, else the checkout's `patches/`, or
    None when this package is not in a checkout (it is installed)."""
    explicit = os.environ.get("VLLM_OVERLAY_PATCHES")
    if explicit:
        return Path(explicit)
    checkout = REPO_ROOT / "patches"
    return checkout if (checkout / PINS_FILE).is_file() else None


def cache_root() -> Path:
    """The download and build cache: `$VLLM_OVERLAY_CACHE`, else
    `$XDG_CACHE_HOME/vllm-overlay` (`~/.cache/vllm-overlay`).

    It lives outside the checkout on purpose: a fresh clone of the repository on
    the same machine (CI does exactly that) reuses the pinned wheels, sources and
    test environments instead of fetching gigabytes again.
    """
    explicit = os.environ.get("VLLM_OVERLAY_CACHE")
    if explicit:
        if not Path(explicit).is_absolute():
            # The tools run from the checkout's root, not from where the
            # user set the variable: a relative path would put the cache
            # (gigabytes) inside the checkout.
            raise OverlayError(
                f"VLLM_OVERLAY_CACHE={explicit} is a relative path; set it to an "
                f"absolute one (e.g. {Path(explicit).absolute()})"
            )
        return _folder(Path(explicit), "$VLLM_OVERLAY_CACHE")
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return _folder(Path(xdg) / "vllm-overlay", "$XDG_CACHE_HOME")
    return _folder(Path.home() / ".cache" / "vllm-overlay", "the default location")


def _folder(path: Path, source: str) -> Path:
    """`path`, when it is a folder or can be made one. A file in the way is
    refused here, naming where the path came from: the write that meets it
    first would fail with a traceback from deep in a download or a build."""
    blocker = file_in_the_way(path)
    if blocker is not None:
        raise OverlayError(
            f"the cache {path} (from {source}) cannot be a folder: {blocker} "
            "is a file; set VLLM_OVERLAY_CACHE to a folder"
        )
    return path


def file_in_the_way(path: Path) -> Path | None:
    """The file that keeps `path` from being a folder (`path` itself or one
    of its parents), or None when `path` is a folder or can be made one."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    return None if existing.is_dir() else existing
