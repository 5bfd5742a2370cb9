"""The nightly check against vLLM main (`ci/track_main.py`), on a local git
history built from the fixture's release (`conftest.make_vllm_clone`): what
it keeps between runs, its summary, and its exit status."""

import json

import pytest
from conftest import SCHEDULER, make_vllm_clone, run_git, scheduler_edit

from ci import track_main

PATCH = "scheduler-demo.patch"


@pytest.fixture
def clone(tmp_path):
    return make_vllm_clone(tmp_path / "vllm")


def run(clone, tmp_path, ref: str) -> tuple[int, str]:
    summary = tmp_path / f"summary-{ref}.md"
    code = track_main.main(
        [
            f"{clone}@{ref}",
            "--state",
            str(tmp_path / "state"),
            "--summary",
            str(summary),
        ]
    )
    return code, summary.read_text()


def kept(tmp_path, name: str) -> dict:
    return json.loads((tmp_path / "state" / name).read_text())


def commit_of(clone, ref: str) -> str:
    return run_git(clone, "rev-parse", ref).strip()


def test_a_first_run_records_and_passes(project, clone, tmp_path, capsys):
    code, text = run(clone, tmp_path, "release")
    commit = commit_of(clone, "release")
    assert code == 0
    assert "Green: every patch applies exactly." in text
    assert "First run: no earlier verdicts to compare with." in text
    assert f"| `{PATCH}` | applies exactly | - | - |" in text
    assert kept(tmp_path, "last.json")["verdicts"] == {PATCH: "applies exactly"}
    assert kept(tmp_path, "last.json")["failing"] == {}
    assert kept(tmp_path, "good.json")["commit"] == commit
    assert f"Last good commit (every patch applies exactly): `{commit}`" in text


def test_a_first_run_with_a_conflict_is_red(project, clone, tmp_path, capsys):
    code, text = run(clone, tmp_path, "conflict")
    assert code == 1
    assert "**Red: 1 patch(es) do not apply exactly**" in text
    assert (
        f"- `{PATCH}` conflicts: {SCHEDULER} hunk #1 (at line 17) does not match"
    ) in text
    assert "Last good commit (every patch applies exactly): none seen yet" in text
    assert not (tmp_path / "state" / "good.json").exists()


def test_an_offset_is_red_every_night_it_lasts(project, clone, tmp_path, capsys):
    """The build refuses an offset, so a commit that needs one is not good,
    and a break that persists stays red, not only the night it appears."""
    assert run(clone, tmp_path, "release")[0] == 0
    good = commit_of(clone, "release")
    code, text = run(clone, tmp_path, "moved")
    assert code == 1
    assert f"- {PATCH}: applies exactly -> applies only with offset" in text
    assert (
        f"- `{PATCH}` applies only with offset: {SCHEDULER} hunk #1 at line 20 (offset)"
    ) in text
    code, text = run(clone, tmp_path, "moved")
    assert code == 1
    assert "No verdict changed since the last run" in text
    assert kept(tmp_path, "good.json")["commit"] == good
    assert f"Last good commit (every patch applies exactly): `{good}`" in text


def test_the_artifact_and_summary_name_the_failing_hunk(
    project, clone, tmp_path, capsys
):
    assert run(clone, tmp_path, "release")[0] == 0
    good, bad = commit_of(clone, "release"), commit_of(clone, "conflict")
    code, text = run(clone, tmp_path, "conflict")
    assert code == 1
    assert kept(tmp_path, "last.json")["failing"] == {
        PATCH: {
            "verdict": "conflicts",
            "detail": f"{SCHEDULER} hunk #1 (at line 17) does not match",
            "hunks": [{"file": SCHEDULER, "hunk": "1", "line": 17, "kind": "mismatch"}],
        }
    }
    assert (
        f"| `{PATCH}` | conflicts | {SCHEDULER} hunk #1 (at line 17) does not "
        "match | applies exactly |"
    ) in text
    assert kept(tmp_path, "good.json")["commit"] == good
    assert (f"`git log --oneline {good[:12]}..{bad[:12]} -- {SCHEDULER}`") in text


