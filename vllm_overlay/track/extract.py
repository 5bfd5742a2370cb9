"""An upstream-ready contribution from one patch: `vllm-overlay extract`.

Output: commits on pristine vLLM, as an mbox and a PR description (`PR.md`)
in the sections of the release's pull request template. The last commit
holds the patch's change and its probes turned into upstream tests
(`probe_conversion.py`, imports sorted and formatted by ruff with vLLM's own
config); its message is the patch's without our trailers, signed off (vLLM
requires the DCO). A patch that applies to pristine vLLM only after some
earlier patches of its series is sent as a stack: those come first, each its
own signed-off commit with its own tests, and the description says that the
PR depends on them. With `--repo PATH` (a vLLM git checkout) the commits are
applied there with `git am --3way` on a new branch.

Refused before the probes run (the one slow step) and before anything is
written: an `Inappropriate` patch or prerequisite (ours on purpose), a patch
that does not apply even after the patches before it, an unsuitable
checkout, a missing git identity, release environment or ruff. Refused after
the probes: a patch of the stack whose probes do not all fail on the
unpatched release (a contribution needs a test that fails without it).
"""

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from vllm_overlay.errors import OverlayError
from vllm_overlay.git import git, git_cause, git_run
from vllm_overlay.locations import cache_root, patches_root
from vllm_overlay.series.loader import release_series
from vllm_overlay.series.model import (
    PATCH_SUFFIX,
    REQUIRED_TRAILERS,
    TESTS_DIR,
    Patch,
    Series,
)
from vllm_overlay.series.pins import Dist
from vllm_overlay.track.probe_conversion import ConvertedTests, convert_probes
from vllm_overlay.track.probing import (
    FAILED,
    STILL_NEEDED,
    env_python,
    no_environment,
    probe_verdict,
    run_pristine,
)
from vllm_overlay.track.refresh import format_patch_bytes
from vllm_overlay.track.scratch_tree import (
    UPSTREAM_TAG,
    commit_identity,
    materialize,
    pristine_files,
)
from vllm_overlay.upstream.fetch import fetch_sdist_tree, fetch_wheel

BRANCH_PREFIX = "overlay/"
DESCRIPTION_FILE = "PR.md"
TEMPLATE = Path(".github") / "PULL_REQUEST_TEMPLATE.md"
# The sections of a template that has none this module knows how to fill.
DEFAULT_SECTIONS = ("Purpose", "Test Plan", "Test Result")
# `#123`, `vllm#123`, `LMCache #123`, `owner/name#123`, and full links.
_REFERENCE = re.compile(
    r"(?:\b(?P<repo>[\w.-]+/[\w.-]+)|\b(?P<project>vllm|lmcache)\s?)?"
    r"#(?P<number>\d{3,6})\b|https://github\.com/\S+/(?:pull|issues)/\d+",
    re.IGNORECASE,
)
_PROJECTS = {"vllm": "vllm-project/vllm", "lmcache": "LMCache/LMCache"}
_LINE_REFERENCE = re.compile(r"([\w./-]+\.py):\d+")
_GITHUB = "https://github.com"


@dataclass(frozen=True)
class Extraction:
    """What `extract` wrote: a directory with the description and the mbox,
    the branch when a repository was given, the prerequisite patches sent as
    earlier commits, and the new test package of every commit, in order."""

    directory: Path
    branch: str | None
    prerequisites: tuple[str, ...]
    tests: tuple[ConvertedTests, ...]


@dataclass(frozen=True)
class _Commit:
    """One commit of the contribution: the patch, its tests and its message
    as sent (without our trailers, signed off)."""

    patch: Patch
    tests: ConvertedTests
    message: str


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
) -> list[_Commit]:
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
        commits.append(_Commit(patch, converted, message))
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
    outcomes = run_pristine(list(dict.fromkeys(probes)), python, repo_root)
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


def pr_description(
    commits: Sequence[_Commit],
    series: Series,
    sdist: Path,
    outcomes: dict[str, str],
) -> str:
    """The PR title and description in markdown, in the sections of the
    release's pull request template (`.github/PULL_REQUEST_TEMPLATE.md` of
    its sdist): Purpose, Test Plan and Test Result, or Overview, Claims,
    Validation and Details. Our messages open with why the change is
    needed, then say what it does; the sign-off closes them."""
    template = sdist / TEMPLATE
    text = template.read_text(encoding="utf-8") if template.is_file() else ""
    headings = re.findall(r"^## (.+?)\s*$", text, re.MULTILINE)
    sections = _sections(commits, series, sdist, outcomes)
    if not headings or not set(headings) & set(sections):
        headings, text = list(DEFAULT_SECTIONS), ""
    parts = [f"# {commits[-1].patch.subject}\n"]
    for heading in headings:
        parts += [f"## {heading}\n", sections.get(heading, "")]
    checklist = text.split("\n---\n", 1)
    if len(checklist) == 2:
        parts.append("---\n" + checklist[1].rstrip("\n") + "\n")
    return "\n".join(part for part in parts if part)


