"""The benchmarks are not run by the suite (their numbers need a quiet
machine), but they must keep importing what the package provides."""

import importlib

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "benchmarks.wheel_build",
        "benchmarks.schedule_overhead",
        "benchmarks.pd_decode_reuse",
        "benchmarks.pd_lease",
        "benchmarks.pd_confine",
        "benchmarks.pd_read_confirmation",
        "benchmarks.pd_progress_pause",
        "benchmarks.pd_question_timing",
    ],
)
def test_benchmark_imports(module):
    assert callable(importlib.import_module(module).main)
