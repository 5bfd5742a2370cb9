"""An upstream-ready contribution from one patch: `vllm-overlay extract`.

Output: one commit on pristine vLLM holding the patch's change, its probes
turned into upstream tests (`upstream_tests.py`), the patch message without
our own trailers and a `Signed-off-by` (vLLM requires the DCO), plus a PR
description generated from the message and trailers. Without `--repo` the
commit is written as an mbox next to the description; with `--repo PATH` (a
vLLM git checkout) it is applied there with `git am --3way` on a new branch.

Refused, before anything is written: an `Inappropriate` patch (it is ours on
purpose), a patch whose probes do not all fail on the unpatched release (a
contribution must come with a test that fails without it), and a patch that
does not apply to pristine vLLM without the patches before it.
"""

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from vllm_overlay.errors import OverlayError
from vllm_overlay.export import (
    UPSTREAM_TAG,
    commit_identity,
    format_patch_bytes,
    git,
    git_cause,
    git_run,
    materialize,
    pristine_files,
)
from vllm_overlay.fetch import fetch_sdist_tree, fetch_wheel
from vllm_overlay.locations import cache_root, patches_root
from vllm_overlay.probing import (
    STILL_NEEDED,
    env_python,
    no_environment,
    probe_verdict,
    run_pristine,
)
from vllm_overlay.release import release_series
from vllm_overlay.series import (
    PATCH_SUFFIX,
    REQUIRED_TRAILERS,
    TESTS_DIR,
    Patch,
    Series,
)
from vllm_overlay.upstream_tests import ConvertedTests, convert_probes

BRANCH_PREFIX = "overlay/"
DESCRIPTION_FILE = "PR.md"
_REFERENCE = re.compile(
    r"(?:vllm)?#(\d{4,6})\b|https://github\.com/\S+/(?:pull|issues)/\d+"
)
_UPSTREAM = "https://github.com/vllm-project/vllm"


@dataclass(frozen=True)
class Extraction:
    """What `extract` wrote: a directory with the description (and the mbox
    when no repository was given), and the branch when one was."""

    directory: Path
    branch: str | None
    tests: ConvertedTests


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
    if patch.upstream_status.startswith("Inappropriate"):
        raise OverlayError(
            f"{patch.name} is Upstream-Status: {patch.upstream_status}; it is not "
            "meant for upstream, so there is nothing to extract"
        )
    stem = patch.name.removesuffix(PATCH_SUFFIX)
    target = out / stem
    if target.exists():
        raise OverlayError(f"{target} already exists; remove it first")
    branch = BRANCH_PREFIX + stem
    if repo is not None:
        _check_contribution_repo(repo, branch)
    signoff = signoff_identity(repo or root.parent)
    _check_probes_fail(series, patch, root.parent, cache)
    sdist = fetch_sdist_tree(series.release, cache)
    wheel = fetch_wheel(series.release, series.release.wheel_for("vllm"), cache)
    tests = convert_probes(patch, root.parent, sdist)
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-extract-") as scratch:
        mbox = _contribution(
            series,
            patch,
            pristine_files(series, wheel, sdist),
            tests,
            signoff,
            Path(scratch) / "tree",
        )
        description = pr_description(patch, series, tests, _message(mbox))
        made = _made(out)
        staging = Path(tempfile.mkdtemp(prefix=f".{stem}-", dir=out))
        try:
            (staging / f"{stem}.mbox").write_bytes(mbox)
            (staging / DESCRIPTION_FILE).write_text(description, encoding="utf-8")
            if repo is not None:
                _apply_on_branch(repo, branch, staging / f"{stem}.mbox")
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            for directory in made:
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise
    return Extraction(target, branch if repo is not None else None, tests)