def _sections(
    commits: Sequence[_Commit],
    series: Series,
    sdist: Path,
    outcomes: dict[str, str],
) -> dict[str, str]:
    """Every section either template asks for, by heading."""
    last = commits[-1]
    paragraphs = [p for p in last.message.strip().split("\n\n") if p.strip()]
    why, *what = paragraphs[1:-1]  # after the subject, before the sign-off
    summary = _summary(last)
    depends = _dependency(commits[:-1])
    related = _related(last)
    lines = _line_note(last.message, sdist, series.release.version)
    details = "\n".join(p + "\n" for p in [why, *what, lines] if p)
    plan = _test_plan(commits, series.release.version)
    result = _test_result(commits, series.release.version, outcomes)
    overview = "\n".join(p for p in [summary, depends, related] if p)
    claims = f"- {_sentence(last.patch.subject)}\n" + "".join(
        f"- New test `{test}`\n" for test in last.tests.test_ids
    )
    return {
        "Purpose": "\n".join(p for p in [summary, depends, details, related] if p),
        "Test Plan": plan,
        "Test Result": result,
        "Overview": overview,
        "Claims": claims,
        "Validation": plan + "\n" + result,
        "Details": details,
    }


def _sentence(subject: str) -> str:
    return f"{subject[0].upper()}{subject[1:]}."


def _summary(commit: _Commit) -> str:
    changed = [f for f in commit.patch.files if not f.startswith(TESTS_DIR)]
    updated = [f for f in commit.patch.files if f.startswith(TESTS_DIR)]
    return (
        _sentence(commit.patch.subject)
        + " Changes "
        + ", ".join(f"`{f}`" for f in changed)
        + (f"; updates {', '.join(f'`{f}`' for f in updated)}" if updated else "")
        + f"; adds the tests in `{commit.tests.package}/`.\n"
    )


def _dependency(prerequisites: Sequence[_Commit]) -> str:
    """The stack, said plainly: which earlier commits this PR needs."""
    if not prerequisites:
        return ""
    count = len(prerequisites)
    lines = [
        f"**Depends on {'an earlier change' if count == 1 else 'earlier changes'}**"
        f", included as the first {'commit' if count == 1 else f'{count} commits'} "
        "of this branch (each with its own tests); only the last commit is this "
        "change. Please review or merge "
        f"{'it' if count == 1 else 'them'} first:\n"
    ]
    for commit in prerequisites:
        pr = commit.patch.upstream_pr
        lines.append(
            f"- {commit.patch.subject}"
            + (f" (proposed in {pr})" if pr != "none" else "")
            + "\n"
        )
    return "".join(lines)


def _related(commit: _Commit) -> str:
    links = _references(commit.patch, commit.message)
    return ("Related:\n" + "".join(f"- {link}\n" for link in links)) if links else ""


def _test_plan(commits: Sequence[_Commit], version: str) -> str:
    updated = [f for c in commits for f in c.patch.files if f.startswith(TESTS_DIR)]
    commands = [f"pytest {c.tests.package} -v" for c in commits]
    commands += [f"pytest {f} -v" for f in dict.fromkeys(updated)]
    return (
        f"On this branch, based on vLLM v{version}:\n\n"
        "```bash\n" + "\n".join(commands) + "\n```\n"
    )


def _test_result(
    commits: Sequence[_Commit], version: str, outcomes: dict[str, str]
) -> str:
    """What was measured: each new test on vLLM as released. The run with
    the change is the submitter's to paste."""
    lines = [f"Without this change, on vLLM v{version} as released:\n"]
    for commit in commits:
        for probe, test in zip(commit.patch.probes, commit.tests.test_ids, strict=True):
            lines.append(f"- `{test}`: {outcomes.get(probe, FAILED)}\n")
    lines.append("\nWith this change:\n\n<!-- the output of the commands above -->\n")
    return "".join(lines)


def _line_note(message: str, sdist: Path, version: str) -> str:
    """Which release the message's `file.py:LINE` references to vLLM files
    belong to; references to other projects' files are left alone."""
    ours = [
        m.group(0)
        for m in _LINE_REFERENCE.finditer(message)
        if _is_vllm_file(m.group(1), sdist)
    ]
    if not ours:
        return ""
    examples = ", ".join(f"`{r}`" for r in list(dict.fromkeys(ours))[:3])
    return (
        f"Line numbers in references to vLLM files ({examples}) are those of "
        f"vLLM v{version}, the release this branch is based on."
    )


def _is_vllm_file(path: str, sdist: Path) -> bool:
    """Whether vLLM's sources hold a file whose path ends with `path`."""
    top = path.split("/", 1)[0]
    if top in ("vllm", "tests"):
        return (sdist / path).is_file()
    return any((sdist / "vllm").rglob(path)) or any((sdist / "tests").rglob(path))


def _references(patch: Patch, message: str) -> list[str]:
    """The Upstream-PR link and every PR or issue the message names, once,
    each linked to its own project: a bare `#N` or `vllm#N` is vLLM's,
    `LMCache #N` LMCache's, `owner/name#N` that repository's."""
    found = [] if patch.upstream_pr == "none" else [patch.upstream_pr]
    for match in _REFERENCE.finditer(message):
        number = match.group("number")
        if number is None:
            found.append(match.group(0))
            continue
        project = (match.group("project") or "vllm").lower()
        repository = match.group("repo") or _PROJECTS[project]
        found.append(f"{_GITHUB}/{repository}/pull/{number}")
    return list(dict.fromkeys(link.rstrip(".,);") for link in found))
