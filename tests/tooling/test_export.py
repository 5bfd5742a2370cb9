"""`vllm-overlay refresh`: byte-stable export of a series from a git tree, and
the `--check` round trip that CI runs."""

import subprocess
from pathlib import Path

import pytest
from conftest import RELEASE, SCHEDULER, TRAILERS, run_cli

from vllm_overlay.series.loader import release_series
from vllm_overlay.track.checks.lint import lint
from vllm_overlay.track.workspace.scratch_tree import (
    UPSTREAM_TAG,
    materialize,
    pristine_files,
)

PATCH = "scheduler-demo.patch"


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture
def tree(project, tmp_path) -> Path:
    """The fixture series materialized: pristine files, then one commit a patch."""
    series = release_series(RELEASE)
    wheel = next((project.cache / "wheels").iterdir())
    return materialize(series, pristine_files(series, wheel, None), tmp_path / "t")


def commit(repo: Path, message: str, line: str = "line one, patched") -> None:
    path = repo / SCHEDULER
    path.write_text(path.read_text().replace("line 1\n", f"{line}\n", 1))
    git = ["git", "-c", "user.name=T", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "commit", "-qam", message], cwd=repo, check=True)


def refresh(capsys, repo: Path, base: str = UPSTREAM_TAG) -> tuple[int, str, str]:
    return run_cli(capsys, "refresh", RELEASE, "--repo", str(repo), "--base", base)


def test_fixture_series_round_trips(project, capsys):
    code, out, _ = run_cli(capsys, "refresh", RELEASE, "--check")
    assert code == 0
    assert "round-trips exactly" in out


@pytest.mark.parametrize(
    "edit",
    [
        lambda text: text.replace("\n\nWhy.\n", "\n\n\nWhy.\n", 1),
        lambda text: text.replace("Why.\n", "Why.  \n", 1),
        lambda text: text.replace(" 1 file changed", " 1 files changed", 1),
        lambda text: text.replace("Subject: [PATCH] ", "Subject: ", 1),
    ],
    ids=["blank-line", "trailing-space", "diffstat", "subject-prefix"],
)
def test_check_reports_a_hand_edited_patch(project, capsys, edit):
    path = project.series_dir / PATCH
    path.write_text(edit(path.read_text()))
    assert lint(project.patches) == []
    code, _, err = run_cli(capsys, "refresh", RELEASE, "--check")
    assert code == 1
    assert f"differs from what refresh writes: {PATCH}" in err


def test_check_names_gits_cause_when_a_patch_does_not_apply(project, capsys):
    path = project.series_dir / PATCH
    path.write_text(path.read_text().replace(" line 19\n", " line nineteen\n", 1))
    code, out, err = run_cli(capsys, "refresh", RELEASE, "--check")
    assert (code, out) == (1, "")
    assert err == (
        f"vllm-overlay: error: {PATCH} does not apply: patch failed: "
        f"{SCHEDULER}:17; {SCHEDULER}: patch does not apply\n"
    )


def test_check_reports_a_hand_edited_series_file(project, capsys):
    series = project.series_dir / "series"
    series.write_text(series.read_text() + "\n")
    code, _, err = run_cli(capsys, "refresh", RELEASE, "--check")
    assert code == 1
    assert "differs from what refresh writes: series" in err


def test_export_writes_the_series_and_is_stable(project, tree, capsys):
    before = snapshot(project.series_dir)
    code, out, _ = refresh(capsys, tree)
    assert (code, out.strip()) == (0, f"wrote {project.series_dir} (no changes)")
    assert snapshot(project.series_dir) == before

    commit(tree, f"scheduler: patch line one\n\nWhy.\n\n{TRAILERS}")
    code, out, _ = refresh(capsys, tree)
    assert code == 0
    assert "scheduler-patch-line-one.patch, series" in out
    written = snapshot(project.series_dir)
    assert written["series"].decode().splitlines()[1:] == [
        PATCH,
        "scheduler-patch-line-one.patch",
    ]
    assert written[PATCH] == before[PATCH]
    assert lint(project.patches) == []

    code, out, _ = refresh(capsys, tree)
    assert "(no changes)" in out
    assert snapshot(project.series_dir) == written
    assert run_cli(capsys, "refresh", RELEASE, "--check")[0] == 0


def test_export_removes_patches_no_longer_in_the_tree(project, tree, capsys):
    subprocess.run(["git", "reset", "-q", "--hard", UPSTREAM_TAG], cwd=tree, check=True)
    commit(tree, f"scheduler: other change\n\nWhy.\n\n{TRAILERS}")
    assert refresh(capsys, tree)[0] == 0
    assert sorted(snapshot(project.series_dir)) == [
        "scheduler-other-change.patch",
        "series",
    ]


