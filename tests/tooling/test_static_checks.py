"""`ci/suites/static_checks.py`: the record of a pass, which lets
`tools/test.sh --release-only` skip the checks only while the checkout's
files are as they were."""

import json
from pathlib import Path

import pytest
from conftest import run_git

from ci.suites import static_checks
from ci.suites.static_checks import PASSED, checkout_digest, passed_as_it_is


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git work tree with a committed file, an untracked one and an
    ignored one, as the checkout the checks read."""
    repo = tmp_path / "repo"
    repo.mkdir()
    run_git(repo, "init", "-q")
    (repo / ".gitignore").write_text("build/\n")
    (repo / "module.py").write_text("x = 1\n")
    run_git(repo, "add", "-A")
    run_git(repo, "commit", "-qm", "first")
    (repo / "new_test.py").write_text("def test(): pass\n")
    (repo / "build").mkdir()
    (repo / "build" / "out.txt").write_text("built\n")
    monkeypatch.setattr(static_checks, "REPO_ROOT", repo)
    return repo


def record(reports: Path) -> None:
    reports.mkdir(exist_ok=True)
    (reports / PASSED).write_text(json.dumps({"checkout": checkout_digest()}))


def test_a_pass_holds_until_a_file_git_would_commit_changes(checkout, tmp_path):
    reports = tmp_path / "reports"
    assert not passed_as_it_is(reports)
    record(reports)
    assert passed_as_it_is(reports)
    (checkout / "build" / "out.txt").write_text("rebuilt\n")
    assert passed_as_it_is(reports), "an ignored file is not read by the checks"
    (checkout / "new_test.py").write_text("def test(): assert False\n")
    assert not passed_as_it_is(reports), "an untracked test changed"
    record(reports)
    (checkout / "module.py").unlink()
    assert not passed_as_it_is(reports), "a committed file deleted"
    record(reports)
    (checkout / "other.py").write_text("")
    assert not passed_as_it_is(reports), "a file added"


def test_a_record_that_cannot_be_read_is_no_pass(checkout, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    for text in ("", "[]", '{"other": 1}', "{"):
        (reports / PASSED).write_text(text)
        assert not passed_as_it_is(reports)


def test_outside_a_git_work_tree_there_is_no_digest_to_match(tmp_path, monkeypatch):
    monkeypatch.setattr(static_checks, "REPO_ROOT", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert checkout_digest() is None
    assert not passed_as_it_is(tmp_path)
