"""`ci/suites/upstream_tests.py` against the release facts: the entries are checked
against the release's sdist before anything is copied, and a test file the
series changes that the harness does not run gets the fix that adds no
duplicate entry."""

from types import SimpleNamespace

import pytest
from conftest import RELEASE

from ci.suites import pytest_runs
from ci.suites.upstream_tests import (
    deselection_args,
    patch_upstream_tests,
    prepare_upstream_tests,
    run_upstream_tests,
)
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.facts import upstream_test_files

OLDER = "9.8.0"
PREFIX_CACHE = "tests/v1/core/prefix_cache/"
PARTIAL = f"{PREFIX_CACHE}test_partial_prefix_cache_hits.py"
SCHEDULER_TEST = "tests/v1/core/test_scheduler.py"


@pytest.fixture
def facts(project):
    """The project with 9.8.0 pinned below 9.9.0, and release facts whose
    prefix_cache/ entry starts at 9.9.0, as 0.31.0's did when 0.30.0 was
    pinned."""
    project.pin_release(OLDER, "")
    path = project.patches / "vllm" / "release-facts.toml"
    path.write_text(
        "upstream_tests = [\n"
        f'  {{ path = "{SCHEDULER_TEST}", since = "{OLDER}" }},\n'
        f'  {{ path = "{PREFIX_CACHE}", since = "{RELEASE}" }},\n'
        "]\n"
    )
    return path


def sdist(tmp_path, files: list[str]):
    tree = tmp_path / "sdist"
    for name in [*files, "pyproject.toml"]:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("")
    return tree


def test_an_sdist_that_has_a_file_of_a_later_since_is_refused(facts, tmp_path):
    tree = sdist(tmp_path, [SCHEDULER_TEST, PARTIAL])
    dest = tmp_path / "tests"
    with pytest.raises(OverlayError) as caught:
        prepare_upstream_tests(OLDER, tree, dest)
    assert str(caught.value) == (
        f"{facts}: upstream_tests entry 2 ({PREFIX_CACHE}, since {RELEASE}): "
        f'vLLM {OLDER}\'s sources have it: write since = "{OLDER}"'
    )
    assert not dest.exists()
    prepare_upstream_tests(RELEASE, tree, dest)
    assert (dest / PARTIAL).is_file()


def test_an_sdist_that_lacks_a_file_is_refused(facts, tmp_path):
    with pytest.raises(OverlayError, match=r"entry 1 .* vLLM 9\.8\.0's sources lack"):
        prepare_upstream_tests(OLDER, sdist(tmp_path, []), tmp_path / "tests")


def series_changing(*files: str) -> SimpleNamespace:
    """What `patch_upstream_tests` reads of a series of 9.8.0."""
    release = SimpleNamespace(version=OLDER)
    return SimpleNamespace(upstream_test_files=list(files), release=release)


def test_a_changed_test_an_entry_holds_from_a_later_release_lowers_since(
    facts, tmp_path
):
    """The harness said "add them to upstream_tests", which would have added
    a second entry for a file one already holds."""
    unlisted = "tests/v1/kv_connector/unit/test_new.py"
    with pytest.raises(OverlayError) as caught:
        patch_upstream_tests(series_changing(PARTIAL, unlisted), tmp_path)
    assert str(caught.value) == (
        f"the series changes upstream tests the harness does not run on {OLDER}: "
        f"{PARTIAL}: upstream_tests entry 2 ({PREFIX_CACHE}, since {RELEASE}) "
        f'holds it; write since = "{OLDER}" there in '
        "patches/vllm/release-facts.toml; "
        f"{unlisted}: add it to upstream_tests in patches/vllm/release-facts.toml"
    )


def test_a_deselection_naming_a_test_the_release_lacks_says_to_bound_it(tmp_path):
    """A release pinned later falls in every range without a bound; one that
    lacks a deselected file is told which range to narrow."""
    with pytest.raises(OverlayError) as caught:
        run_upstream_tests("0.30.0", tmp_path, tmp_path, {})
    message = str(caught.value)
    assert message.startswith(
        "ci/suites/deselected.toml names tests that 0.30.0 lacks: "
    )
    assert "tests/v1/metrics/test_ray_metrics.py (every release)" in message
    assert message.endswith(
        "; bound those entries' ranges (`since`, `until`) to leave 0.30.0 out"
    )


def test_a_listed_file_left_out_whole_is_not_named_to_pytest(tmp_path, monkeypatch):
    """pytest's `--ignore` does not apply to a path named on its command
    line, so a file of upstream_tests that a deselection leaves out whole on
    a release (test_nixl_heartbeat.py on 0.22.1) is not named there."""
    heartbeat = "tests/v1/kv_connector/unit/test_nixl_heartbeat.py"
    for target in [*deselection_args("0.22.1"), heartbeat]:
        path = tmp_path / target.split("=", 1)[-1].split("::")[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    commands = []

    def run(command, **kwargs):
        commands.append(command)
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(pytest_runs.subprocess, "run", run)
    assert run_upstream_tests("0.22.1", tmp_path, tmp_path, {}) == 0
    (command,) = commands
    assert f"--ignore={heartbeat}" in command
    assert heartbeat not in command
    assert "tests/v1/metrics/" in command
    assert heartbeat in upstream_test_files("0.22.1")
