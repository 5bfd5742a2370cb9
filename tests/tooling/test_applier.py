import pytest
from conftest import SCHEDULER, SCHEDULER_SOURCE, format_patch, scheduler_edit

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.loader import release_series
from vllm_overlay.upstream.applier import apply_series

ORIGINALS = {SCHEDULER: SCHEDULER_SOURCE.encode()}


def test_series_applies_in_order(project):
    # The second patch's context includes the first patch's change.
    first = scheduler_edit(20, "line twenty, patched")
    second = first.replace("line 21\n", "line 21, patched after 20\n")
    project.add_patch(
        "second.patch",
        format_patch(project.workdir, {SCHEDULER: first}, {SCHEDULER: second}),
    )
    result = apply_series(release_series(None), ORIGINALS)
    assert result == {SCHEDULER: second.encode()}


def test_patch_may_add_a_module(project):
    added = "vllm/v1/overlay_helper.py"
    project.add_patch(
        "new-file.patch",
        format_patch(project.workdir, {}, {added: "HELPER = True\n"}),
    )
    result = apply_series(release_series(None), ORIGINALS)
    assert result[added] == b"HELPER = True\n"


def test_offset_hunk_is_refused_with_patch_file_and_hunk(project):
    shifted = {SCHEDULER: ("inserted upstream\n" + SCHEDULER_SOURCE).encode()}
    with pytest.raises(OverlayError) as info:
        apply_series(release_series(None), shifted)
    message = str(info.value)
    assert "scheduler-demo.patch does not apply exactly to vLLM 9.9.0" in message
    assert f"{SCHEDULER} hunk #1 only applies at line 18 (offset)" in message


def test_changed_context_is_refused_with_hunk_number(project):
    lines = SCHEDULER_SOURCE.replace("line 35\n", "line 35, upstream changed\n")
    edited = scheduler_edit(20, "line twenty, patched").replace(
        "line 36\n", "line 36, ours\n"
    )
    project.add_patch(
        "two-hunks.patch",
        format_patch(
            project.workdir,
            {SCHEDULER: scheduler_edit(20, "line twenty, patched")},
            {SCHEDULER: edited},
        ),
    )
    with pytest.raises(OverlayError) as info:
        apply_series(release_series(None), {SCHEDULER: lines.encode()})
    assert "two-hunks.patch" in str(info.value)
    assert f"{SCHEDULER} hunk #1 (at line 33) does not match" in str(info.value)


def test_the_users_git_config_cannot_loosen_the_applier(project, tmp_path, monkeypatch):
    """With `apply.ignoreWhitespace` in a user's config, `git apply` takes
    context that differs in white space: fuzz. The applier runs git without
    the user's config."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[apply]\n\tignoreWhitespace = change\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    spaced = {SCHEDULER: SCHEDULER_SOURCE.replace("line 19\n", "line  19\n").encode()}
    with pytest.raises(OverlayError, match=r"hunk #1 \(at line 17\) does not match"):
        apply_series(release_series(None), spaced)


def test_missing_file_is_refused(project):
    with pytest.raises(OverlayError, match=r"scheduler-demo\.patch.*No such file"):
        apply_series(release_series(None), {})


UPSTREAM_TEST = "tests/v1/core/test_scheduler.py"
UPSTREAM_TEST_SOURCE = "def test_old():\n    assert 1\n"


def add_patch_with_test_update(project) -> None:
    project.add_patch(
        "with-test.patch",
        format_patch(
            project.workdir,
            {
                SCHEDULER: scheduler_edit(20, "line twenty, patched"),
                UPSTREAM_TEST: UPSTREAM_TEST_SOURCE,
            },
            {
                SCHEDULER: scheduler_edit(20, "line twenty, patched").replace(
                    "line 30\n", "line thirty\n"
                ),
                UPSTREAM_TEST: "def test_new():\n    assert 2\n",
            },
        ),
    )


def test_package_tree_skips_hunks_for_upstream_tests(project):
    add_patch_with_test_update(project)
    series = release_series(None)
    assert series.touched_files == (SCHEDULER,)
    assert series.upstream_test_files == (UPSTREAM_TEST,)
    result = apply_series(series, ORIGINALS)
    assert set(result) == {SCHEDULER}
    assert b"line thirty\n" in result[SCHEDULER]


def test_tests_tree_applies_only_the_test_hunks(project):
    add_patch_with_test_update(project)
    originals = {UPSTREAM_TEST: UPSTREAM_TEST_SOURCE.encode()}
    result = apply_series(release_series(None), originals, "tests/")
    assert result == {UPSTREAM_TEST: b"def test_new():\n    assert 2\n"}


def test_drifted_upstream_test_is_refused(project):
    add_patch_with_test_update(project)
    originals = {UPSTREAM_TEST: b"def test_old():\n    assert 1  # moved\n"}
    with pytest.raises(OverlayError, match=rf"with-test\.patch.*{UPSTREAM_TEST}"):
        apply_series(release_series(None), originals, "tests/")


def test_unknown_tree_is_a_programming_error(project):
    with pytest.raises(ValueError, match="tree must be"):
        apply_series(release_series(None), ORIGINALS, "docs/")
