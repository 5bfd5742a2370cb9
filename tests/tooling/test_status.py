"""`vllm-overlay status`: each patch's verdict against pinned and unpinned
releases, from synthetic wheels; the download of an unpinned release is faked.
`--probe` runs in a fake release environment: a `python` script that puts a
synthetic installed `vllm` on the path of this interpreter."""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import (
    PATCHED,
    RELEASE,
    SCHEDULER,
    SCHEDULER_SOURCE,
    fake_release_env,
    format_patch,
    make_vllm_clone,
    make_wheel,
    run_cli,
    run_git,
    scheduler_edit,
)

from vllm_overlay.cli import main
from vllm_overlay.series.loader import nearest_release as nearest
from vllm_overlay.series.pins import Artifact, ReleasePin
from vllm_overlay.track.checks.lint import lint
from vllm_overlay.track.records.table import render_table
from vllm_overlay.track.records.verdicts import VERDICTS_FILE, read_verdicts
from vllm_overlay.track.status import status as status_module
from vllm_overlay.track.status.probing import probe_outcomes, probe_verdict

# A release pinned after 9.9.0 that has no series yet.
NEXT = "9.10.0"


@dataclass
class FakeIndex:
    """Unpinned releases a faked download serves: version -> scheduler text."""

    releases: dict[str, str] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def download(self, version: str, directory: Path) -> Path:
        self.calls.append(version)
        name = f"vllm-{version}-cp38-abi3-linux_x86_64.whl"
        scheduler = self.releases[version].encode()
        return make_wheel(directory / name, members={SCHEDULER: scheduler})


@pytest.fixture
def upstream(monkeypatch, project) -> FakeIndex:
    index = FakeIndex()
    monkeypatch.setattr(status_module, "_pip_download_wheel", index.download)
    return index


def exit_code(rows: list[dict]) -> int:
    """What `status` exits with for `rows`: 1 when any patch conflicts."""
    return int(any(row["verdict"].startswith("conflicts") for row in rows))


def verdicts(capsys, *releases: str) -> list[dict]:
    code, out, err = run_cli(capsys, "status", "--json", *releases)
    rows = json.loads(out)
    assert code == exit_code(rows), err
    return rows


def test_a_conflict_fails_the_command_and_says_so(project, upstream, capsys):
    """Conflicts exit 1 (with the table printed all the same); an offset or
    a 3-way merge, which a rebase settles without a hand merge, exits 0."""
    upstream.releases["9.9.1"] = "new first line\n" + SCHEDULER_SOURCE
    upstream.releases["9.9.2"] = scheduler_edit(20, "line twenty, rewritten")
    upstream.releases["9.9.3"] = scheduler_edit(18, "line eighteen, rewritten")
    code, out, err = run_cli(capsys, "status", "9.9.1", "9.9.3")
    assert code == 0, err
    assert "scheduler-demo.patch  merges (3-way)" in out
    code, out, err = run_cli(capsys, "status", "9.9.1", "9.9.2")
    assert code == 1
    assert "scheduler-demo.patch  conflicts" in out
    assert err.splitlines()[-1] == (
        "vllm-overlay status: 1 conflict(s): scheduler-demo.patch on 9.9.2"
    )


def test_the_exit_status_is_in_the_help(project, capsys):
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 when no patch conflicts" in help_text
    assert "1 when any patch conflicts" in help_text


def test_pinned_release_applies_exactly(project, capsys):
    code, out, err = run_cli(capsys, "status")
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["release", "series", "patch", "verdict", "detail"]
    assert row.startswith("9.9.0    9.9.0   scheduler-demo.patch  applies exactly")
    assert "checking vLLM 9.9.0 against the 9.9.0 series" in err


def test_json_shape(project, capsys):
    assert verdicts(capsys, "v9.9") == [
        {
            "release": "9.9.0",
            "pinned": True,
            "series": "9.9.0",
            "patch": "scheduler-demo.patch",
            "verdict": "applies exactly",
            "detail": "",
        }
    ]


def test_drift_by_one_line_is_not_exact(project, upstream, capsys):
    upstream.releases["9.9.1"] = "new first line\n" + SCHEDULER_SOURCE
    (row,) = verdicts(capsys, "9.9.1")
    assert row["pinned"] is False
    assert row["series"] == "9.9.0"
    assert row["verdict"] == "applies only with offset"
    assert row["detail"] == f"{SCHEDULER} hunk #1 at line 18 (offset)"


