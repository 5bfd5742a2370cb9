"""A vLLM git checkout at a ref, read as `status` reads a release.

`vllm-overlay status --source PATH[@REF]` checks the series against vLLM's
main branch (or any commit) before it is released: the files the series
touches are read from the commit with `git cat-file`, nothing is checked
out, and the clone is only read. A blobless clone (`git clone
--filter=blob:none`) is enough: git fetches the few blobs read on demand.

The commit's release is the newest release tag it contains (`git describe
--tags --match 'v[0-9]*'`): its series is the nearest, and a `Backport
<release>` patch is dropped only for a release the commit contains. A
commit with no release tag behind it is checked against the newest series,
and says so; only a shallow clone (`git rev-parse --is-shallow-repository`)
is blamed for it, since a full clone without tags is just that.

A commit is named one way everywhere (`status --source`, `rebase --source`,
`python -m ci.track_main`): `PATH@REF`, or `PATH` for its HEAD.
"""

from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.git import git, git_bytes, git_run


@dataclass(frozen=True)
class GitSource:
    """One commit of a vLLM clone: what `status` names it by, and its files."""

    repo: Path
    ref: str
    commit: str
    # The committer date, YYYY-MM-DD.
    date: str
    # The newest release tag the commit contains ("" when none is reachable).
    release: str
    # Whether the clone is shallow: its history, and so its tags, cut short.
    shallow: bool

    @property
    def label(self) -> str:
        """`main@0123456789ab`: the ref as asked, and the commit it was."""
        return f"{self.ref}@{self.commit[:12]}"

    def files(self, names: list[str] | tuple[str, ...]) -> dict[str, bytes]:
        """The bytes of those of `names` the commit holds, as `wheel_members`
        gives a release's (a file a patch creates is absent upstream)."""
        listed = git(
            self.repo, "ls-tree", "-r", "--name-only", self.commit, "--", *names
        )
        present = set(listed.splitlines())
        return {
            name: git_bytes(self.repo, "cat-file", "blob", f"{self.commit}:{name}")
            for name in names
            if name in present
        }


def open_git_source(spec: str, argument: str = "--source") -> GitSource:
    """`PATH` (its HEAD) or `PATH@REF`: a git clone of vLLM and a commit in
    it; an `OverlayError` naming what is wrong (and the `argument` that said
    it) otherwise."""
    path, ref = Path(spec), "HEAD"
    if not path.is_dir() and "@" in spec:
        head, _, tail = spec.rpartition("@")
        path, ref = Path(head), tail
    if not path.is_dir():
        raise OverlayError(f"{argument} {spec}: {path} is not a directory")
    inside = git_run(path, "rev-parse", "--is-inside-work-tree", "--git-dir")
    if inside.returncode != 0:
        raise OverlayError(f"{argument} {spec}: {path} is not a git clone")
    found = git_run(path, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if found.returncode != 0:
        raise OverlayError(f"{argument} {spec}: {ref!r} names no commit in {path}")
    commit = found.stdout.strip()
    if git_run(path, "cat-file", "-e", f"{commit}:vllm").returncode != 0:
        raise OverlayError(f"{argument} {spec}: commit {commit[:12]} has no vllm/")
    date = git(path, "log", "-1", "--format=%cs", commit).strip()
    shallow = git(path, "rev-parse", "--is-shallow-repository").strip() == "true"
    return GitSource(path, ref, commit, date, _release_of(path, commit), shallow)


def _release_of(repo: Path, commit: str) -> str:
    """The version of the newest release tag `commit` contains, or ""."""
    proc = git_run(
        repo, "describe", "--tags", "--abbrev=0", "--match", "v[0-9]*", commit
    )
    tag = proc.stdout.strip().removeprefix("v") if proc.returncode == 0 else ""
    try:
        return str(Version(tag)) if tag else ""
    except InvalidVersion:
        return ""
