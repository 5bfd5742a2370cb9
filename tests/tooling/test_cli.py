"""Every bad input named by the foundation issue: a one-line error, a non-zero
exit, and nothing written."""

import os
from pathlib import Path

import pytest
from conftest import RELEASE, make_wheel, run_cli

from vllm_overlay.common.errors import OverlayError, exit_status

WHEEL = f"vllm-{RELEASE}-cp38-abi3-linux_x86_64.whl"


@pytest.fixture
def offline(monkeypatch):
    """pip with no index, no find-links and no config: nothing can download."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")


def assert_refused(capsys, dist: Path, *argv: str, message: str) -> None:
    code, out, err = run_cli(capsys, "build", *argv, "--out", str(dist))
    assert code == 1
    lines = err.strip().splitlines()
    assert lines[-1].startswith("vllm-overlay: error: ")
    assert message in lines[-1], lines[-1]
    assert out == ""
    assert not dist.exists() or list(dist.iterdir()) == []


def test_build_prints_the_wheel(project, tmp_path, capsys):
    code, out, _ = run_cli(capsys, "build", "--out", str(tmp_path / "dist"))
    assert code == 0
    assert (
        Path(out.strip()).name
        == f"vllm-{RELEASE}+hybridkv.1-cp38-abi3-linux_x86_64.whl"
    )


def test_unknown_release(project, tmp_path, capsys):
    assert_refused(
        capsys, tmp_path / "d", "0.1.0", message="0.1.0 is not a pinned release"
    )


def test_release_without_series(project, tmp_path, capsys):
    (project.series_dir / "series").unlink()
    assert_refused(capsys, tmp_path / "d", RELEASE, message="has no series")


def test_missing_trailer(project, tmp_path, capsys):
    path = project.series_dir / "scheduler-demo.patch"
    path.write_text(
        path.read_text().replace("Drop-When: upstream validates the value itself\n", "")
    )
    assert_refused(capsys, tmp_path / "d", message="missing trailer Drop-When")


def test_malformed_patch(project, tmp_path, capsys):
    (project.series_dir / "scheduler-demo.patch").write_text("not a patch\n")
    assert_refused(capsys, tmp_path / "d", message="not a git format-patch file")


def test_patch_that_does_not_apply(project, tmp_path, capsys):
    changed = make_wheel(
        project.workdir / "changed" / WHEEL,
        members={"vllm/v1/core/sched/scheduler.py": b"rewritten upstream\n"},
    )
    project.pin([("vllm", changed)])
    assert_refused(capsys, tmp_path / "d", message="does not apply exactly")


def test_no_network_and_empty_cache(project, tmp_path, capsys, offline):
    (project.cache / "wheels" / WHEEL).unlink()
    assert_refused(capsys, tmp_path / "d", message="cannot download vllm==9.9.0")


def test_downloaded_file_with_wrong_sha256(
    project, tmp_path, capsys, monkeypatch, offline
):
    impostor = make_wheel(
        project.workdir / "index" / WHEEL, members={"vllm/extra.py": b"x = 1\n"}
    )
    (project.cache / "wheels" / WHEEL).unlink()
    monkeypatch.setenv("PIP_FIND_LINKS", str(impostor.parent))
    assert_refused(capsys, tmp_path / "d", message="does not match the pinned sha256")


def test_corrupted_cache_is_not_used(project, tmp_path, capsys, offline):
    cached = project.cache / "wheels" / WHEEL
    cached.write_bytes(cached.read_bytes()[:-1] + b"!")
    code, _, err = run_cli(capsys, "build", "--out", str(tmp_path / "d"))
    assert code == 1
    assert f"cached {cached} does not match its pinned sha256" in err
    assert "error: cannot download vllm==9.9.0" in err.splitlines()[-1]
    assert not cached.exists()


def test_lint_reports_problems_and_exit_code(project, capsys):
    assert run_cli(capsys, "lint")[0] == 0
    (project.series_dir / "stray.patch").write_text("x")
    code, _, err = run_cli(capsys, "lint")
    assert code == 1
    assert "stray.patch: not listed" in err


def test_an_entry_point_refusal_is_one_line_and_status_1(capsys):
    def refuse() -> int:
        raise OverlayError("the pins file\n  is not valid TOML")

    assert exit_status(refuse) == 1
    assert exit_status(lambda: 3) == 3
    assert capsys.readouterr().err == (
        "vllm-overlay: error: the pins file is not valid TOML\n"
    )