def test_a_changed_line_of_the_patch_conflicts_naming_file_and_hunk(
    project, upstream, capsys
):
    upstream.releases["9.9.2"] = scheduler_edit(20, "line twenty, rewritten upstream")
    (row,) = verdicts(capsys, "9.9.2")
    assert row["verdict"] == "conflicts"
    assert row["detail"] == f"{SCHEDULER} hunk #1 (at line 17) does not match"


def test_a_patch_rebase_merges_is_not_a_conflict(project, upstream, capsys):
    """Upstream changed a context line two lines from the patch's change: the
    patch no longer applies as it stands, but `rebase`'s 3-way merge takes it
    (git keeps changes apart when an unchanged line separates them), so it is
    no conflict; the next patch is judged on the merged file, as the rebase
    replays it."""
    follow_up(project, {21: "line 21, follow-up"})
    upstream.releases["9.9.2"] = scheduler_edit(18, "line eighteen, rewritten")
    demo, second = verdicts(capsys, "9.9.2")
    assert (demo["verdict"], demo["detail"]) == (
        "merges (3-way)",
        f"{SCHEDULER}: merged with 9.9.0 as the base, as rebase merges it; "
        "rebase keeps it, refreshed",
    )
    assert second["verdict"] == "merges (3-way)"


def test_a_conflict_after_a_merged_patch_is_upstream_s_not_the_merged_one_s(
    project, upstream, capsys
):
    """The follow-up changes the line next to one upstream changed: a real
    conflict. The patch before it merged, so it is not to blame."""
    follow_up(project, {19: "line 19, follow-up"})
    upstream.releases["9.9.2"] = scheduler_edit(18, "line eighteen, rewritten")
    demo, second = verdicts(capsys, "9.9.2")
    assert demo["verdict"] == "merges (3-way)"
    assert second["verdict"] == "conflicts"


def test_a_patch_that_merges_to_no_change_is_already_present(project, upstream, capsys):
    """Upstream has the change and changed its context too: it no longer
    reverse-applies, but the 3-way merge changes nothing, so `rebase` drops
    it."""
    upstream.releases["9.9.2"] = edited(PATCHED, {18: "line eighteen, rewritten"})
    (row,) = verdicts(capsys, "9.9.2")
    assert (row["verdict"], row["detail"]) == (
        "already present",
        "merges to no change (3-way): rebase drops it",
    )


def edited(text: str, edits: dict[int, str]) -> str:
    """`text` with each line number of `edits` replaced by its text."""
    lines = text.splitlines(keepends=True)
    for line, new in edits.items():
        lines[line - 1] = new + "\n"
    return "".join(lines)


def follow_up(project, edits: dict[int, str]) -> None:
    """A second patch, written on top of the first: `edits` to the patched
    scheduler."""
    project.add_patch(
        "scheduler-follow-up.patch",
        format_patch(
            project.workdir,
            {SCHEDULER: PATCHED},
            {SCHEDULER: edited(PATCHED, edits)},
            subject="scheduler: follow-up",
        ),
    )


def test_every_failing_hunk_of_a_file_is_named(project, upstream, capsys):
    follow_up(project, {3: "line 3, follow-up", 36: "line 36, follow-up"})
    upstream.releases["9.9.2"] = edited(
        SCHEDULER_SOURCE, {4: "four", 35: "thirty-five"}
    )
    demo, second = verdicts(capsys, "9.9.2")
    assert demo["verdict"] == "applies exactly"
    assert (second["verdict"], second["detail"]) == (
        "conflicts",
        f"{SCHEDULER} hunk #1 (at line 1) does not match; "
        f"{SCHEDULER} hunk #2 (at line 33) does not match",
    )


@pytest.mark.parametrize(
    ("edits", "verdict"),
    [
        (
            {21: "line 21, follow-up"},
            "conflicts (depends on scheduler-demo.patch, which conflicts)",
        ),
        ({21: "line 21, follow-up", 36: "line 36, follow-up"}, "conflicts"),
    ],
)
def test_a_conflict_only_an_earlier_conflict_causes_is_marked(
    project, upstream, capsys, edits, verdict
):
    follow_up(project, edits)
    upstream.releases["9.9.2"] = edited(
        SCHEDULER_SOURCE, {20: "twenty", 35: "thirty-five"}
    )
    demo, second = verdicts(capsys, "9.9.2")
    assert demo["verdict"] == "conflicts"
    assert second["verdict"] == verdict


