"""`vllm-overlay lint` beyond one series' files: tests no patch cites, the
append-only history against git's HEAD, and each series applied to its
release's cached sources."""

import os
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import (
    RELEASE,
    SCHEDULER,
    SCHEDULER_SOURCE,
    format_patch,
    run_cli,
    run_git,
)

from vllm_overlay.series.deselections import UPSTREAM_DESELECTIONS_FILE
from vllm_overlay.series.model import parse_patch
from vllm_overlay.track.checks.lint import KEPT_FILE, lint
from vllm_overlay.track.records.history import (
    HISTORY_FILE,
    DroppedPatch,
    append_history,
    read_history,
)
from vllm_overlay.track.records.verdicts import read_verdicts, record_verdicts

DEMO_TEST = "tests/probes/test_demo.py"
ENTRY = DroppedPatch(
    "old.patch", "old change", "9.8.0", RELEASE, "reverse-applies", "Pending", "none"
)


def add_tests(project, source: str) -> None:
    path = project.root / DEMO_TEST
    path.write_text(path.read_text() + source)


def keep(project, entries: str) -> None:
    (project.root / KEPT_FILE).write_text(f"[kept]\n{entries}")


def test_a_test_no_patch_cites_is_rejected(project):
    add_tests(project, "\n\ndef test_regression():\n    assert True\n")
    (problem,) = lint(project.patches)
    assert problem.startswith(
        f"{DEMO_TEST}::test_regression: no patch of any series cites it as a Probe:"
    )
    assert str(KEPT_FILE) in problem


def test_a_test_method_no_patch_cites_is_rejected(project):
    add_tests(
        project,
        "\n\nclass TestGroup:\n    def test_one(self):\n        pass\n\n"
        "    def helper(self):\n        pass\n\n\nclass Helper:\n"
        "    def test_not_collected(self):\n        pass\n",
    )
    (problem,) = lint(project.patches)
    assert problem.startswith(f"{DEMO_TEST}::TestGroup::test_one: no patch")


def test_a_listed_uncited_test_is_accepted(project):
    add_tests(project, "\n\ndef test_regression():\n    assert True\n")
    keep(project, f'"{DEMO_TEST}::test_regression" = "pins upstream behaviour"\n')
    assert lint(project.patches) == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (f'"{DEMO_TEST}::test_gone" = "why"', "test_gone names no test"),
        (
            f'"{DEMO_TEST}::test_demo" = "why"',
            f"test_demo is cited by v{RELEASE}/scheduler-demo.patch; remove the entry",
        ),
        (f'"{DEMO_TEST}::test_regression" = ""', "test_regression needs a reason"),
    ],
)
def test_a_wrong_kept_entry_is_rejected(project, entry, message):
    add_tests(project, "\n\ndef test_regression():\n    assert True\n")
    keep(project, entry + "\n")
    assert any(message in problem for problem in lint(project.patches))


@pytest.fixture
def committed_history(project):
    """A git checkout whose HEAD holds a history with two entries."""
    append_history(project.patches, [ENTRY, replace(ENTRY, patch="older.patch")])
    run_git(project.root, "init", "-q")
    run_git(project.root, "add", "-A")
    run_git(project.root, "commit", "-qm", "project")
    return project.patches / HISTORY_FILE


def test_appending_to_the_committed_history_is_fine(project, committed_history):
    append_history(project.patches, [replace(ENTRY, patch="new.patch")])
    assert lint(project.patches) == []


def test_an_edited_committed_entry_is_rejected(project, committed_history):
    text = committed_history.read_text()
    committed_history.write_text(text.replace("reverse-applies", "absorbed", 1))
    (problem,) = lint(project.patches)
    assert problem == (
        f"{committed_history}: committed entry 1 (old.patch, dropped from the "
        f"9.8.0 series at {RELEASE}) was edited; the history is append-only"
    )