def _made(directory: Path) -> list[Path]:
    """Create `directory`; return the directories that did not exist before,
    deepest first, so that a failed extraction can take them away again."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    directory.mkdir(parents=True, exist_ok=True)
    return missing


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


def _check_probes_fail(
    series: Series, patch: Patch, repo_root: Path, cache: Path
) -> None:
    version = series.release.version
    python = env_python(version, cache)
    if python is None:
        raise OverlayError(
            f"cannot check that the probes of {patch.name} fail without it: "
            + no_environment(version)
        )
    outcomes = run_pristine(list(patch.probes), python, repo_root)
    verdict = probe_verdict(patch.probes, outcomes)
    if verdict != STILL_NEEDED:
        raise OverlayError(
            f"the probes of {patch.name} do not all fail on unpatched vLLM "
            f"{version} ({verdict}); a contribution needs a test that fails "
            "without it"
        )


def _contribution(
    series: Series,
    patch: Patch,
    originals: dict[str, bytes],
    tests: ConvertedTests,
    signoff: str,
    tree: Path,
) -> bytes:
    """The contribution commit as `git format-patch` writes it."""
    index = series.patches.index(patch)
    materialize(replace(series, patches=series.patches[: index + 1]), originals, tree)
    tip = git(tree, "rev-parse", "HEAD").strip()
    git(tree, "checkout", "-q", "-b", "contribution", UPSTREAM_TAG)
    picked = git_run(tree, "cherry-pick", tip, env=commit_identity())
    if picked.returncode != 0:
        earlier = [
            p.name for p in series.patches[:index] if set(p.files) & set(patch.files)
        ]
        raise OverlayError(
            f"{patch.name} does not apply to pristine vLLM {series.release.version} "
            f"without the patches before it ({', '.join(earlier)}); extract those first"
        )
    for name, text in tests.files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text, encoding="utf-8")
    git(tree, "add", "-A")
    message = _upstream_message(git(tree, "log", "-1", "--format=%B"), signoff)
    name, _, email = signoff.partition(" <")
    git(
        tree,
        *("commit", "-q", "--amend", "-m", message),
        env={"GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email.rstrip(">")},
    )
    return format_patch_bytes(tree, "HEAD")


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


def _message(mbox: bytes) -> str:
    """The commit message of a one-commit mbox: after the headers, up to `---`."""
    text = mbox.decode("utf-8")
    return text.split("\n\n", 1)[1].split("\n---\n", 1)[0]


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
    patch: Patch, series: Series, tests: ConvertedTests, message: str
) -> str:
    """The PR description in markdown: summary, motivation, test plan with
    the exact commands, related PRs and issues. Our messages open with why
    the change is needed, then say what it does."""
    paragraphs = [p for p in message.strip().split("\n\n") if p.strip()]
    why, *what = paragraphs[:-1]  # the last paragraph is the sign-off
    version = series.release.version
    changed = [f for f in patch.files if not f.startswith(TESTS_DIR)]
    updated = [f for f in patch.files if f.startswith(TESTS_DIR)]
    commands = [f"pytest {tests.package} -v"] + [f"pytest {f} -v" for f in updated]
    parts = [
        f"# {patch.subject}\n",
        "## Summary\n",
        f"{patch.subject[0].upper()}{patch.subject[1:]}. Changes "
        + ", ".join(f"`{f}`" for f in changed)
        + (f"; updates {', '.join(f'`{f}`' for f in updated)}" if updated else "")
        + f"; adds the tests in `{tests.package}/`.\n",
        "## Motivation\n",
        why + "\n",
    ]
    if what:
        parts += ["## The change\n", "\n\n".join(what) + "\n"]
    parts += [
        "## Test plan\n",
        f"The new tests fail on vLLM {version} without this change and pass "
        "with it"
        + (", and the updated upstream tests pass" if updated else "")
        + ":\n",
        "```bash\n" + "\n".join(commands) + "\n```\n",
        "New tests:\n",
        "".join(f"- `{test}`\n" for test in tests.test_ids),
    ]
    related = _references(patch, message)
    if related:
        parts += ["## Related\n", "".join(f"- {link}\n" for link in related)]
    parts.append(
        f"<sub>Extracted by vllm-overlay from `{patch.name}` of the "
        f"`{series.series_id}` series "
        f"(Upstream-Status: {patch.upstream_status}).</sub>\n"
    )
    return "\n".join(parts)


def _references(patch: Patch, message: str) -> list[str]:
    """The Upstream-PR link and every PR or issue the message names, once."""
    found = [] if patch.upstream_pr == "none" else [patch.upstream_pr]
    for match in _REFERENCE.finditer(message):
        number = match.group(1)
        found.append(f"{_UPSTREAM}/pull/{number}" if number else match.group(0))
    return list(dict.fromkeys(link.rstrip(".,);") for link in found))
