"""An upstream-ready contribution from one patch: `vllm-overlay extract`.

Output: commits on pristine vLLM, as an mbox and a PR description (`PR.md`)
in the sections of the release's pull request template. The last commit
holds the patch's change and its probes turned into upstream tests
(`probe_conversion.py`, imports sorted and formatted by ruff with vLLM's own
config); its message is the patch's without our trailers, signed off (vLLM
requires the DCO). A patch that applies to pristine vLLM only after some
earlier patches of its series is sent as a stack: those come first, each its
own signed-off commit with its own tests, and the description
(`pr_text.py`) says that the PR depends on them. With `--repo PATH` (a vLLM
git checkout) the commits are applied there with `git am --3way` on a new
branch.

Refused before the probes run (the one slow step) and before anything is
written: an `Inappropriate` patch or prerequisite (ours on purpose), a patch
that does not apply even after the patches before it, an unsuitable
checkout, a missing git identity, release environment or ruff. Refused after
the probes: a patch of the stack whose probes do not all fail on the
unpatched release (a contribution needs a test that fails without it).
"""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.git import git, git_cause, git_run
from vllm_overlay.common.locations import cache_root, patches_root
from vllm_overlay.series.loader import release_series
from vllm_overlay.series.model import (
    PATCH_SUFFIX,
    REQUIRED_TRAILERS,
    Patch,
    Series,
)
from vllm_overlay.series.pins import Dist
from vllm_overlay.track.rebasing.refresh import format_patch_bytes
from vllm_overlay.track.status.probing import (
    STILL_NEEDED,
    env_python,
    no_environment,
    probe_verdict,
    run_pristine,
)
from vllm_overlay.track.upstreaming.pr_text import Commit, pr_description
from vllm_overlay.track.upstreaming.probe_conversion import (
    ConvertedTests,
    convert_probes,
)
from vllm_overlay.track.workspace.scratch_tree import (
    UPSTREAM_TAG,
    commit_identity,
    materialize,
    pristine_files,
)
from vllm_overlay.upstream.fetch import fetch_sdist_tree, fetch_wheel

BRANCH_PREFIX = "overlay/"
DESCRIPTION_FILE = "PR.md"


@dataclass(frozen=True)
class Extraction:
    """What `extract` wrote: a directory with the description and the mbox,
    the branch when a repository was given, the prerequisite patches sent as
    earlier commits, and the new test package of every commit, in order."""

    directory: Path
    branch: str | None
    prerequisites: tuple[str, ...]
    tests: tuple[ConvertedTests, ...]


def extract(
    name: str,
    base: str | None = None,
    repo: Path | None = None,
    out: Path = Path("extract"),
    root: Path | None = None,
    cache: Path | None = None,
) -> Extraction:
    """`vllm-overlay extract PATCH [--base RELEASE] [--repo PATH]`."""
    root = root or patches_root()
    cache = cache or cache_root()
    series = release_series(base, root)
    patch = _find(series, name)
    _check_upstreamable(patch)
    stem = patch.name.removesuffix(PATCH_SUFFIX)
    target = out / stem
    if target.exists():
        raise OverlayError(f"{target} already exists; remove it first")
    branch = BRANCH_PREFIX + stem
    if repo is not None:
        _check_contribution_repo(repo, branch)
    signoff = signoff_identity(repo or root.parent)
    python = _release_python(series, patch, cache)
    _check_ruff()
    sdist = fetch_sdist_tree(series.release, cache)
    wheel = fetch_wheel(series.release, Dist.VLLM, cache).path
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-extract-") as scratch:
        tree = Path(scratch) / "tree"
        index = series.patches.index(patch)
        prefix = replace(series, patches=series.patches[: index + 1])
        materialize(prefix, pristine_files(series, wheel, sdist), tree)
        shas = dict(zip(prefix.patches, _shas(tree), strict=True))
        stack = _stack(series, patch, tree, shas)
        for prerequisite in stack[:-1]:
            _check_upstreamable(prerequisite, needed_by=patch)
        tests = [convert_probes(p, root.parent, sdist, series.patches) for p in stack]
        commits = _contribution(tree, stack, shas, tests, signoff, sdist)
        mbox = b"".join(format_patch_bytes(tree, sha) for sha in _shas(tree))
        outcomes = _check_probes_fail(series, stack, python, root.parent)
        description = pr_description(commits, series, sdist, outcomes)
        _write(target, mbox, description, repo, branch)
    return Extraction(
        target,
        branch if repo is not None else None,
        tuple(p.name for p in stack[:-1]),
        tuple(tests),
    )


