from pathlib import Path

from vllm_overlay.cli import main
from vllm_overlay.table import TABLE_FILE, render_table

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
        "| `tests/probes/test_demo.py::test_demo` |"
    ) in table


def test_write_then_check(project, capsys):
    target = project.root / TABLE_FILE
    assert main(["table", "--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["table", "--write"]) == 0
    assert target.read_text() == render_table(project.patches)
    assert main(["table", "--check"]) == 0