def test_a_removed_committed_entry_is_rejected(project, committed_history):
    text = committed_history.read_text()
    first = text.index("[[dropped]]")
    committed_history.write_text(
        text[:first] + text[text.index("[[dropped]]", first + 1) :]
    )
    (problem,) = lint(project.patches)
    assert "committed entry 1 (old.patch" in problem and "was removed" in problem


def test_a_new_entry_among_the_committed_ones_is_rejected(project, committed_history):
    text = committed_history.read_text()
    second = text.index("[[dropped]]", text.index("[[dropped]]") + 1)
    extra = text[second:].replace("older.patch", "new.patch")
    committed_history.write_text(text[:second] + extra + text[second:])
    (problem,) = lint(project.patches)
    assert "reordered or have new entries among them" in problem


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the checkout away")
def test_the_history_check_reads_the_checkout_with_the_users_git_config(
    project, committed_history, tmp_path, monkeypatch
):
    """A checkout owned by another user (a volume mounted into a container)
    is read by git only where the user's config lists it in `safe.directory`;
    lint reads the maintainer's own checkout with their config, so the
    append-only check still runs there."""
    text = committed_history.read_text()
    committed_history.write_text(text.replace("reverse-applies", "absorbed", 1))
    for path in (project.root, *project.root.rglob("*")):
        os.lchown(path, 12345, 12345)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(f"[safe]\n\tdirectory = {project.root}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    (problem,) = lint(project.patches)
    assert "committed entry 1 (old.patch" in problem and "was edited" in problem


def test_outside_git_the_history_check_is_skipped(project, capsys):
    append_history(project.patches, [ENTRY])
    code, _, err = run_cli(capsys, "lint")
    assert code == 0
    assert (
        "vllm-overlay lint: skipped the append-only check of the history: "
        f"{project.patches} is not in a git checkout"
    ) in err


def cache_sources(project, scheduler: str = SCHEDULER_SOURCE) -> Path:
    """The release's sources as the harness unpacks its pinned sdist (the
    pin's sdist sha256 is 64 zeros)."""
    sources = project.cache / "sources" / f"vllm-{RELEASE}"
    (sources / SCHEDULER).parent.mkdir(parents=True)
    (sources / SCHEDULER).write_text(scheduler)
    (sources / ".vllm-overlay-sdist-sha256").write_text("0" * 64 + "\n")
    return sources


def test_a_corrupted_context_line_fails_against_the_cached_sources(project, capsys):
    cache_sources(project)
    assert run_cli(capsys, "lint")[0] == 0
    patch = project.series_dir / "scheduler-demo.patch"
    patch.write_text(patch.read_text().replace("\n line 18\n", "\n line 18 \n"))
    code, _, err = run_cli(capsys, "lint")
    assert code == 1
    assert (
        f"scheduler-demo.patch does not apply exactly to vLLM {RELEASE}: "
        f"{SCHEDULER} hunk #1 (at line 17) does not match"
    ) in err


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # The hunk holds 7 lines on each side; its header claims 9 new ones.
        ("@@ -17,7 +17,7 @@", "@@ -17,7 +17,9 @@"),
        ("@@ -17,7 +17,7 @@", "@@ -17,5 +17,7 @@"),
        (f"+++ b/{SCHEDULER}\n", ""),
    ],
)
def test_a_patch_git_cannot_read_fails_without_sources(project, capsys, old, new):
    """On a fresh clone (no sources cached), a hand-edited hunk header or a
    broken file header fails lint, before any build or `pin --bump`."""
    patch = project.series_dir / "scheduler-demo.patch"
    text = patch.read_text()
    assert old in text
    patch.write_text(text.replace(old, new, 1))
    code, _, err = run_cli(capsys, "lint")
    assert code == 1
    assert f"{patch}: git cannot read it as a patch: " in err
    assert "skipped zero-fuzz application" in err


def test_an_offset_hunk_fails_against_the_cached_sources(project):
    cache_sources(project, "new first line\n" + SCHEDULER_SOURCE)
    (problem,) = lint(project.patches)
    assert f"{SCHEDULER} hunk #1 only applies at line 18 (offset)" in problem