def _write(
    target: Path, mbox: bytes, description: str, repo: Path | None, branch: str
) -> None:
    """`target` whole or not at all, and the branch only with it: a failed
    `git am` leaves neither `target` nor a directory made for it."""
    made = _made(target.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        (staging / f"{target.name}.mbox").write_bytes(mbox)
        (staging / DESCRIPTION_FILE).write_text(description, encoding="utf-8")
        if repo is not None:
            _apply_on_branch(repo, branch, staging / f"{target.name}.mbox")
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for directory in made:
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise


def _made(directory: Path) -> list[Path]:
    """Create `directory`; return the directories that did not exist before,
    deepest first, so that a failed extraction can take them away again."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    directory.mkdir(parents=True, exist_ok=True)
    return missing


def _check_upstreamable(patch: Patch, needed_by: Patch | None = None) -> None:
    if not patch.upstream_status.startswith("Inappropriate"):
        return
    if needed_by is None:
        raise OverlayError(
            f"{patch.name} is Upstream-Status: {patch.upstream_status}; it is not "
            "meant for upstream, so there is nothing to extract"
        )
    raise OverlayError(
        f"{needed_by.name} applies to pristine vLLM only after {patch.name}, "
        f"which is Upstream-Status: {patch.upstream_status} and cannot go "
        "upstream with it; rework it not to need that patch"
    )


def _release_python(series: Series, patch: Patch, cache: Path) -> Path:
    """The release environment the probe check runs in, looked up first:
    its absence is a refusal that must not wait for anything slow."""
    version = series.release.version
    python = env_python(version, cache)
    if python is None:
        raise OverlayError(
            f"cannot check that the probes of {patch.name} fail without it: "
            + no_environment(version)
        )
    return python


def _find(series: Series, name: str) -> Patch:
    wanted = name if name.endswith(PATCH_SUFFIX) else name + PATCH_SUFFIX
    for patch in series.patches:
        if patch.name == Path(wanted).name:
            return patch
    known = ", ".join(p.name for p in series.patches) or "none"
    raise OverlayError(
        f"no patch {wanted} in the vLLM {series.release.version} series "
        f"(it has: {known})"
    )


def _check_contribution_repo(repo: Path, branch: str) -> None:
    """A vLLM checkout with nothing uncommitted and no branch of that name."""
    if not (repo / ".git").exists() or not (repo / "vllm").is_dir():
        raise OverlayError(f"{repo} is not a vLLM git checkout")
    if _own_git(repo, "status", "--porcelain").stdout.strip():
        raise OverlayError(
            f"{repo} has uncommitted changes; commit or stash them first"
        )
    if (
        _own_git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{branch}").returncode
        == 0
    ):
        raise OverlayError(f"{repo} already has a branch {branch}; delete or rename it")


def signoff_identity(where: Path) -> str:
    """`Name <email>` from the maintainer's own git config: the DCO sign-off
    certifies a person, so there is no default."""
    values = []
    for key in ("user.name", "user.email"):
        proc = _own_git(where, "config", key)
        if proc.returncode != 0 or not proc.stdout.strip():
            raise OverlayError(
                f"git has no {key} for {where}; the Signed-off-by line needs "
                "your name and e-mail (`git config --global user.name ...`)"
            )
        values.append(proc.stdout.strip())
    return f"{values[0]} <{values[1]}>"


def _check_ruff() -> None:
    """The new tests are formatted with ruff, as vLLM's pre-commit does."""
    if _ruff("--version").returncode != 0:
        raise OverlayError(
            "extract formats the new tests with ruff, which this Python lacks "
            "(pip install 'vllm-overlay[dev]')"
        )


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def _stack(
    series: Series, patch: Patch, tree: Path, shas: dict[Patch, str]
) -> list[Patch]:
    """`patch` and, before it, the fewest earlier patches of the series it
    needs to apply to pristine vLLM, in series order.

    `tree` holds the series up to `patch`, one commit each (`shas`). Only an earlier
    patch that touches a file of `patch` (or of another such patch) can be
    needed; of those, each is left out, the latest first, when the rest
    still cherry-picks onto pristine vLLM without it."""
    index = series.patches.index(patch)
    files = set(patch.files)
    candidates = []
    for earlier in reversed(series.patches[:index]):
        if files & set(earlier.files):
            candidates.insert(0, earlier)
            files |= set(earlier.files)
    needed = candidates if not _applies(tree, [shas[patch]]) else []
    if not _applies(tree, [shas[p] for p in [*needed, patch]]):
        raise OverlayError(
            f"{patch.name} does not apply to pristine vLLM "
            f"{series.release.version}, even after the patches before it"
        )
    for candidate in reversed(list(needed)):
        trial = [p for p in needed if p is not candidate]
        if _applies(tree, [shas[p] for p in [*trial, patch]]):
            needed = trial
    return [*needed, patch]


def _shas(tree: Path) -> list[str]:
    """The commits after the pristine one, oldest first."""
    return git(tree, "rev-list", "--reverse", f"{UPSTREAM_TAG}..HEAD").split()


def _applies(tree: Path, shas: list[str]) -> bool:
    """Whether `shas` cherry-pick in order onto the pristine files, left on
    the branch `contribution`."""
    git(tree, "checkout", "-q", "-f", "-B", "contribution", UPSTREAM_TAG)
    for sha in shas:
        if git_run(tree, "cherry-pick", sha, env=commit_identity()).returncode:
            git_run(tree, "cherry-pick", "--abort")
            return False
    return True


def _contribution(
    tree: Path,
    stack: list[Patch],
    shas: dict[Patch, str],
    tests: list[ConvertedTests],
    signoff: str,
    sdist: Path,
) -> list[Commit]:
    """The commits of the contribution on the branch `contribution` of
    `tree` (where `_stack` left them): each patch's own, with its tests
    added and its message made upstream's."""
    git(tree, "checkout", "-q", "-f", "-B", "contribution", UPSTREAM_TAG)
    name, _, email = signoff.partition(" <")
    committer = {"GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email[:-1]}
    commits = []
    for patch, converted in zip(stack, tests, strict=True):
        git(tree, "cherry-pick", shas[patch], env=commit_identity())
        for path, text in converted.files.items():
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_text(text, encoding="utf-8")
        _tidy(tree, list(converted.files), sdist)
        git(tree, "add", "-A")
        message = _upstream_message(git(tree, "log", "-1", "--format=%B"), signoff)
        git(tree, "commit", "-q", "--amend", "-m", message, env=committer)
        commits.append(Commit(patch, converted, message))
    return commits


def _tidy(tree: Path, files: list[str], sdist: Path) -> None:
    """What vLLM's pre-commit does to new files, with the release's own
    config: ruff sorts the imports (made relative, they form a section of
    their own) and formats. Only those fixes: ruff's others can change
    meaning, and are the author's to make."""
    config = sdist / "pyproject.toml"
    settings = ["--config", str(config)] if config.is_file() else ["--isolated"]
    paths = [str(tree / f) for f in files]
    checked = _ruff(
        "check",
        "--no-cache",
        "--exit-zero",
        "--fix",
        "--select",
        "I",
        *settings,
        *paths,
    )
    formatted = _ruff("format", "--no-cache", *settings, *paths)
    for proc in (checked, formatted):
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines() or ["failed"]
            raise OverlayError(f"ruff cannot format the new tests: {lines[0]}")


def _check_probes_fail(
    series: Series, stack: list[Patch], python: Path, repo_root: Path
) -> dict[str, str]:
    """Every probe of every patch of the stack fails on the unpatched
    release, in one pytest run; returns the outcomes for the description."""
    version = series.release.version
    probes = [probe for patch in stack for probe in patch.probes]
    outcomes = run_pristine(list(dict.fromkeys(probes)), version, python, repo_root)
    for patch in stack:
        verdict = probe_verdict(patch.probes, outcomes)
        if verdict != STILL_NEEDED:
            raise OverlayError(
                f"the probes of {patch.name} do not all fail on unpatched vLLM "
                f"{version} ({verdict}); a contribution needs a test that fails "
                "without it"
            )
    return outcomes


def _upstream_message(message: str, signoff: str) -> str:
    """The patch message without our trailers, signed off."""
    paragraphs = message.strip().split("\n\n")
    last = [
        line
        for line in paragraphs[-1].splitlines()
        if line.split(":", 1)[0] not in REQUIRED_TRAILERS
    ]
    paragraphs = paragraphs[:-1] + (["\n".join(last)] if last else [])
    return "\n\n".join(paragraphs) + f"\n\nSigned-off-by: {signoff}\n"


def _apply_on_branch(repo: Path, branch: str, mbox: Path) -> None:
    """`git am --3way` on a new branch from HEAD; on failure the branch is
    deleted and the checkout is where it was. The maintainer's checkout is
    left on the branch it was on either way."""
    start = _own_git(repo, "rev-parse", "--abbrev-ref", "HEAD").stdout.strip()
    start = (
        start if start != "HEAD" else _own_git(repo, "rev-parse", "HEAD").stdout.strip()
    )
    _own_git(repo, "checkout", "-q", "-b", branch)
    applied = _own_git(repo, "am", "-q", "--3way", str(mbox))
    if applied.returncode != 0:
        _own_git(repo, "am", "--abort")
    _own_git(repo, "checkout", "-q", start)
    if applied.returncode != 0:
        _own_git(repo, "branch", "-q", "-D", branch)
        raise OverlayError(
            f"the contribution does not apply to {repo} HEAD: {git_cause(applied)}"
        )


def _own_git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """git in the maintainer's own checkout, with their config."""
    return git_run(repo, *args, user_config=True)