def test_a_file_an_earlier_conflict_would_create_is_a_dependency(
    project, upstream, capsys
):
    created = "vllm/v1/core/sched/helper.py"
    path = project.series_dir / "scheduler-demo.patch"
    path.write_text(
        format_patch(
            project.workdir,
            {SCHEDULER: SCHEDULER_SOURCE},
            {SCHEDULER: PATCHED, created: "helper\n"},
        )
    )
    project.add_patch(
        "helper-follow-up.patch",
        format_patch(project.workdir, {created: "helper\n"}, {created: "helper 2\n"}),
    )
    upstream.releases["9.9.2"] = edited(SCHEDULER_SOURCE, {20: "twenty"})
    demo, second = verdicts(capsys, "9.9.2")
    assert demo["verdict"] == "conflicts"
    assert (second["verdict"], second["detail"]) == (
        "conflicts (depends on scheduler-demo.patch, which conflicts)",
        f"{created}: No such file or directory",
    )


@pytest.mark.parametrize(
    ("trailer", "dropped"),
    [
        ("Backport 9.9.2", "9.9.2"),
        ("Backport v9.9.1", "9.9.1"),
        ("Backport 9.9.5", None),
    ],
)
def test_a_backport_rebase_would_drop_says_so(
    project, upstream, capsys, trailer, dropped
):
    path = project.series_dir / "scheduler-demo.patch"
    path.write_text(
        path.read_text().replace(
            "Upstream-Status: Pending", f"Upstream-Status: {trailer}"
        )
    )
    follow_up(project, {21: "line 21, follow-up"})
    upstream.releases["9.9.2"] = edited(SCHEDULER_SOURCE, {20: "twenty"})
    demo, second = verdicts(capsys, "9.9.2")
    if dropped is None:
        assert demo["verdict"] == "conflicts"
        return
    assert (demo["verdict"], demo["detail"]) == (
        "dropped by rebase",
        f"Upstream-Status: Backport {dropped}: vLLM 9.9.2 has the upstream change",
    )
    assert second["verdict"] == (
        "conflicts (depends on scheduler-demo.patch, which rebase drops)"
    )


def test_change_already_upstream(project, upstream, capsys):
    upstream.releases["9.9.3"] = PATCHED
    (row,) = verdicts(capsys, "9.9.3")
    assert row["verdict"] == "already present"


def test_later_patches_see_earlier_ones(project, upstream, capsys):
    follow_up(project, {21: "line 21, follow-up"})
    upstream.releases["9.9.1"] = "new first line\n" + SCHEDULER_SOURCE
    rows = verdicts(capsys, "9.9.1")
    assert [r["verdict"] for r in rows] == ["applies only with offset"] * 2


def test_unpinned_release_is_labelled_and_cached(project, upstream, capsys):
    upstream.releases["9.9.3"] = PATCHED
    code, out, err = run_cli(capsys, "status", "9.9.3")
    assert code == 0, err
    assert out.splitlines()[1].startswith("9.9.3 (unpinned)  9.9.0 ")
    assert "downloading vllm==9.9.3 (unpinned" in err
    run_cli(capsys, "status", "9.9.3")
    assert upstream.calls == ["9.9.3"]


def test_unknown_release_is_a_one_line_error(project, monkeypatch, capsys):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    code, out, err = run_cli(capsys, "status", "0.0.1")
    assert code == 1
    assert out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith("vllm-overlay: error: cannot download vllm==0.0.1")