def test_a_name_the_series_uses_and_the_file_lacks_fails_against_the_sources(project):
    """What a replay onto another release cannot see as a conflict: the patch
    relies on an import its own release's file has (0.31.0's
    `nixl/metadata.py` imports `dataclasses.field`, 0.30.0's does not)."""
    source = "from dataclasses import dataclass\n\n\n@dataclass\nclass Meta:\n"
    unpatched = source + "    held: bool\n"
    patched = source + "    held: set[str] = field(default_factory=set)\n"
    cache_sources(project, unpatched)
    patch = project.series_dir / "scheduler-demo.patch"
    patch.write_text(
        format_patch(project.workdir, {SCHEDULER: unpatched}, {SCHEDULER: patched})
    )
    problems = [p for p in lint(project.patches) if "neither defines" in p]
    assert problems == [
        f"vLLM {RELEASE}: the series makes {SCHEDULER} read `field`, which the "
        "file neither defines nor imports (an import the patch's own release has? "
        "add it to the patch)"
    ]
    with_import = patched.replace("dataclass\n", "dataclass, field\n", 1)
    patch.write_text(
        format_patch(project.workdir, {SCHEDULER: unpatched}, {SCHEDULER: with_import})
    )
    assert not [p for p in lint(project.patches) if "neither defines" in p]


def test_without_cached_sources_the_application_check_is_skipped(project, capsys):
    code, _, err = run_cli(capsys, "lint")
    assert code == 0
    assert (
        f"vllm-overlay lint: skipped zero-fuzz application to vLLM {RELEASE}: "
        f"its sources are not cached ({project.cache / 'sources' / f'vllm-{RELEASE}'})"
    ) in err


def test_sources_of_another_sdist_are_not_used(project, capsys):
    sources = cache_sources(project, "unrelated\n")
    (sources / ".vllm-overlay-sdist-sha256").write_text("1" * 64 + "\n")
    code, _, err = run_cli(capsys, "lint")
    assert code == 0
    assert f"skipped zero-fuzz application to vLLM {RELEASE}" in err


# Characters JSON-style escaping writes as TOML cannot read: outside the
# Basic Multilingual Plane (a surrogate pair escape) and DEL (left raw).
AWKWARD = 'reason \U0001f600 and \x7f, "quoted" \\ back'


def test_recorded_files_hold_any_text(project):
    """history.toml and verdicts.toml are written with tomli_w, so a text
    outside the Basic Multilingual Plane or with DEL reads back unchanged."""
    append_history(project.patches, [replace(ENTRY, reason=AWKWARD)])
    assert read_history(project.patches)[-1].reason == AWKWARD
    patch = parse_patch(project.series_dir / "scheduler-demo.patch")
    record_verdicts(project.patches, [(RELEASE, patch, AWKWARD, None)], "today")
    assert read_verdicts(project.patches)[RELEASE, patch.name].verdict == AWKWARD
    assert lint(project.patches) == []


OLDER = "9.8.0"
FACTS_TEST = "tests/v1/core/test_scheduler.py"


def release_facts(project, since: str, deselections: str = "") -> Path:
    """The release facts' `upstream_tests` (one entry, `FACTS_TEST`) and
    the two deselection files, as in the repository."""
    facts = project.patches / "vllm" / "release-facts.toml"
    facts.write_text(
        f'upstream_tests = [{{ path = "{FACTS_TEST}", since = "{since}" }}]\n'
    )
    upstream = project.root / UPSTREAM_DESELECTIONS_FILE
    upstream.parent.mkdir(parents=True, exist_ok=True)
    upstream.write_text(deselections)
    (project.root / "tests" / "deselected.toml").write_text("")
    return facts


def cache_release_sources(project, version: str, with_test: bool) -> Path:
    """`version`'s sources in the cache, as the harness unpacks its pinned
    sdist, holding upstream's `FACTS_TEST` or not."""
    sources = project.cache / "sources" / f"vllm-{version}"
    (sources / FACTS_TEST).parent.mkdir(parents=True)
    if with_test:
        (sources / FACTS_TEST).write_text("def test_x():\n    pass\n")
    (sources / ".vllm-overlay-sdist-sha256").write_text("0" * 64 + "\n")
    return sources


