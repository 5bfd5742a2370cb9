"""The nightly check against vLLM main (`ci/track_main.py`), on a local git
history built from the fixture's release (`conftest.make_vllm_clone`): what
it keeps between runs, its summary, and its exit status."""

import json

import pytest
from conftest import make_vllm_clone, run_git

from ci import track_main

PATCH = "scheduler-demo.patch"


@pytest.fixture
def clone(tmp_path):
    return make_vllm_clone(tmp_path / "vllm")


def run(clone, tmp_path, ref: str) -> tuple[int, str]:
    summary = tmp_path / f"summary-{ref}.md"
    code = track_main.main(
        [
            str(clone),
            "--ref",
            ref,
            "--state",
            str(tmp_path / "state"),
            "--summary",
            str(summary),
        ]
    )
    return code, summary.read_text()


def kept(tmp_path, name: str) -> dict:
    return json.loads((tmp_path / "state" / name).read_text())


def test_a_first_run_records_and_passes(project, clone, tmp_path, capsys):
    code, text = run(clone, tmp_path, "release")
    commit = run_git(clone, "rev-parse", "release").strip()
    assert code == 0
    assert "First run: nothing to compare with." in text
    assert f"| `{PATCH}` | applies exactly | - |" in text
    assert kept(tmp_path, "last.json")["verdicts"] == {PATCH: "applies exactly"}
    assert kept(tmp_path, "good.json")["commit"] == commit
    assert f"Last good commit (no patch conflicts): `{commit}`" in text


def test_a_changed_verdict_fails_once(project, clone, tmp_path, capsys):
    assert run(clone, tmp_path, "release")[0] == 0
    code, text = run(clone, tmp_path, "moved")
    assert code == 1
    assert f"- {PATCH}: applies exactly -> applies only with offset" in text
    code, text = run(clone, tmp_path, "moved")
    assert code == 0
    assert "No verdict changed since the last run" in text


def test_the_last_good_commit_survives_a_conflict(project, clone, tmp_path, capsys):
    assert run(clone, tmp_path, "moved")[0] == 0
    good = run_git(clone, "rev-parse", "moved").strip()
    code, text = run(clone, tmp_path, "conflict")
    assert code == 1
    assert f"| `{PATCH}` | conflicts | applies only with offset |" in text
    assert kept(tmp_path, "good.json")["commit"] == good
    assert f"Last good commit (no patch conflicts): `{good}`" in text


def test_an_unreadable_state_is_an_error(project, clone, tmp_path, capsys):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "last.json").write_text("{not json")
    code = track_main.main([str(clone), "--state", str(tmp_path / "state")])
    assert code == 1
    assert "last.json: not the JSON this script writes" in capsys.readouterr().err
