"""Scratch git trees of a series: the pristine files, then one commit a patch.

`refresh --check`, `rebase` and `extract` all work on the same picture of a
series: a repository whose first commit (tagged `upstream`) holds the
release's pristine files and whose following commits are the patches, in
order. It is rebuilt with a fixed identity and the patches' own author
dates, so the same series always gives the same commits, and a refresh of
it writes the series back byte for byte.
"""

from collections.abc import Mapping
from pathlib import Path

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.git import git, git_cause, git_run
from vllm_overlay.common.trees import write_tree
from vllm_overlay.series.model import Series
from vllm_overlay.upstream.fetch import wheel_members

UPSTREAM_TAG = "upstream"
_IDENTITY = "vllm-overlay"
_EMAIL = "vllm-overlay@example.invalid"
# The author date of the pristine commit; it never reaches a patch file.
_UPSTREAM_DATE = "2000-01-01T00:00:00+00:00"


def commit_identity() -> dict[str, str]:
    """The fixed author and committer of the scratch repositories' commits."""
    return {
        "GIT_AUTHOR_NAME": _IDENTITY,
        "GIT_AUTHOR_EMAIL": _EMAIL,
        "GIT_COMMITTER_NAME": _IDENTITY,
        "GIT_COMMITTER_EMAIL": _EMAIL,
    }


def materialize(series: Series, originals: Mapping[str, bytes], dest: Path) -> Path:
    """A git repository at `dest` holding the pristine files (`originals`)
    committed and tagged `upstream`, then one commit per patch (`git am`, with
    a fixed committer and the patch's own date, so the tree is reproducible)."""
    dest.mkdir(parents=True)
    git(dest, "init", "-q")
    write_tree(dest, originals)
    identity = commit_identity()
    dated = {**identity, "GIT_AUTHOR_DATE": _UPSTREAM_DATE}
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--allow-empty", "-m", UPSTREAM_TAG, env=dated)
    git(dest, "tag", UPSTREAM_TAG)
    for patch in series.patches:
        applied = git_run(
            dest,
            *("am", "-q", "--committer-date-is-author-date", "--no-3way"),
            *("--no-scissors", "--keep-non-patch", str(patch.path)),
            env=identity,
        )
        if applied.returncode != 0:
            # `dest` is a scratch repository: naming it would point at a
            # directory that is gone by the time the error is read.
            raise OverlayError(f"{patch.name} does not apply: {git_cause(applied)}")
    return dest


def pristine_files(
    series: Series, wheel: Path, sdist_tree: Path | None
) -> dict[str, bytes]:
    """The upstream bytes of every file the series touches that exists
    upstream: `vllm/` from the pinned wheel, `tests/` from the sdist tree
    (needed only when the series touches `tests/`)."""
    originals = wheel_members(wheel, series.touched_files)
    for name in series.upstream_test_files:
        if sdist_tree is None:
            raise OverlayError(f"{series.release.version}: {name} needs the sdist")
        if (sdist_tree / name).is_file():
            originals[name] = (sdist_tree / name).read_bytes()
    return originals