def test_an_unpinned_release_downloads_through_pip(
    project, monkeypatch, capsys, tmp_path
):
    """Real pip, from a local index standing for PyPI's files of 9.9.3."""
    make_wheel(
        tmp_path / "index" / "vllm-9.9.3-cp38-abi3-linux_x86_64.whl", version="9.9.3"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    (row,) = verdicts(capsys, "9.9.3")
    assert (row["release"], row["pinned"], row["verdict"]) == (
        "9.9.3",
        False,
        "applies exactly",
    )
    cached = project.cache / "unpinned" / "vllm-9.9.3"
    assert [p.name for p in cached.iterdir()] == [
        "vllm-9.9.3-cp38-abi3-linux_x86_64.whl"
    ]


def test_not_a_version_is_refused_before_any_download(project, capsys):
    code, _, err = run_cli(capsys, "status", "latest")
    assert code == 1
    assert err == "vllm-overlay: error: 'latest' is not a version number\n"


def pins_of(*versions: str) -> dict[str, ReleasePin]:
    return {
        v: ReleasePin(v, 1, Artifact(f"vllm-{v}.tar.gz", "0" * 64), ())
        for v in versions
    }


def test_nearest_series_is_the_nearest_pinned_release_in_release_order():
    pins = pins_of("0.22.1", "0.31.0", "0.32.0", "0.33.0")
    assert nearest(pins, "0.32.0").version == "0.32.0"
    assert nearest(pins, "0.32.5").version == "0.32.0"
    assert nearest(pins, "0.40.0").version == "0.33.0"
    assert nearest(pins, "0.10.0").version == "0.22.1"
    # One minor release from 0.31.0, eight from 0.22.1.
    assert nearest(pins, "0.30.0").version == "0.31.0"
    assert nearest(pins, "0.23.0").version == "0.22.1"
    assert nearest(pins, "0.26.0").version == "0.22.1"
    # Of two equally near, the older.
    assert nearest(pins_of("0.24.0", "0.28.0"), "0.26.0").version == "0.24.0"
    # A release candidate is its release's.
    assert nearest(pins, "0.33.0rc1").version == "0.33.0"
    assert nearest(pins, "0.33").version == "0.33.0"


def test_probe_fails_on_the_unpatched_release(project, tmp_path, capsys):
    fake_release_env(project, tmp_path)
    code, out, err = run_cli(capsys, "status", "--probe")
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split()[3:] == ["verdict", "probe", "detail"]
    assert row.endswith("applies exactly  still needed")
    assert "running 1 probes for vLLM 9.9.0" in err


# A probe whose helper fails on the unpatched release before its assertion
# (as one choosing a signature by counting parameters did).
HELPER_FAILS_FIRST = """
import importlib.util
from pathlib import Path

def test_demo():
    spec = importlib.util.find_spec("vllm.v1.core.sched.scheduler")
    if "line twenty, patched" not in Path(spec.origin).read_text():
        raise TypeError("add() takes from 4 to 5 positional arguments but 6 were given")
    assert True
"""


def test_a_probe_failing_outside_its_assertion_proves_nothing(
    project, tmp_path, capsys
):
    """A probe that fails on the unpatched release with an error outside its
    assertion makes the verdict inconclusive, never "still needed", and
    `--record` keeps the verdict recorded before, saying why, and fails."""
    assert run_cli(capsys, "status", "--record")[0] == 0
    verdicts_file = project.patches / VERDICTS_FILE
    before = verdicts_file.read_text()
    fake_release_env(project, tmp_path)
    (project.root / "tests" / "probes" / "test_demo.py").write_text(HELPER_FAILS_FIRST)

    code, out, err = run_cli(capsys, "status", "--probe", "--record")

    assert code == 1
    inconclusive = (
        "inconclusive: test_demo.py::test_demo failed outside its assertion (TypeError)"
    )
    assert out.splitlines()[1].endswith(f"applies exactly  {inconclusive}")
    assert err.endswith(
        "vllm-overlay: error: kept the recorded verdicts of scheduler-demo.patch "
        f"on 9.9.0: {inconclusive}: their probes failed outside their assertions "
        "or did not run, which proves nothing about the patch\n"
    )
    assert verdicts_file.read_text() == before


def test_environment_of_another_release_is_no_environment(project, tmp_path, capsys):
    fake_release_env(project, tmp_path, release="9.8.0")
    (row,) = verdicts(capsys, "--probe")
    assert row["probe"] == "no environment (run tools/test.sh 9.9.0)"


def test_without_environment_the_probe_is_not_run(project, capsys):
    code, out, err = run_cli(capsys, "status", "--probe", "--json")
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["probe"] == "no environment (run tools/test.sh 9.9.0)"
    assert "running" not in err


def test_a_release_without_its_own_series_is_told_the_documented_flow(
    project, upstream, capsys
):
    """`tools/test.sh` builds a pinned release with a series only: an
    unpinned release is told to pin and rebase first, a pinned one without a
    series to rebase first, and how its patches were judged."""
    upstream.releases["9.9.3"] = SCHEDULER_SOURCE
    project.pin_release(NEXT, SCHEDULER_SOURCE)
    code, out, err = run_cli(capsys, "status", "--probe", "--json", "9.9.3", NEXT)
    assert code == 0, err
    unpinned, pending = json.loads(out)
    assert unpinned["probe"] == (
        "no environment (run vllm-overlay pin 9.9.3, vllm-overlay rebase 9.9.0 "
        "9.9.3, then tools/test.sh 9.9.3)"
    )
    assert pending["probe"] == (
        f"no environment (run vllm-overlay rebase 9.9.0 {NEXT}, then tools/test.sh "
        f"{NEXT})"
    )
    assert (
        "vllm-overlay: vLLM 9.9.3 is not pinned and has no series: checking it "
        "against the 9.9.0 series, each patch in series order on top of the "
        "earlier ones, as `vllm-overlay rebase 9.9.0 9.9.3` would replay them; to "
        "make its series, `vllm-overlay pin 9.9.3`, then that rebase "
        "(docs/maintainer/releases.md)\n"
    ) in err
    assert "tools/test.sh 9.9.3" not in err


PROBES = ("tests/probes/test_a.py::test_a", "tests/probes/test_b.py::test_b")


@pytest.mark.parametrize(
    ("outcomes", "verdict"),
    [
        (("failed", "failed"), "still needed"),
        (("passed", "passed"), "upstream-equivalent"),
        (("failed", "passed"), "mixed: passes: test_b.py::test_b"),
        (("failed", "error"), "inconclusive: test_b.py::test_b error"),
        (
            ("failed", "failed outside its assertion (TypeError)"),
            "inconclusive: test_b.py::test_b failed outside its assertion (TypeError)",
        ),
    ],
)
def test_probe_verdict(outcomes, verdict):
    assert probe_verdict(PROBES, dict(zip(PROBES, outcomes, strict=True))) == verdict


def test_probe_outcomes_from_junit(tmp_path):
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.probes.test_a.TestA" name="test_a[x]"/>'
        '<testcase classname="tests.probes.test_a.TestA" name="test_a[y]">'
        "<failure/></testcase>"
        '<testcase classname="tests.probes.test_b" name="test_b"><failure/></testcase>'
        '<testcase classname="tests.probes.test_b" name="test_c"><error/></testcase>'
        "</testsuite></testsuites>"
    )
    probes = [
        "tests/probes/test_a.py::TestA::test_a",
        "tests/probes/test_b.py::test_b",
        "tests/probes/test_b.py::test_c",
        "tests/probes/test_b.py::test_d",
    ]
    assert probe_outcomes(probes, report) == {
        probes[0]: "mixed cases",
        probes[1]: "failed",
        probes[2]: "error",
        probes[3]: "not run",
    }


