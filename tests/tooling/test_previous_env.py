"""`ci/envs/previous.py`: which commit holds the previous revision of a
release's series, and what a clone without it is told."""

from pathlib import Path

import pytest

from ci.envs.previous import PINS, NoEarlierRevision, previous_commit
from tests.tooling.conftest import run_git


def commit_pins(repo: Path, revisions: dict[str, int], message: str) -> str:
    """A commit whose pins give each release its revision; its hash."""
    pins = repo / PINS
    pins.parent.mkdir(parents=True, exist_ok=True)
    pins.write_text(
        "".join(
            f'[releases."{release}"]\nrevision = {revision}\n\n'
            for release, revision in revisions.items()
        )
    )
    run_git(repo, "add", PINS)
    run_git(repo, "commit", "-q", "-m", message)
    return run_git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A clone whose 1.0.0 went from revision 1 to 3, 2.0.0 pinned later,
    and a commit that changed no pins on top."""
    repo = tmp_path / "repo"
    repo.mkdir()
    run_git(repo, "init", "-q")
    commits = {
        "one": commit_pins(repo, {"1.0.0": 1}, "1.0.0 pinned"),
        "two": commit_pins(repo, {"1.0.0": 2}, "1.0.0 hybridkv.2"),
        "pinned": commit_pins(repo, {"1.0.0": 2, "2.0.0": 1}, "2.0.0 pinned"),
        "three": commit_pins(repo, {"1.0.0": 3, "2.0.0": 1}, "1.0.0 hybridkv.3"),
    }
    (repo / "README").write_text("unrelated\n")
    run_git(repo, "add", "README")
    run_git(repo, "commit", "-q", "-m", "docs")
    return repo, commits


def test_the_newest_commit_with_an_earlier_revision_is_taken(history):
    repo, commits = history
    # The newest commit with revision 2, not the one that made it 2.
    assert previous_commit(repo, "1.0.0", 3) == (commits["pinned"], 2)
    # A revision not yet committed (the maintainer's bump in the work tree).
    assert previous_commit(repo, "1.0.0", 4) == (commits["three"], 3)
    assert previous_commit(repo, "1.0.0", 2) == (commits["one"], 1)


def test_a_release_without_an_earlier_revision_is_not_a_failure(history):
    repo, _ = history
    with pytest.raises(NoEarlierRevision, match=r"2\.0\.0's series before hybridkv\.1"):
        previous_commit(repo, "2.0.0", 1)
    with pytest.raises(NoEarlierRevision, match=r"1\.0\.0's series before hybridkv\.1"):
        previous_commit(repo, "1.0.0", 1)


def test_a_shallow_clone_is_told_how_to_get_the_history(history, tmp_path):
    repo, _ = history
    shallow = tmp_path / "shallow"
    run_git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    with pytest.raises(
        NoEarlierRevision, match="a shallow clone: git fetch --unshallow"
    ):
        previous_commit(shallow, "1.0.0", 3)


def test_a_copy_without_git_is_told_it_has_no_history(tmp_path):
    with pytest.raises(NoEarlierRevision, match="is not a git clone"):
        previous_commit(tmp_path, "1.0.0", 3)
