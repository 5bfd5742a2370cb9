"""Re-export a series from a patched git tree: `vllm-overlay refresh`.

Electron's workflow: a maintainer edits the series as commits on top of the
pristine upstream files, then writes every commit back out as one
`git format-patch` file. The output must be byte-stable, so that re-exporting
an unchanged tree gives no diff and CI can fail when `patches/` is not what a
refresh would write. Two things make it so:

- every option of `git format-patch` that a configuration could change is
  given on the command line, and the user's and the system's git config are
  not read (`_GIT_ENV`), so nobody's `format.*` or `diff.*` settings leak in;
- `materialize` rebuilds the tree from a series with a fixed identity and the
  patches' own author dates, so the round trip series -> tree -> series is
  exact, and any hand edit a refresh would undo shows up as a difference.
"""

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from vllm_overlay.build.fetch import fetch_sdist_tree, fetch_wheel, wheel_members
from vllm_overlay.errors import OverlayError
from vllm_overlay.locations import cache_root, patches_root
from vllm_overlay.release import pinned_releases, release_series
from vllm_overlay.series.model import (
    PATCH_SUFFIX,
    SERIES_FILE,
    Series,
    parse_patch,
    read_series_file,
    series_dir,
    series_problems,
)
from vllm_overlay.series.pins import resolve_release

UPSTREAM_TAG = "upstream"
_IDENTITY = "vllm-overlay"
_EMAIL = "vllm-overlay@example.invalid"
# The author date of the pristine commit; it never reaches a patch file.
_UPSTREAM_DATE = "2000-01-01T00:00:00+00:00"
_GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
    "TZ": "UTC",
}
# Every knob of the output, so that the repository's own config cannot move
# a byte either. The abbreviation is the one the series was written with.
_FORMAT_PATCH = (
    *("format-patch", "--stdout", "--zero-commit", "--no-signature"),
    *("--no-numbered", "--subject-prefix=PATCH", "--no-thread", "--no-attach"),
    *("--no-notes", "--no-base", "--no-signoff", "--no-to", "--no-cc"),
    *("--no-add-header", "--no-from", "--no-cover-letter", "--encode-email-headers"),
    *("--no-renames", "--diff-algorithm=myers", "-U3", "--inter-hunk-context=0"),
    *("--indent-heuristic", "--src-prefix=a/", "--dst-prefix=b/", "--no-relative"),
    *("--abbrev=7", f"-O{os.devnull}", "--stat-width=72"),
)
# The lines by which git states why it failed, as opposed to its hints.
_CAUSE_PREFIXES = ("error: ", "fatal: ")
_SERIES_HEADER = "# Patch series over vLLM {version}, applied in this order.\n"
_NOT_SLUG = re.compile(r"[^a-z0-9]+")


def commit_identity() -> dict[str, str]:
    """The fixed author and committer of the scratch repositories' commits."""
    return {
        "GIT_AUTHOR_NAME": _IDENTITY,
        "GIT_AUTHOR_EMAIL": _EMAIL,
        "GIT_COMMITTER_NAME": _IDENTITY,
        "GIT_COMMITTER_EMAIL": _EMAIL,
    }