def test_record_keeps_the_verdict_for_patches_md(project, upstream, capsys):
    table = project.root / "PATCHES.md"
    code, _, err = run_cli(capsys, "status", "--record")
    assert code == 0, err
    assert "recorded the verdicts for 9.9.0 in verdicts.toml and PATCHES.md" in err
    recorded = read_verdicts(project.patches)
    entry = recorded["9.9.0", "scheduler-demo.patch"]
    assert (entry.verdict, entry.probe) == ("applies exactly", None)
    assert f"| applies exactly ({entry.checked}) |" in table.read_text()
    assert lint(project.patches) == []
    assert main(["table", "--check"]) == 0


@pytest.mark.parametrize("release", ["9.9.3", NEXT])
def test_record_refuses_a_release_without_its_own_series_first(
    project, upstream, capsys, release
):
    project.pin_release(NEXT, SCHEDULER_SOURCE)
    upstream.releases["9.9.3"] = PATCHED
    code, out, err = run_cli(capsys, "status", "--record", release)
    assert (code, out) == (1, "")
    assert err == (
        f"vllm-overlay: error: vLLM {release} has no series of its own; --record "
        "keeps the verdicts of a pinned release's own series only\n"
    )
    assert upstream.calls == []
    assert not (project.patches / VERDICTS_FILE).exists()
    assert not (project.root / "PATCHES.md").exists()