def test_a_patch_that_only_merges_3_way_is_red(project, clone, tmp_path, capsys):
    """Upstream changed a line of the patch's context, not the line it
    changes: `rebase` merges the patch, but the build and the harness apply
    the committed one exactly, which fails, so the night is red and names the
    hunk until a rebase refreshes the patch."""
    assert run(clone, tmp_path, "release")[0] == 0
    good = commit_of(clone, "release")
    (clone / SCHEDULER).write_text(scheduler_edit(18, "rewritten"))
    run_git(clone, "commit", "-qam", "the patch's context changed")
    run_git(clone, "tag", "merges")
    code, text = run(clone, tmp_path, "merges")
    assert code == 1
    assert "**Red: 1 patch(es) do not apply exactly**" in text
    assert f"- {PATCH}: applies exactly -> merges (3-way)" in text
    failing = kept(tmp_path, "last.json")["failing"][PATCH]
    assert failing["verdict"] == "merges (3-way)"
    assert failing["hunks"] == [
        {"file": SCHEDULER, "hunk": "1", "line": 17, "kind": "mismatch"}
    ]
    assert kept(tmp_path, "good.json")["commit"] == good
    bad = commit_of(clone, "merges")
    assert f"`git log --oneline {good[:12]}..{bad[:12]} -- {SCHEDULER}`" in text


def test_a_good_commit_kept_with_an_offset_is_not_shown_as_good(
    project, clone, tmp_path, capsys
):
    """A `good.json` written when an offset still counted as good."""
    state = tmp_path / "state"
    state.mkdir()
    old = {"commit": "0" * 40, "date": "2026-11-01", "label": "main@000000000000"}
    old |= {"series": "9.9.0", "verdicts": {PATCH: "applies only with offset"}}
    (state / "good.json").write_text(json.dumps(old))
    code, text = run(clone, tmp_path, "conflict")
    assert code == 1
    assert "Last good commit (every patch applies exactly): none seen yet" in text
    assert "0" * 40 not in text


def test_a_patch_upstream_has_is_green(project, clone, tmp_path, capsys):
    """The next rebase drops it unasked: nothing for a maintainer to fix."""
    code, text = run(clone, tmp_path, "absorbed")
    assert code == 0
    assert f"| `{PATCH}` | already present | - | - |" in text


def test_the_commit_is_named_as_status_names_it(project, clone, tmp_path, capsys):
    state = str(tmp_path / "state")
    code = track_main.main([str(clone), "--ref", "moved", "--state", state])
    assert code == 1
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "python -m ci.track_main takes no --ref: name the commit with the "
            "clone, CLONE@REF, as `vllm-overlay status --source PATH@REF` does"
        )
    )
    assert not (tmp_path / "state").exists()
    assert track_main.main([str(clone), "--state", state]) == 0
    assert kept(tmp_path, "last.json")["commit"] == commit_of(clone, "HEAD")


def test_an_unreadable_state_is_an_error(project, clone, tmp_path, capsys):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "last.json").write_text("{not json")
    code = track_main.main([str(clone), "--state", str(tmp_path / "state")])
    assert code == 1
    assert "last.json: not the JSON this script writes" in capsys.readouterr().err


def test_a_series_without_patches_is_refused_in_one_line(
    project, clone, tmp_path, capsys
):
    """Every patch of the series merged upstream leaves it empty: there is no
    verdict to keep, and the run says so instead of failing on an index."""
    for patch in project.series_dir.glob("*.patch"):
        patch.unlink()
    (project.series_dir / "series").write_text("# every patch merged upstream\n")
    code = track_main.main([f"{clone}@release", "--state", str(tmp_path / "state")])
    assert code == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"vllm-overlay: error: the series checked against {clone}@release has "
        "no patches: nothing to track against vLLM main"
    )
    assert not (tmp_path / "state").exists()
