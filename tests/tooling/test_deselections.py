"""The deselection files (`ci/suites/deselected.toml`, `tests/deselected.toml`):
entries name release ranges, and the files deselect exactly what they did
when they listed releases one by one."""

import pytest

from ci.suites.pytest_runs import our_deselection_args
from ci.suites.upstream_tests import collected_paths, deselection_args
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import REPO_ROOT
from vllm_overlay.series.deselections import (
    OUR_DESELECTIONS_FILE,
    UPSTREAM_DESELECTIONS_FILE,
    deselected_on,
    load_deselections,
    within,
)

REASON = 'reason = "why"\n'
RELEASES = ["0.9.0", "0.22.1", "0.23.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "1.0"]


def entry(tmp_path, bounds: str):
    path = tmp_path / "deselected.toml"
    path.write_text(f'[[deselect]]\ntest = "tests/a.py"\n{bounds}{REASON}')
    return path


@pytest.mark.parametrize(
    ("bounds", "applies", "span"),
    [
        ("", RELEASES, "every release"),
        ('since = "0.31.0"\n', RELEASES[4:], "0.31.0 and later"),
        ('until = "0.22.1"\n', ["0.9.0", "0.22.1"], "up to 0.22.1"),
        (
            'since = "0.23"\nuntil = "0.32.0"\n',
            ["0.23.0", "0.30.0", "0.31.0", "0.32.0"],
            "0.23 to 0.32.0",
        ),
        ('since = "0.33.0"\nuntil = "0.33.0"\n', ["0.33.0"], "0.33.0"),
    ],
)
def test_an_entry_applies_to_the_releases_of_its_inclusive_range(
    tmp_path, bounds, applies, span
):
    (deselection,) = load_deselections(entry(tmp_path, bounds))
    assert [r for r in RELEASES if deselection.applies_to(r)] == applies
    assert deselection.span == span


@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        (
            'releases = ["0.22.1", "0.31.0"]\n',
            "entry 1: `releases` lists releases one by one; name the range "
            "instead, with `since` and/or `until` (inclusive)",
        ),
        ('since = "soon"\n', "entry 1: `since` must be a release version"),
        ("until = 33\n", "entry 1: `until` must be a release version"),
        (
            'since = "0.33.0"\nuntil = "0.31.0"\n',
            "entry 1: `since` 0.33.0 is after `until` 0.31.0",
        ),
        ('after = "0.31.0"\n', "entry 1 needs `test` and `reason`, and only"),
    ],
)
def test_a_bad_range_is_one_line_naming_the_entry(tmp_path, bounds, message):
    path = entry(tmp_path, bounds)
    with pytest.raises(OverlayError) as caught:
        load_deselections(path)
    assert str(caught.value).startswith(f"{path}: deselect {message}")