def test_pinned_release_without_series_is_checked_against_the_nearest(project, capsys):
    project.pin_release(NEXT, "new first line\n" + SCHEDULER_SOURCE)
    code, out, err = run_cli(capsys, "status")
    assert code == 0, err
    _, own, pending = out.splitlines()
    assert own.split()[:4] == ["9.9.0", "9.9.0", "scheduler-demo.patch", "applies"]
    assert pending.startswith(f"{NEXT} (no series yet)  9.9.0   scheduler-demo.patch")
    assert "applies only with offset" in pending
    assert (
        f"vllm-overlay: vLLM {NEXT} is pinned but has no series yet (run "
        f"`vllm-overlay rebase 9.9.0 {NEXT}`); checking it against the 9.9.0 series"
    ) in err


def test_unpinned_release_after_one_without_series_takes_the_nearest_series(
    project, upstream, capsys
):
    project.pin_release(NEXT, SCHEDULER_SOURCE)
    upstream.releases["9.11.0"] = PATCHED
    (row,) = verdicts(capsys, "9.11.0")
    assert (row["series"], row["verdict"]) == ("9.9.0", "already present")


def test_record_skips_a_pinned_release_without_series(project, capsys):
    project.pin_release(NEXT, SCHEDULER_SOURCE)
    code, _, err = run_cli(capsys, "status", "--record")
    assert code == 0, err
    assert "recorded the verdicts for 9.9.0 in verdicts.toml and PATCHES.md" in err
    assert {release for release, _ in read_verdicts(project.patches)} == {"9.9.0"}
    assert (project.root / "PATCHES.md").read_text() == render_table(project.patches)


def test_record_keeps_verdicts_its_probes_could_not_check(project, upstream, capsys):
    """Probes that could not run (no test environment on this machine) know
    less than the verdicts recorded before: `--probe --record` keeps those,
    says why and how to check them, and fails."""
    assert run_cli(capsys, "status", "--record")[0] == 0
    verdicts_file = project.patches / VERDICTS_FILE
    before = verdicts_file.read_text()

    code, _, err = run_cli(capsys, "status", "--probe", "--record")

    assert code == 1
    assert err.endswith(
        "vllm-overlay: error: kept the recorded verdicts of vLLM 9.9.0: its probes "
        "could not run here (no test environment; run tools/test.sh 9.9.0 first)\n"
    )
    assert verdicts_file.read_text() == before


def test_an_edited_patch_shows_a_stale_verdict(project, capsys):
    assert run_cli(capsys, "status", "--record")[0] == 0
    path = project.series_dir / "scheduler-demo.patch"
    path.write_text(path.read_text().replace("Why.", "Why, really."))
    assert "| stale: the patch changed after the check of " in render_table(
        project.patches
    )


def test_recorded_verdicts_with_a_wrong_shape_fail_lint(project):
    (project.patches / VERDICTS_FILE).write_text(
        '[verdicts."9.9.0"."scheduler-demo.patch"]\nverdict = 1\n'
    )
    (problem,) = lint(project.patches)
    assert "needs the strings verdict, patch_sha256 and checked" in problem


@pytest.fixture
def vllm_clone(tmp_path: Path) -> Path:
    return make_vllm_clone(tmp_path / "vllm")


def tagged_clone(clone: Path, files: dict[str, str]) -> Path:
    """A git clone holding `files` in one commit tagged as the release."""
    for name, text in files.items():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        (clone / name).write_text(text)
    run_git(clone, "init", "-q")
    run_git(clone, "add", "-A")
    run_git(clone, "commit", "-qm", "release")
    run_git(clone, "tag", f"v{RELEASE}")
    return clone


def at(capsys, source: str) -> tuple[list[dict], str]:
    code, out, err = run_cli(capsys, "status", "--json", "--source", source)
    rows = json.loads(out)
    assert code == exit_code(rows), err
    return rows, err


