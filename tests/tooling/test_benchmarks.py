"""The benchmarks are not run by the suite (their numbers need a quiet
machine), but they must keep importing what the package provides."""

import importlib

import pytest

from benchmarks.pd_decode_reuse import cell_workloads, rounds_parser


@pytest.mark.parametrize(
    "module",
    [
        "benchmarks.wheel_build",
        "benchmarks.schedule_overhead",
        "benchmarks.pd_decode_reuse",
        "benchmarks.investigations.pd_confine",
        "benchmarks.pd_read_confirmation",
        "benchmarks.investigations.pd_progress_pause",
        "benchmarks.investigations.pd_question_timing",
    ],
)
def test_benchmark_imports(module):
    assert callable(importlib.import_module(module).main)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompts", "0"], "argument --prompts: must be at least 1, not 0"),
        (
            ["--concurrency", "4", "-2"],
            "argument --concurrency: must be at least 1, not -2",
        ),
        (["--rounds", "three"], "argument --rounds: not a whole number: 'three'"),
    ],
)
def test_a_count_below_one_is_refused_in_one_line(args, message, capsys):
    """A benchmark runs for many minutes before it reports: a count it cannot
    use must stop it before it starts a server."""
    parser = rounds_parser(__doc__, concurrency=(4, 12))
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["0.32.0", *args])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(message)


def test_prompts_sets_the_requests_of_every_cell():
    args = rounds_parser(__doc__, concurrency=(4, 12)).parse_args(["--prompts", "96"])
    cells = cell_workloads("cpu", args.concurrency, args.prompts)
    assert [(c.concurrency, c.prompts) for c in cells] == [(4, 96), (12, 96)]
    defaults = rounds_parser(__doc__, concurrency=(4, 12)).parse_args([])
    cells = cell_workloads("cpu", defaults.concurrency, defaults.prompts)
    assert [(c.concurrency, c.prompts) for c in cells] == [(4, 16), (12, 48)]