# What each release pinned when the files listed releases one by one (commit
# 73d982b) ran, read once with that commit's code: upstream's tests
# deselected (node ids) or ignored (files) within the paths pytest was given
# (LISTED_RUNS), and our tests deselected.
LISTED_UPSTREAM = {
    "0.22.1": [
        "tests/v1/kv_connector/unit/test_multi_connector.py::test_multi_example_connector_consistency",
        "tests/v1/kv_connector/unit/test_nixl_connector_hma.py::test_fewer_blocks_with_hma[google/gemma-3-1b-it-512]",
        "tests/v1/metrics/test_engine_logger_apis.py::test_async_llm_replace_default_loggers",
        "tests/v1/metrics/test_ray_metrics.py",
    ],
    "0.31.0": [
        "tests/v1/core/prefix_cache/test_hybrid_prefix_cache_hit_rate.py",
        "tests/v1/kv_connector/unit/test_multi_connector.py::test_multi_example_connector_consistency",
        "tests/v1/kv_connector/unit/test_nixl_connector_hma.py::test_fewer_blocks_with_hma[google/gemma-3-1b-it-512]",
        "tests/v1/metrics/test_engine_logger_apis.py::test_async_llm_replace_default_loggers",
        "tests/v1/metrics/test_ray_metrics.py",
    ],
    "0.33.0": [
        "tests/v1/core/prefix_cache/test_hybrid_prefix_cache_hit_rate.py",
        "tests/v1/core/test_scheduler.py::test_async_scheduling_pp_allows_rescheduling_with_output_placeholders",
        "tests/v1/kv_connector/unit/test_multi_connector.py::test_multi_example_connector_consistency",
        "tests/v1/kv_connector/unit/test_nixl_connector_hma.py::test_fewer_blocks_with_hma[google/gemma-3-1b-it-512]",
        "tests/v1/metrics/test_engine_logger_apis.py::test_async_llm_add_to_default_loggers",
        "tests/v1/metrics/test_engine_logger_apis.py::test_async_llm_replace_default_loggers",
        "tests/v1/metrics/test_ray_metrics.py",
    ],
}
LISTED_UPSTREAM["0.32.0"] = LISTED_UPSTREAM["0.31.0"]
_CORE = "tests/v1/core/"
_UNIT = "tests/v1/kv_connector/unit/"
LISTED_RUNS = {
    "0.22.1": [
        *(f"{_CORE}test_{name}.py" for name in ("scheduler", "prefix_caching")),
        f"{_CORE}test_kv_cache_utils.py",
        *(
            f"{_UNIT}test_{name}.py"
            for name in (
                "multi_connector",
                "lmcache_connector",
                "nixl_connector_hma",
                "kv_load_failure_recovery",
                "error_propagation",
                "invalid_blocks_correctness",
            )
        ),
        "tests/v1/metrics/",
    ],
}
LISTED_RUNS["0.31.0"] = [
    *LISTED_RUNS["0.22.1"][:2],
    f"{_CORE}test_mamba_align_chunk_split.py",
    f"{_CORE}test_kv_cache_utils.py",
    f"{_CORE}prefix_cache/",
    *LISTED_RUNS["0.22.1"][3:6],
    f"{_UNIT}test_nixl_heartbeat.py",
    f"{_UNIT}test_hma_auto_config.py",
    *LISTED_RUNS["0.22.1"][6:],
]
LISTED_RUNS["0.32.0"] = LISTED_RUNS["0.31.0"]
LISTED_RUNS["0.33.0"] = [
    *LISTED_RUNS["0.31.0"][:4],
    f"{_CORE}test_kv_cache_planning.py",
    f"{_CORE}test_kv_cache_config_builder.py",
    *LISTED_RUNS["0.31.0"][4:],
]
LISTED_OURS = {
    "0.22.1": [
        "tests/probes/test_lmcache_real_adapter.py::test_lmcache_0_5_6_cannot_take_a_subset_of_layers",
        "tests/probes/test_lmcache_real_adapter.py::test_sliding_window_model_hands_lmcache_every_layer",
        "tests/probes/test_multi_connector_pd_speculative_hybrid_hit.py",
        "tests/runtime/test_doctor_real.py::test_hybrid_model_with_nixl_keeps_hma_but_needs_nixl",
        "tests/runtime/test_doctor_real.py::test_hybrid_prefix_caching_needs_chunked_prefill",
        "tests/runtime/test_doctor_real.py::test_lmcache_mp_connector_settings_are_checked",
    ],
}
LISTED_OURS["0.31.0"] = LISTED_OURS["0.32.0"] = LISTED_OURS["0.33.0"] = [
    "tests/probes/test_nixl_pd_decode_hybrid_hit.py",
    "tests/probes/test_nixl_worker_hybrid_blocks.py",
]


def upstream_selection(release: str) -> tuple[list[str], list[str]]:
    """What runs of upstream's tests on `release`: the paths given to pytest,
    and the deselections inside them."""
    runs = collected_paths(release)
    entries = deselected_on(REPO_ROOT / UPSTREAM_DESELECTIONS_FILE, release)
    left_out = [
        d.target
        for d in entries
        if any(within(d.target.split("::")[0], path) for path in runs)
    ]
    return runs, sorted(left_out)


@pytest.mark.parametrize("release", sorted(LISTED_UPSTREAM))
def test_the_ranges_deselect_what_the_lists_did(release):
    assert upstream_selection(release)[1] == LISTED_UPSTREAM[release]
    ours = deselected_on(REPO_ROOT / OUR_DESELECTIONS_FILE, release)
    assert sorted(d.target for d in ours) == LISTED_OURS[release]
    assert sorted(our_deselection_args(release)) == sorted(
        arg for d in ours for arg in d.pytest_args
    )
    assert upstream_selection(release)[0] == LISTED_RUNS[release]
    assert sorted(deselection_args(release)) == sorted(
        arg
        for d in deselected_on(REPO_ROOT / UPSTREAM_DESELECTIONS_FILE, release)
        for arg in d.pytest_args
    )
