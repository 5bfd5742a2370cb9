"""What `vllm-overlay --version` says: which tool this is and which series
it builds, so that a bug report names both.

The version is the installed distribution's, which setuptools-scm derives
from git when the wheel (or the editable install) is built. An editable
install keeps the version of the commit it was installed at, so from a
checkout the commit is read from git itself; an installed wheel has no git
metadata, and names the commit its build recorded in `_version.py`.
"""

import importlib.metadata

from packaging.version import Version

from vllm_overlay.common.git import git_run
from vllm_overlay.common.locations import REPO_ROOT, series_root
from vllm_overlay.series.loader import pinned_releases
from vllm_overlay.series.pins import Dist

DISTRIBUTION = "vllm-overlay"


def version_text() -> str:
    """Two lines: the tool's version and commit, then the version of the
    patched `vllm` build of every pinned release (its `+hybridkv.N` is the
    series revision)."""
    pins = pinned_releases(series_root())
    builds = ", ".join(
        f"{version}+{pins[version].label(Dist.VLLM)}"
        for version in sorted(pins, key=Version)
    )
    return (
        f"{DISTRIBUTION} {tool_version()} (commit {tool_commit()})\n"
        f"series: vllm {builds}\n"
    )


def tool_version() -> str:
    """The installed distribution's version; a copy run without installing
    it has none."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def tool_commit() -> str:
    """The checkout's HEAD when this package runs from one, else the commit
    the build was made from, else "unknown" (a build from a copy without git
    metadata)."""
    if (REPO_ROOT / ".git").exists():
        try:
            head = git_run(
                REPO_ROOT, "rev-parse", "--short=12", "HEAD", user_config=True
            )
        except FileNotFoundError:  # git is not installed
            head = None
        if head is not None and head.returncode == 0:
            return head.stdout.strip()
    return _built_commit() or "unknown"


def _built_commit() -> str | None:
    """The commit setuptools-scm recorded at build time (it writes git's as
    `g` and the abbreviated hash), or None without one."""
    try:
        from vllm_overlay._version import commit_id
    except ImportError:
        return None
    return commit_id.removeprefix("g") if commit_id else None