def test_a_since_that_names_no_pinned_release_says_what_to_write(project, capsys):
    facts = release_facts(project, "9.8.5")
    code, _, err = run_cli(capsys, "lint")
    assert code == 1
    assert (
        f"{facts}: upstream_tests entry 1 ({FACTS_TEST}, since 9.8.5): 9.8.5 is "
        "not a pinned release; `since` names the first pinned release that has "
        f'the path: write since = "{RELEASE}"'
    ) in err
    release_facts(project, RELEASE)
    assert lint(project.patches) == []


def test_a_since_newer_than_any_pinned_release_is_named(project):
    facts = release_facts(project, "10.0.0")
    assert lint(project.patches) == [
        f"{facts}: upstream_tests entry 1 ({FACTS_TEST}, since 10.0.0): 10.0.0 is "
        "not a pinned release, and no pinned release is as new; pin it, or "
        "remove the entry"
    ]


def test_an_older_pin_whose_cached_sources_have_the_file_lowers_since(project):
    """Pinning an older release: the entries it has with a later `since`
    are found as soon as its sources are cached (by `rebase` or the
    harness); without them lint cannot know, and says nothing."""
    facts = release_facts(project, RELEASE)
    project.pin_release(OLDER, SCHEDULER_SOURCE)
    assert lint(project.patches) == []
    cache_release_sources(project, OLDER, with_test=True)
    assert lint(project.patches) == [
        f"{facts}: upstream_tests entry 1 ({FACTS_TEST}, since {RELEASE}): vLLM "
        f'{OLDER}\'s sources have it: write since = "{OLDER}"'
    ]
    release_facts(project, OLDER)
    assert lint(project.patches) == []


def test_an_older_pin_whose_sources_lack_the_file_keeps_since(project):
    release_facts(project, RELEASE)
    project.pin_release(OLDER, SCHEDULER_SOURCE)
    cache_release_sources(project, OLDER, with_test=False)
    assert lint(project.patches) == []


def test_a_release_from_since_on_whose_sources_lack_the_file_is_named(project):
    facts = release_facts(project, OLDER)
    project.pin_release(OLDER, SCHEDULER_SOURCE)
    cache_release_sources(project, OLDER, with_test=False)
    cache_release_sources(project, RELEASE, with_test=True)
    (project.cache / "sources" / f"vllm-{RELEASE}" / SCHEDULER).parent.mkdir(
        parents=True
    )
    (project.cache / "sources" / f"vllm-{RELEASE}" / SCHEDULER).write_text(
        SCHEDULER_SOURCE
    )
    assert lint(project.patches) == [
        f"{facts}: upstream_tests entry 1 ({FACTS_TEST}, since {OLDER}): vLLM "
        f'{OLDER}\'s sources lack it: write since = "{RELEASE}"'
    ]


@pytest.mark.parametrize(
    ("bounds", "problem"),
    [
        ('until = "9.8.0"\n', "(tests/a.py, up to 9.8.0) applies to no pinned"),
        ('since = "9.9.1"\n', "(tests/a.py, 9.9.1 and later) applies to no pinned"),
        (
            'releases = ["9.9.0"]\n',
            "entry 1: `releases` lists releases one by one; name the range",
        ),
    ],
)
def test_a_deselection_range_must_hold_a_pinned_release(project, bounds, problem):
    release_facts(
        project,
        RELEASE,
        f'[[deselect]]\ntest = "tests/a.py"\n{bounds}reason = "why"\n',
    )
    (found,) = lint(project.patches)
    assert found.startswith(f"{project.root / UPSTREAM_DESELECTIONS_FILE}: deselect")
    assert problem in found


def test_a_checkout_without_release_facts_skips_their_check(project, capsys):
    code, _, err = run_cli(capsys, "lint")
    assert code == 0
    facts = project.patches / "vllm" / "release-facts.toml"
    assert f"skipped the release facts' `since`: {facts} does not exist" in err