@pytest.mark.parametrize(
    ("ref", "verdict", "detail"),
    [
        ("release", "applies exactly", ""),
        (
            "moved",
            "applies only with offset",
            f"{SCHEDULER} hunk #1 at line 20 (offset)",
        ),
        ("conflict", "conflicts", f"{SCHEDULER} hunk #1 (at line 17) does not match"),
        ("absorbed", "already present", "reverse-applies"),
    ],
)
def test_a_git_commit_gets_the_verdicts_a_release_would(
    project, vllm_clone, capsys, ref, verdict, detail
):
    (row,), err = at(capsys, f"{vllm_clone}@{ref}")
    commit = run_git(vllm_clone, "rev-parse", ref).strip()
    assert row == {
        "release": f"{ref}@{commit[:12]}",
        "pinned": False,
        "series": RELEASE,
        "patch": "scheduler-demo.patch",
        "verdict": verdict,
        "detail": detail,
        "commit": commit,
        "commit_date": run_git(vllm_clone, "log", "-1", "--format=%cs", ref).strip(),
    }
    assert (
        f"checking {vllm_clone} at {ref}@{commit[:12]} "
        f"({row['commit_date']}), which contains v{RELEASE}, against the "
        f"{RELEASE} series"
    ) in err


def test_a_git_clone_without_a_ref_is_read_at_its_head(project, vllm_clone, capsys):
    (row,), _ = at(capsys, str(vllm_clone))
    assert row["release"].startswith("HEAD@")
    assert row["verdict"] == "already present"


def test_a_commit_without_a_release_tag_takes_the_newest_series(
    project, vllm_clone, capsys
):
    """A full clone without tags is not called shallow: only a clone that
    is gets the hint."""
    run_git(vllm_clone, "tag", "-d", f"v{RELEASE}")
    (row,), err = at(capsys, f"{vllm_clone}@release")
    assert row["series"] == RELEASE
    assert "which contains no release tag, against the 9.9.0 series" in err
    assert "shallow" not in err


def test_a_shallow_clone_is_named_as_the_reason_for_no_tag(
    project, vllm_clone, tmp_path, capsys
):
    shallow = tmp_path / "shallow"
    run_git(tmp_path, "clone", "-q", "--depth", "1", f"file://{vllm_clone}", "shallow")
    (row,), err = at(capsys, f"{shallow}@HEAD")
    assert row["series"] == RELEASE
    assert (
        "which contains no release tag (a shallow clone: `git fetch "
        "--unshallow` brings its tags)"
    ) in err


UPSTREAM_TEST = "tests/v1/core/test_scheduler.py"
TEST_SOURCE = "".join(f"check {n}\n" for n in range(1, 21))


def cache_own_sdist(project) -> None:
    """Upstream's tests of the series' own release where the pinned sdist
    leaves them in the cache: the 3-way merge and the dependency check of a
    test hunk read them."""
    sdist = project.cache / "sources" / f"vllm-{RELEASE}"
    (sdist / UPSTREAM_TEST).parent.mkdir(parents=True)
    (sdist / UPSTREAM_TEST).write_text(TEST_SOURCE)
    (sdist / ".vllm-overlay-sdist-sha256").write_text("0" * 64)


def test_a_release_merges_the_package_hunks_only(project, upstream, capsys):
    """A release is read from its wheel, without upstream's tests: the 3-way
    merge of a patch that also updates them takes its `vllm/` files alone,
    and needs no sdist."""
    (project.series_dir / "scheduler-demo.patch").write_text(
        format_patch(
            project.workdir,
            {SCHEDULER: SCHEDULER_SOURCE, UPSTREAM_TEST: TEST_SOURCE},
            {SCHEDULER: PATCHED, UPSTREAM_TEST: edited(TEST_SOURCE, {10: "patched"})},
        )
    )
    upstream.releases["9.9.2"] = scheduler_edit(18, "line eighteen, rewritten")
    (row,) = verdicts(capsys, "9.9.2")
    assert (row["verdict"], row["detail"]) == (
        "merges (3-way)",
        f"{SCHEDULER}: merged with {RELEASE} as the base, as rebase merges it; "
        "rebase keeps it, refreshed",
    )
    assert not (project.cache / "sources").exists()