def assert_refused(project, capsys, repo: Path, message: str, base: str) -> None:
    before = snapshot(project.series_dir)
    code, out, err = refresh(capsys, repo, base)
    assert code == 1
    assert out == ""
    assert err.startswith("vllm-overlay: error: ") and message in err, err
    assert snapshot(project.series_dir) == before
    leftovers = sorted(p.name for p in project.series_dir.parent.iterdir())
    assert leftovers == ["releases.toml", project.series_dir.name]


def test_dirty_tree_refused(project, tree, capsys):
    (tree / SCHEDULER).write_text("changed\n")
    assert_refused(project, capsys, tree, "uncommitted changes", UPSTREAM_TAG)


def test_missing_base_refused(project, tree, capsys):
    assert_refused(project, capsys, tree, "'nope' is not a commit", "nope")


def test_missing_repo_refused(project, tmp_path, capsys):
    missing = tmp_path / "missing"
    assert_refused(project, capsys, missing, "is not a git work tree", UPSTREAM_TAG)


def test_commit_without_trailers_refused(project, tree, capsys):
    commit(tree, "scheduler: no trailers\n\nWhy.\n")
    assert_refused(project, capsys, tree, "missing trailer Upstream-Status:", "HEAD~2")


def test_untracked_file_refused(project, tree, capsys):
    (tree / "vllm" / "new_module.py").write_text("X = 1\n")
    assert_refused(project, capsys, tree, "uncommitted changes", UPSTREAM_TAG)


def test_git_config_cannot_change_the_output(project, tree, capsys):
    for key, value in [
        ("diff.noprefix", "true"),
        ("core.abbrev", "12"),
        ("diff.algorithm", "patience"),
        ("diff.context", "5"),
        ("format.subjectPrefix", "FOO"),
        ("format.signature", "me"),
        ("format.useAutoBase", "true"),
    ]:
        subprocess.run(["git", "config", key, value], cwd=tree, check=True)
    before = snapshot(project.series_dir)
    assert refresh(capsys, tree)[1].strip().endswith("(no changes)")
    assert snapshot(project.series_dir) == before


def test_no_commits_refused(project, tree, capsys):
    assert_refused(project, capsys, tree, "no commits in HEAD..HEAD", "HEAD")


def test_refresh_needs_a_repo_or_check(project, capsys):
    code, _, err = run_cli(capsys, "refresh", RELEASE)
    assert code == 1
    assert "needs --repo PATH and --base REF, or --check" in err


def test_edit_opens_the_series_that_refresh_writes_back(project, tmp_path, capsys):
    """The documented path for a change to a patch: `edit` opens the series as
    a git tree, the maintainer amends the patch's commit, `refresh` writes it."""
    repo = tmp_path / "tree"
    code, out, err = run_cli(capsys, "edit", RELEASE, str(repo))
    assert code == 0, err
    assert f"vllm-overlay refresh {RELEASE} --repo {repo} --base upstream" in out
    path = repo / SCHEDULER
    path.write_text(path.read_text().replace("line 1\n", "line one, amended\n", 1))
    git = ["git", "-c", "user.name=T", "-c", "user.email=t@example.invalid"]
    subprocess.run(
        [*git, "commit", "-qa", "--amend", "--no-edit"], cwd=repo, check=True
    )

    code, out, err = refresh(capsys, repo)

    assert code == 0, err
    assert PATCH in out
    assert "+line one, amended" in (project.series_dir / PATCH).read_text()


def test_edit_adds_the_upstream_files_asked_for(project, tmp_path, capsys):
    repo = tmp_path / "tree"
    code, _, err = run_cli(
        capsys, "edit", RELEASE, str(repo), "--file", "vllm/v1/metrics/stats.py"
    )
    assert code == 0, err
    shown = subprocess.run(
        ["git", "show", f"{UPSTREAM_TAG}:vllm/v1/metrics/stats.py"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout == "STATS = 1\n"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--file", "vllm/absent.py"],
            f"vLLM {RELEASE} has no vllm/absent.py (a path in its wheel, or "
            "tests/... in its sdist); nothing was written",
        ),
        (["--file", "vllm/__init__.py", "--file", "vllm/absent.py"], None),
    ],
)
def test_edit_refuses_a_file_upstream_lacks(
    project, tmp_path, capsys, arguments, message
):
    repo = tmp_path / "tree"
    code, out, err = run_cli(capsys, "edit", RELEASE, str(repo), *arguments)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    if message is not None:
        assert err == f"vllm-overlay: error: {message}\n"
    assert not repo.exists()


def test_edit_refuses_an_existing_folder(project, tmp_path, capsys):
    code, out, err = run_cli(capsys, "edit", RELEASE, str(tmp_path))
    assert (code, out) == (1, "")
    assert err == (
        f"vllm-overlay: error: {tmp_path} already exists; name a new folder\n"
    )
