"""`vllm_overlay.common.git`: whose config git reads, and why it failed."""

import subprocess

import pytest

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.git import git, git_cause, git_run


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository, and a user whose global config names them."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[user]\n\tname = Someone Else\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q")
    return path


def test_the_user_config_is_read_only_when_asked_for(repo):
    assert git_run(repo, "config", "user.name").stdout == ""
    mine = git_run(repo, "config", "user.name", user_config=True)
    assert mine.stdout == "Someone Else\n"


def test_a_failure_names_gits_own_cause_not_its_hints(repo):
    with pytest.raises(OverlayError, match=r"^git rev-parse in .*: Needed a single"):
        git(repo, "rev-parse", "--verify", "no-such-ref")
    proc = subprocess.CompletedProcess(
        ["git", "am"],
        128,
        stdout="",
        stderr="error: patch failed: a.py:3\nhint: Use 'git am --show-current-patch'\n"
        "error: a.py: patch does not apply.\n",
    )
    assert git_cause(proc) == "patch failed: a.py:3; a.py: patch does not apply"