@pytest.mark.parametrize(
    ("tests", "verdict", "detail"),
    [
        (TEST_SOURCE, "applies exactly", ""),
        (
            "new first check\n" + TEST_SOURCE,
            "applies only with offset",
            f"{UPSTREAM_TEST} hunk #1 at line 8 (offset)",
        ),
        (
            edited(TEST_SOURCE, {8: "check 8, rewritten upstream"}),
            "merges (3-way)",
            f"{UPSTREAM_TEST}, {SCHEDULER}: merged with {RELEASE} as the base, "
            "as rebase merges it; rebase keeps it, refreshed",
        ),
        (
            edited(TEST_SOURCE, {10: "check 10, rewritten upstream"}),
            "conflicts",
            f"{UPSTREAM_TEST} hunk #1 (at line 7) does not match",
        ),
    ],
)
def test_a_git_commit_judges_the_hunks_of_upstreams_tests(
    project, tmp_path, capsys, tests, verdict, detail
):
    """A commit holds upstream's tests, which the harness patches exactly:
    a test hunk that moved, merges (3-way, on the tests of the series' own
    release as the base) or conflicts is judged as a package hunk is."""
    cache_own_sdist(project)
    (project.series_dir / "scheduler-demo.patch").write_text(
        format_patch(
            project.workdir,
            {SCHEDULER: SCHEDULER_SOURCE, UPSTREAM_TEST: TEST_SOURCE},
            {SCHEDULER: PATCHED, UPSTREAM_TEST: edited(TEST_SOURCE, {10: "patched"})},
        )
    )
    clone = tagged_clone(
        tmp_path / "vllm", {SCHEDULER: SCHEDULER_SOURCE, UPSTREAM_TEST: tests}
    )
    (row,), _ = at(capsys, str(clone))
    assert (row["verdict"], row["detail"]) == (verdict, detail)


def test_a_test_hunk_only_an_earlier_conflict_breaks_is_a_dependency(
    project, tmp_path, capsys
):
    """The dependency check reads upstream's tests of the series' own
    release from its pinned sdist, as it reads the package from the wheel."""
    patched_tests = edited(TEST_SOURCE, {10: "patched"})
    (project.series_dir / "scheduler-demo.patch").write_text(
        format_patch(
            project.workdir,
            {SCHEDULER: SCHEDULER_SOURCE, UPSTREAM_TEST: TEST_SOURCE},
            {SCHEDULER: PATCHED, UPSTREAM_TEST: patched_tests},
        )
    )
    project.add_patch(
        "tests-follow-up.patch",
        format_patch(
            project.workdir,
            {UPSTREAM_TEST: patched_tests},
            {UPSTREAM_TEST: edited(patched_tests, {11: "follow-up"})},
            subject="tests: follow-up",
        ),
    )
    cache_own_sdist(project)
    clone = tagged_clone(
        tmp_path / "vllm",
        {
            SCHEDULER: edited(SCHEDULER_SOURCE, {20: "twenty"}),
            UPSTREAM_TEST: TEST_SOURCE,
        },
    )
    demo, second = at(capsys, str(clone))[0]
    assert demo["verdict"] == "conflicts"
    assert second["verdict"] == (
        "conflicts (depends on scheduler-demo.patch, which conflicts)"
    )
    assert second["detail"] == f"{UPSTREAM_TEST} hunk #1 (at line 8) does not match"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--source", "{clone}", "--ref", "main"],
            "unrecognized arguments: --ref (name the commit with the clone: "
            "`--source PATH@REF`)",
        ),
        (["--source", "{clone}@nothing"], "'nothing' names no commit in {clone}"),
        (["--source", "{outside}"], "{outside} is not a git clone"),
        (["--source", "{clone}/missing@main"], "{clone}/missing is not a directory"),
        (["--source", "{clone}", "9.9.0"], "--source takes no RELEASE"),
        (["--source", "{clone}", "--record"], "--source takes no --record"),
        (["--source", "{clone}", "--probe"], "--source takes no --probe"),
    ],
)
def test_bad_sources_are_refused(project, vllm_clone, tmp_path, capsys, argv, message):
    names = {"clone": str(vllm_clone), "outside": str(tmp_path / "outside")}
    (tmp_path / "outside").mkdir()
    code, out, err = run_cli(capsys, "status", *(a.format(**names) for a in argv))
    assert (code, out) == (1, "")
    assert message.format(**names) in err