def git_run(
    repo: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    user_config: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run git in `repo`, for a caller that reads the exit status itself.

    Without the user's config by default: the scratch repositories must not
    depend on it. `user_config` is for the maintainer's own checkout, where
    their identity and settings apply. Messages are always in English, so
    that `git_cause` can find the error lines."""
    isolation = {"LC_ALL": "C"} if user_config else _GIT_ENV
    return subprocess.run(
        ["git", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, **isolation, **(env or {})},
        check=False,
    )


def git_cause(proc: subprocess.CompletedProcess) -> str:
    """Why git failed, in its own words: its `error:` and `fatal:` lines.

    Not its last line: after a failed `am` or `cherry-pick` that is a hint
    on how to go on with an operation the tool has already undone, while
    the cause (`sha1 information is lacking ...`, `patch does not apply`)
    comes first."""
    output = [
        text.decode(errors="replace") if isinstance(text, bytes) else text or ""
        for text in (proc.stderr, proc.stdout)
    ]
    lines = [line.strip() for line in "\n".join(output).splitlines() if line.strip()]
    causes = [
        line.split(": ", 1)[1].rstrip(".")
        for line in lines
        if line.startswith(_CAUSE_PREFIXES)
    ]
    if not causes:
        causes = [line for line in lines if not line.startswith("hint:")][:1]
    return "; ".join(dict.fromkeys(causes)) or f"exit status {proc.returncode}"


def git(repo: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    """Run git in `repo` without the user's config; a failure is an
    `OverlayError` with git's own cause (`git_cause`)."""
    proc = git_run(repo, *args, env=env)
    if proc.returncode != 0:
        raise OverlayError(f"git {args[0]} in {repo}: {git_cause(proc)}")
    return proc.stdout


def export_series(
    repo: Path,
    base: str,
    release: str,
    root: Path,
    names_from: Path | None = None,
    allow_empty: bool = False,
) -> dict[str, bytes]:
    """Patch file name -> the bytes `git format-patch` writes, for every commit
    of `base..HEAD` in `repo`, oldest first. Each commit keeps the file name of
    the entry with its subject in the series at `names_from` (default: the
    release's own), else gets a slug of it. No commits at all is an error
    unless `allow_empty` (a rebase whose every patch upstream absorbed)."""
    _check_repo(repo, base)
    known = _names_by_subject(names_from or series_dir(root, release))
    exported: dict[str, bytes] = {}
    for commit in git(repo, "rev-list", "--reverse", f"{base}..HEAD").split():
        data = format_patch_bytes(repo, commit)
        subject = git(repo, "log", "-1", "--format=%s", commit).strip()
        name = known.get(subject) or slug(subject)
        if name in exported:
            raise OverlayError(
                f"commit {commit[:12]} ({subject!r}): a second patch named {name}"
            )
        _check_exported(name, data, commit, root.parent)
        exported[name] = data
    if not exported and not allow_empty:
        raise OverlayError(f"{repo}: no commits in {base}..HEAD")
    return exported


def slug(subject: str) -> str:
    """`scheduler: zero negative hits` -> `scheduler-zero-negative-hits.patch`."""
    return _NOT_SLUG.sub("-", subject.lower()).strip("-") + PATCH_SUFFIX


def _check_repo(repo: Path, base: str) -> None:
    if not (repo / ".git").exists():
        raise OverlayError(f"{repo} is not a git work tree")
    try:
        git(repo, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    except OverlayError:
        raise OverlayError(f"{repo}: base {base!r} is not a commit") from None
    # Untracked files count too: a new module left out of its commit would
    # silently be left out of the patch.
    dirty = git(repo, "status", "--porcelain")
    if dirty.strip():
        raise OverlayError(
            f"{repo} has uncommitted changes; commit or stash them first"
        )


def format_patch_bytes(repo: Path, commit: str) -> bytes:
    """The patch of one commit, exactly as `format-patch` writes it: bytes,
    since the message is the commit's and must round-trip unchanged."""
    proc = subprocess.run(
        ["git", *_FORMAT_PATCH, "-1", commit],
        cwd=repo,
        capture_output=True,
        env={**os.environ, **_GIT_ENV},
        check=False,
    )
    if proc.returncode != 0:
        raise OverlayError(
            f"git format-patch {commit[:12]} in {repo}: {git_cause(proc)}"
        )
    return proc.stdout


def _names_by_subject(directory: Path) -> dict[str, str]:
    """Subject -> file name of the existing series, so a refresh keeps names."""
    if not (directory / SERIES_FILE).is_file():
        return {}
    names = {}
    for name in read_series_file(directory / SERIES_FILE):
        try:
            names.setdefault(parse_patch(directory / name).subject, name)
        except (OSError, OverlayError):
            continue  # a missing or broken patch is what the refresh replaces
    return names


def _check_exported(name: str, data: bytes, commit: str, repo_root: Path) -> None:
    """The exported patch parses and passes the series lint (trailers, probe
    ids), or an error naming the commit: a refresh never writes a patch that
    `vllm-overlay lint` would reject."""
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-export-") as scratch:
        directory = Path(scratch)
        (directory / name).write_bytes(data)
        (directory / SERIES_FILE).write_text(name + "\n", encoding="utf-8")
        problems = series_problems(directory, repo_root)
    if problems:
        reason = problems[0].replace(f"{directory / name}: ", "")
        raise OverlayError(f"commit {commit[:12]} ({name}): {reason}")


def series_text(release: str, names: list[str]) -> str:
    """The `series` order file a refresh writes."""
    return _SERIES_HEADER.format(version=release) + "".join(f"{n}\n" for n in names)


def write_series(
    repo: Path, base: str, release: str, root: Path
) -> tuple[Path, list[str]]:
    """Export `base..HEAD` of `repo` into the release's series directory, which
    is replaced whole or not at all; returns it and the names that changed."""
    exported = export_series(repo, base, release, root)
    return write_exported(exported, release, root)


def write_exported(
    exported: Mapping[str, bytes], release: str, root: Path
) -> tuple[Path, list[str]]:
    """Write `exported` (name -> patch bytes, in series order) as the release's
    series directory, replaced whole or not at all; returns it and the names
    that changed."""
    target = series_dir(root, release)
    changed = series_diff(exported, release, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for name, data in exported.items():
            (staging / name).write_bytes(data)
        (staging / SERIES_FILE).write_text(
            series_text(release, list(exported)), encoding="utf-8"
        )
        _swap(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, changed


def _swap(staging: Path, target: Path) -> None:
    """Replace `target` by `staging`: two renames, the old directory restored
    if the second fails, so the series is never half-written."""
    if not target.exists():
        os.replace(staging, target)
        return
    old = target.with_name(f".{target.name}-old")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(target, old)
    try:
        os.replace(staging, target)
    except OSError:
        os.replace(old, target)
        raise
    shutil.rmtree(old)


def series_diff(
    exported: Mapping[str, bytes], release: str, directory: Path
) -> list[str]:
    """The files of `directory` that differ from what an export of `exported`
    writes there: changed, missing or extra patch files, and `series` when its
    bytes (the order) differ."""
    wanted = {
        **exported,
        SERIES_FILE: series_text(release, list(exported)).encode(),
    }
    present = {p.name for p in directory.glob(f"*{PATCH_SUFFIX}")}
    return [
        name
        for name in sorted(present | set(wanted))
        if not (directory / name).is_file()
        or (directory / name).read_bytes() != wanted.get(name)
    ]


def materialize(series: Series, originals: Mapping[str, bytes], dest: Path) -> Path:
    """A git repository at `dest` holding the pristine files (`originals`)
    committed and tagged `upstream`, then one commit per patch (`git am`, with
    a fixed committer and the patch's own date, so the tree is reproducible)."""
    dest.mkdir(parents=True)
    git(dest, "init", "-q")
    for name, content in originals.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(content)
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


def check_round_trip(
    series: Series, wheel: Path, sdist_tree: Path | None, root: Path
) -> list[str]:
    """The files of the release's series that a refresh of the series itself
    would change; empty when `patches/` is exactly what refresh writes."""
    originals = pristine_files(series, wheel, sdist_tree)
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-refresh-") as scratch:
        repo = materialize(series, originals, Path(scratch) / "tree")
        exported = export_series(repo, UPSTREAM_TAG, series.release.version, root)
    return series_diff(exported, series.release.version, series.directory)


def refresh(
    version: str, repo: Path, base: str, root: Path | None = None
) -> tuple[Path, list[str]]:
    """`vllm-overlay refresh RELEASE --repo PATH --base REF`: the release must be
    pinned, so a typo cannot create a series nobody builds."""
    root = root or patches_root()
    release = resolve_release(pinned_releases(root), version)
    return write_series(repo, base, release.version, root)


def refresh_check(
    version: str, root: Path | None = None, cache: Path | None = None
) -> list[str]:
    """`vllm-overlay refresh RELEASE --check`: the round trip on the pinned
    `vllm` wheel, plus the sdist only when the series touches `tests/`."""
    root = root or patches_root()
    cache = cache or cache_root()
    series = release_series(version, root)
    wheel = fetch_wheel(series.release, series.release.wheel_for("vllm"), cache)
    sdist = (
        fetch_sdist_tree(series.release, cache) if series.upstream_test_files else None
    )
    return check_round_trip(series, wheel, sdist, root)
