"""Re-export a series from a patched git tree: `vllm-overlay refresh`.

Electron's workflow: a maintainer edits the series as commits on top of the
pristine upstream files, then writes every commit back out as one
`git format-patch` file. The output must be byte-stable, so that re-exporting
an unchanged tree gives no diff and CI can fail when `patches/` is not what a
refresh would write. Two things make it so:

- every option of `git format-patch` that a configuration could change is
  given on the command line, and the user's and the system's git config are
  not read (`vllm_overlay.common.git`), so nobody's `format.*` or `diff.*` settings
  leak in;
- `scratch_tree.materialize` rebuilds the tree from a series with a fixed
  identity and the patches' own author dates, so the round trip series ->
  tree -> series is exact, and any hand edit a refresh would undo shows up as
  a difference (`round_trip`).
"""

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from vllm_overlay.common.atomic import replace_dir
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.git import git, git_bytes
from vllm_overlay.common.locations import patches_root
from vllm_overlay.series.checks import series_problems
from vllm_overlay.series.loader import pinned_releases
from vllm_overlay.series.model import (
    PATCH_SUFFIX,
    SERIES_FILE,
    parse_patch,
    read_series_file,
    series_dir,
)
from vllm_overlay.series.pins import resolve_release

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
_SERIES_HEADER = "# Patch series over vLLM {version}, applied in this order.\n"
_NOT_SLUG = re.compile(r"[^a-z0-9]+")


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
    return git_bytes(repo, *_FORMAT_PATCH, "-1", commit)


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
    write_series_dir(exported, release, target)
    return target, changed


def write_series_dir(exported: Mapping[str, bytes], release: str, target: Path) -> None:
    """`exported` and its `series` file as the directory `target`, replaced
    whole or not at all; `release` names what the series is over."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for name, data in exported.items():
            (staging / name).write_bytes(data)
        (staging / SERIES_FILE).write_text(
            series_text(release, list(exported)), encoding="utf-8"
        )
        replace_dir(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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


def refresh(
    version: str, repo: Path, base: str, root: Path | None = None
) -> tuple[Path, list[str]]:
    """`vllm-overlay refresh RELEASE --repo PATH --base REF`: the release must be
    pinned, so a typo cannot create a series nobody builds."""
    root = root or patches_root()
    release = resolve_release(pinned_releases(root), version)
    return write_series(repo, base, release.version, root)
