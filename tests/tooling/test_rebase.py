"""`vllm-overlay rebase FROM TO`: a series replayed onto a second synthetic
release whose files drift, absorb a patch, or conflict with it."""

import json
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import (
    AUTHOR,
    RELEASE,
    SCHEDULER,
    SCHEDULER_SOURCE,
    TRAILERS,
    format_patch,
    make_vllm_clone,
    run_cli,
    run_git,
    scheduler_edit,
    sha256_file,
)
from conftest import DEMO_PROBE as DEMO_PROBE_SOURCE
from test_lint import FACTS_TEST, OLDER, cache_release_sources, release_facts

from vllm_overlay.series.loader import pinned_releases, release_series
from vllm_overlay.series.manifest import MANIFEST_FORMAT, MANIFEST_PATH
from vllm_overlay.track.checks.lint import lint
from vllm_overlay.track.rebasing.rebase import state_dir
from vllm_overlay.track.records.history import HISTORY_FILE, read_history
from vllm_overlay.track.status import probing
from vllm_overlay.upstream.applier import apply_series

TO = "9.10.0"
PATCH = "scheduler-demo.patch"
PATCHED_LINE = "line twenty, patched"
DEMO_PROBE = "tests/probes/test_demo.py::test_demo"


def pin_target(project, scheduler: str, version: str = TO) -> None:
    """Pin release `version`, whose scheduler is `scheduler`, and cache its
    wheel."""
    project.pin_release(version, scheduler)


@pytest.fixture
def checkout(project):
    """The synthetic project as a git work tree with everything committed."""
    run_git(project.root, "init", "-q")
    run_git(project.root, "add", "-A")
    run_git(project.root, "commit", "-qm", "project")
    return project


def committed(project) -> None:
    run_git(project.root, "add", "-A")
    run_git(project.root, "commit", "-qm", "pin")


def target_dir(project) -> Path:
    return project.patches / "vllm" / f"v{TO}"


def drifted(lines_on_top: int = 5) -> str:
    return "".join(f"new {n}\n" for n in range(lines_on_top)) + SCHEDULER_SOURCE


def rebase(capsys, *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "rebase", *argv)


def test_drifted_patch_is_kept_with_refreshed_context(checkout, capsys):
    pin_target(checkout, drifted())
    committed(checkout)
    code, out, _ = rebase(capsys, RELEASE, TO)
    assert code == 0, out
    assert f"kept     {PATCH}" in out
    series = release_series(TO)
    assert [p.name for p in series.patches] == [PATCH]
    text = series.patches[0].path.read_text()
    assert "@@ -22,7 +22,7 @@" in text
    assert TRAILERS in text
    patched = apply_series(series, {SCHEDULER: drifted().encode()})
    assert PATCHED_LINE in patched[SCHEDULER].decode()
    assert not state_dir(checkout.patches).exists()
    assert not (checkout.patches / HISTORY_FILE).exists()
    assert lint(checkout.patches) == []
    assert run_cli(capsys, "refresh", TO, "--check")[0] == 0


def test_releases_are_named_as_status_names_them(checkout, capsys):
    """`9.10` and `v9.9.0` are the pinned 9.10.0 and 9.9.0, as for `status`
    and every other command (`pins.find_pin`)."""
    pin_target(checkout, drifted())
    committed(checkout)
    assert rebase(capsys, f"v{RELEASE}", "9.10")[0] == 0
    assert [p.name for p in release_series(TO).patches] == [PATCH]


def test_the_messages_line_references_follow_the_code(checkout, capsys):
    """A kept patch's `path:line` references to vLLM's package move to where
    the cited lines are in TO; lines TO no longer has are reported stale and
    left; a reference on a line naming a release, or to a file outside
    vLLM's package, is left alone."""
    patch = checkout.series_dir / PATCH
    patch.write_text(
        patch.read_text().replace(
            "\nWhy.\n",
            "\nWhy: `sched/scheduler.py:17-19` holds it, and `scheduler.py:30`;\n"
            ":21 is the same file's;\n"
            "`scheduler.py:22` as 9.9.0 has it; `lmcache/x.py:3` is LMCache's.\n",
        )
    )
    assert run_cli(capsys, "pin", "--bump", RELEASE)[0] == 0
    pin_target(checkout, drifted().replace("line 30\n", "line thirty\n"))
    committed(checkout)
    code, out, _ = rebase(capsys, RELEASE, TO)
    assert code == 0, out
    assert (
        f"moved    {PATCH}: sched/scheduler.py:17-19 -> sched/scheduler.py:22-24\n"
        f"stale    {PATCH}: scheduler.py:30: the cited lines are no longer there; "
        "fix it in the patch's message (the text above its `---`), then "
        f"`vllm-overlay pin --bump {TO}`\n"
        f"moved    {PATCH}: :21 -> :26\n"
    ) in out
    # A line naming the series' own release may no longer hold on TO.
    assert (
        f"prose    {PATCH}: names {RELEASE}, the series' release: "
        f'"`scheduler.py:22` as {RELEASE} has it; `lmcache/x.py:3` is LMCache\'s."; '
        f"check that it holds on {TO}\n"
    ) in out
    text = (target_dir(checkout) / PATCH).read_text()
    assert "Why: `sched/scheduler.py:22-24` holds it, and `scheduler.py:30`;\n" in text
    assert "\n:26 is the same file's;\n" in text
    assert "`scheduler.py:22` as 9.9.0 has it; `lmcache/x.py:3` is LMCache's.\n" in text
    assert lint(checkout.patches) == []


def test_a_reference_to_upstreams_tests_follows_them_in_the_cached_sources(
    checkout, capsys
):
    """Upstream's tests ship in the sdist, not the wheel: with both releases'
    sources cached, a message's reference to one moves like one to vLLM's
    package (0.34.0's rebase left one to tests/v1/kv_connector/unit/utils.py
    stale without a word)."""
    patch = checkout.series_dir / PATCH
    patch.write_text(
        patch.read_text().replace(
            "\nWhy.\n", f"\nWhy: `{FACTS_TEST}:2` is the test's body.\n"
        )
    )
    assert run_cli(capsys, "pin", "--bump", RELEASE)[0] == 0
    pin_target(checkout, drifted())
    committed(checkout)
    cache_release_sources(checkout, RELEASE, with_test=True)
    sources = cache_release_sources(checkout, TO, with_test=False)
    (sources / FACTS_TEST).write_text("import os\n\ndef test_x():\n    pass\n")
    code, out, _ = rebase(capsys, RELEASE, TO)
    assert code == 0, out
    assert f"moved    {PATCH}: {FACTS_TEST}:2 -> {FACTS_TEST}:4\n" in out
    assert f"Why: `{FACTS_TEST}:4` is" in (target_dir(checkout) / PATCH).read_text()


def test_the_new_series_is_recorded_for_its_revision(checkout, capsys):
    pin_target(checkout, drifted())
    committed(checkout)
    assert rebase(capsys, RELEASE, TO)[0] == 0
    capsys.readouterr()
    pin = pinned_releases(checkout.patches)[TO]
    assert pin.series_digest == release_series(TO).digest
    assert pin.revision == 1
    assert lint(checkout.patches) == []
    assert f"vLLM {TO}'s series is not recorded" not in capsys.readouterr().err


def test_the_new_release_gets_its_changelog_entry(checkout, capsys):
    changelog = checkout.root / "CHANGELOG.md"
    changelog.write_text("# Changelog\n\n## [Unreleased]\n\n### Fixed\n- A fix.\n")
    pin_target(checkout, drifted())
    committed(checkout)
    code, out, _ = rebase(capsys, RELEASE, TO)
    assert code == 0, out
    assert f"CHANGELOG.md: vLLM {TO}'s entry written under Unreleased, Added\n" in out
    text = changelog.read_text()
    assert text.startswith("# Changelog\n\n## [Unreleased]\n\n### Added\n- vLLM")
    assert text.endswith("every one kept.\n\n### Fixed\n- A fix.\n")
    assert (
        f"- vLLM {TO} is pinned: `{TO}+hybridkv.1` from `vllm`, the {RELEASE} "
        "series' 1 patch, every one kept."
    ) in " ".join(text.split())


def test_patch_upstream_already_has_is_dropped_and_recorded(checkout, capsys):
    pin_target(checkout, scheduler_edit(20, PATCHED_LINE))
    committed(checkout)
    code, out, _ = rebase(capsys, RELEASE, TO)
    assert code == 0
    assert f"dropped  {PATCH}: reverse-applies: vLLM {TO} already has" in out
    assert release_series(TO).patches == ()
    (entry,) = read_history(checkout.patches)
    assert (entry.patch, entry.series, entry.release) == (PATCH, RELEASE, TO)
    assert entry.upstream_status == "Pending"
    assert lint(checkout.patches) == []


def test_change_absorbed_next_to_other_edits_merges_to_nothing(checkout, capsys):
    upstream = scheduler_edit(20, PATCHED_LINE).replace("line 17\n", "line 17 new\n")
    pin_target(checkout, upstream)
    committed(checkout)
    code, out, _ = rebase(capsys, RELEASE, TO)
    assert code == 0
    assert "empty after a 3-way merge" in out
    assert read_history(checkout.patches)[0].reason.startswith("empty after")


def test_history_is_only_appended(checkout, capsys):
    history = checkout.patches / HISTORY_FILE
    pin_target(checkout, scheduler_edit(20, PATCHED_LINE))
    committed(checkout)
    assert rebase(capsys, RELEASE, TO)[0] == 0
    first = history.read_text()
    run_git(checkout.root, "add", "-A")
    run_git(checkout.root, "commit", "-qm", "rebased")
    subprocess.run(["rm", "-r", str(target_dir(checkout))], check=True)
    run_git(checkout.root, "commit", "-qam", "drop the series again")
    assert rebase(capsys, RELEASE, TO)[0] == 0
    second = history.read_text()
    assert second.startswith(first)
    assert len(tomllib.loads(second)["dropped"]) == 2


def conflicting(checkout) -> None:
    pin_target(checkout, scheduler_edit(20, "line twenty, upstream"))
    committed(checkout)


def test_conflict_stops_with_a_report_and_writes_nothing(checkout, capsys):
    conflicting(checkout)
    code, out, err = rebase(capsys, RELEASE, TO)
    assert code == 1
    assert f"stopped  {PATCH}: merge conflict" in out
    assert f"{PATCH} does not merge onto vLLM {TO}" in err
    assert f"{SCHEDULER}: both changed it" in err
    assert "conflict 1 at line 20:" in err
    for side in ("| line twenty, upstream", "| line 20", f"| {PATCHED_LINE}"):
        assert side in err
    assert "--continue" in err
    assert "`vllm-overlay rebase --skip` to drop the patch (recorded in the " in err
    assert not target_dir(checkout).exists()
    assert run_git(checkout.root, "status", "--porcelain", "patches") == ""
    assert (state_dir(checkout.patches) / "conflict.txt").read_text() in err


def test_a_second_rebase_is_refused_while_one_is_stopped(checkout, capsys):
    conflicting(checkout)
    rebase(capsys, RELEASE, TO)
    code, _, err = rebase(capsys, RELEASE, TO)
    assert code == 1
    assert "a rebase is already in progress" in err


def repo_of(checkout) -> Path:
    return state_dir(checkout.patches) / "repo"


def test_continue_after_resolving_keeps_the_resolution(checkout, capsys):
    conflicting(checkout)
    rebase(capsys, RELEASE, TO)
    code, _, err = rebase(capsys, "--continue")
    assert code == 1
    assert f"still unmerged in {repo_of(checkout)}: {SCHEDULER}" in err

    resolved = scheduler_edit(20, "line twenty, upstream and patched")
    (repo_of(checkout) / SCHEDULER).write_text(resolved)
    code, _, err = rebase(capsys, "--continue")
    assert code == 1
    assert "still unmerged" in err
    run_git(repo_of(checkout), "add", SCHEDULER)
    code, out, _ = rebase(capsys, "--continue")
    assert code == 0, out
    assert f"kept     {PATCH}" in out
    (patch,) = release_series(TO).patches
    assert TRAILERS in patch.path.read_text()
    assert "+line twenty, upstream and patched" in patch.path.read_text()
    assert not state_dir(checkout.patches).exists()


def test_continue_keeps_message_lines_that_start_with_a_hash(checkout, capsys):
    """git's default clean-up of a resolved cherry-pick's message strips every
    line that starts with `#`, and a patch message may hold such a line (a
    Markdown heading, a quoted shell comment)."""
    patch = checkout.series_dir / PATCH
    hashed = "# a line of the message, not a comment"
    patch.write_text(patch.read_text().replace("Why.\n", f"Why.\n{hashed}\n"))
    run_git(checkout.root, "commit", "-qam", "a message line starting with #")
    conflicting(checkout)
    rebase(capsys, RELEASE, TO)
    (repo_of(checkout) / SCHEDULER).write_text(scheduler_edit(20, PATCHED_LINE))
    run_git(repo_of(checkout), "add", SCHEDULER)
    code, out, _ = rebase(capsys, "--continue")
    assert code == 0, out
    (rebased,) = release_series(TO).patches
    text = rebased.path.read_text()
    assert f"Why.\n{hashed}\n\n{TRAILERS}" in text
    assert f"From: {AUTHOR}\n" in text


def test_markers_left_in_a_staged_file_are_refused(checkout, capsys):
    conflicting(checkout)
    rebase(capsys, RELEASE, TO)
    run_git(repo_of(checkout), "add", SCHEDULER)
    code, _, err = rebase(capsys, "--continue")
    assert code == 1
    assert f"conflict markers left in {SCHEDULER}" in err


def test_resolving_to_upstream_drops_the_patch(checkout, capsys):
    conflicting(checkout)
    rebase(capsys, RELEASE, TO)
    (repo_of(checkout) / SCHEDULER).write_text(
        scheduler_edit(20, "line twenty, upstream")
    )
    run_git(repo_of(checkout), "add", SCHEDULER)
    code, out, _ = rebase(capsys, "--continue")
    assert code == 0
    assert "empty after the maintainer resolved" in out
    assert release_series(TO).patches == ()


def test_skip_drops_the_stopped_patch(checkout, capsys):
    conflicting(checkout)
    rebase(capsys, RELEASE, TO)
    code, out, _ = rebase(capsys, "--skip")
    assert code == 0
    assert "skipped by the maintainer" in out
    assert read_history(checkout.patches)[0].release == TO


def test_abort_leaves_nothing(checkout, capsys):
    conflicting(checkout)
    rebase(capsys, RELEASE, TO)
    code, out, _ = rebase(capsys, "--abort")
    assert code == 0
    assert f"abandoned the rebase {RELEASE} -> {TO}" in out
    assert not state_dir(checkout.patches).exists()
    assert run_git(checkout.root, "status", "--porcelain", "patches") == ""


def test_later_patches_replay_after_a_resolved_conflict(checkout, capsys):
    checkout.add_patch(
        "scheduler-second.patch",
        format_patch(
            checkout.workdir,
            {SCHEDULER: scheduler_edit(20, PATCHED_LINE)},
            {SCHEDULER: scheduler_edit(20, PATCHED_LINE).replace("line 5\n", "l5\n")},
            subject="scheduler: second change",
        ),
    )
    conflicting(checkout)
    rebase(capsys, RELEASE, TO)
    (repo_of(checkout) / SCHEDULER).write_text(scheduler_edit(20, "resolved"))
    run_git(repo_of(checkout), "add", SCHEDULER)
    code, out, _ = rebase(capsys, "--continue")
    assert code == 0, out
    assert [p.name for p in release_series(TO).patches] == [
        PATCH,
        "scheduler-second.patch",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((RELEASE, "9.11.0"), "vLLM 9.11.0 is not a pinned release"),
        ((RELEASE, "9.11"), "vLLM 9.11 is not a pinned release"),
        ((RELEASE, "latest"), "'latest' is not a version number"),
        ((RELEASE, RELEASE), "FROM and TO are the same release"),
        ((RELEASE,), "rebase needs FROM and TO"),
        (("--continue",), "no rebase in progress"),
        (("--skip",), "no rebase in progress"),
        (("--abort",), "no rebase in progress"),
        (("--continue", RELEASE), "take no releases"),
    ],
)
def test_bad_arguments(checkout, capsys, argv, message):
    pin_target(checkout, drifted())
    committed(checkout)
    code, out, err = rebase(capsys, *argv)
    assert (code, out) == (1, "")
    assert message in err
    assert not (checkout.root / ".vllm-overlay").exists()


def test_series_already_there_is_refused(checkout, capsys):
    pin_target(checkout, drifted())
    target_dir(checkout).mkdir()
    (target_dir(checkout) / "series").write_text("# empty\n")
    committed(checkout)
    code, _, err = rebase(capsys, RELEASE, TO)
    assert code == 1
    assert f"vLLM {TO} already has a series" in err


def test_no_series_for_from_is_refused(checkout, capsys):
    pin_target(checkout, drifted())
    committed(checkout)
    code, _, err = rebase(capsys, TO, RELEASE)
    assert code == 1
    assert f"vLLM {TO} has no series" in err


def test_dirty_patches_tree_is_refused(checkout, capsys):
    pin_target(checkout, drifted())
    code, _, err = rebase(capsys, RELEASE, TO)
    assert code == 1
    assert "has uncommitted changes (patches/vllm/releases.toml" in err
    assert not (checkout.root / ".vllm-overlay").exists()


def test_missing_work_tree_is_refused(project, capsys):
    pin_target(project, drifted())
    code, _, err = rebase(capsys, RELEASE, TO)
    assert code == 1
    assert "is not in a git work tree" in err


def test_invalid_trailers_in_from_are_refused(checkout, capsys):
    path = checkout.series_dir / PATCH
    path.write_text(path.read_text().replace("Drop-When:", "Dropped-When:"))
    pin_target(checkout, drifted())
    committed(checkout)
    code, _, err = rebase(capsys, RELEASE, TO)
    assert code == 1
    assert "missing trailer Drop-When:" in err
    assert not (checkout.root / ".vllm-overlay").exists()


def test_missing_rebase_repo_is_reported(checkout, capsys):
    conflicting(checkout)
    rebase(capsys, RELEASE, TO)
    subprocess.run(["rm", "-rf", str(repo_of(checkout))], check=True)
    code, _, err = rebase(capsys, "--continue")
    assert code == 1
    assert "rebase work tree" in err and "is missing" in err


@pytest.mark.parametrize(
    ("status", "dropped"),
    [("Backport 9.10.0", True), ("Backport v9.9.5", True), ("Backport 9.11.0", False)],
)
def test_backport_of_a_release_up_to_to_is_dropped(checkout, capsys, status, dropped):
    path = checkout.series_dir / PATCH
    path.write_text(
        path.read_text().replace(
            "Upstream-Status: Pending", f"Upstream-Status: {status}"
        )
    )
    conflicting(checkout)
    code, out, _ = rebase(capsys, RELEASE, TO)
    if dropped:
        assert code == 0
        assert f"dropped  {PATCH}: Upstream-Status: Backport" in out
        assert f"vLLM {TO} has the upstream change" in out
    else:
        assert (code, f"stopped  {PATCH}: merge conflict" in out) == (1, True)


def test_a_backward_rebase_says_it_is_a_backport(checkout, capsys):
    pin_target(checkout, drifted(), version="9.8.0")
    committed(checkout)
    code, out, err = rebase(capsys, RELEASE, "9.8.0")
    assert code == 0, err
    assert f"vLLM 9.8.0 is older than {RELEASE}: this rebase is a backport" in err
    assert f"kept     {PATCH}" in out


def rebase_onto_older(checkout, capsys, facts_text: str) -> tuple[Path, str]:
    """Rebase onto `OLDER`, pinned below every series, whose cached sources
    have `FACTS_TEST`, with the release facts `facts_text`: the facts file
    and what the rebase printed."""
    facts = release_facts(checkout, RELEASE)
    facts.write_text(facts_text)
    pin_target(checkout, drifted(), version=OLDER)
    committed(checkout)
    cache_release_sources(checkout, OLDER, with_test=True)
    code, out, err = rebase(capsys, RELEASE, OLDER)
    assert code == 0, err
    return facts, out


def test_a_rebase_writes_the_since_the_new_pins_sources_decide(checkout, capsys):
    """Pinned older than an `upstream_tests` entry's `since`, a release whose
    sources have the file needs that `since`: the rebase onto it, whose
    sources are then cached, writes it into that entry (every other byte
    kept) and says so; a problem TO's sources do not decide (entry 2) is
    left to `lint`."""
    text = (
        "# the harness's tests\n"
        "upstream_tests = [\n"
        f'  {{ path = "{FACTS_TEST}", since = "{RELEASE}" }},  # kept\n'
        '  { path = "tests/other_test.py", since = "9.8.5" },\n'
        "]\n"
    )
    facts, out = rebase_onto_older(checkout, capsys, text)
    assert (
        f"facts    {facts}: upstream_tests entry 1 ({FACTS_TEST}, since {RELEASE}): "
        f'vLLM {OLDER}\'s sources have it: wrote since = "{OLDER}"\n'
    ) in out
    assert "entry 2" not in out
    assert "needs these" not in out
    assert facts.read_text() == text.replace(
        f'since = "{RELEASE}" }},  # kept', f'since = "{OLDER}" }},  # kept'
    )
    problems = lint(checkout.patches)
    assert not any("upstream_tests entry 1" in problem for problem in problems)
    assert any("upstream_tests entry 2" in problem for problem in problems)


def test_a_rebase_names_what_the_new_pins_sources_do_not_decide(checkout, capsys):
    """TO's sources lack a file its entry's `since` says TO has (removed or
    renamed upstream): which `since`, or which file, only the maintainer can
    tell, so the rebase names it and writes nothing."""
    facts = release_facts(checkout, RELEASE)
    pin_target(checkout, drifted())
    committed(checkout)
    cache_release_sources(checkout, TO, with_test=False)
    before = facts.read_text()
    code, out, err = rebase(capsys, RELEASE, TO)
    assert code == 0, err
    assert (
        f"facts    {facts}: upstream_tests entry 1 ({FACTS_TEST}, since {RELEASE}): "
        f"vLLM {TO}'s sources lack it and no later pinned release's sources"
    ) in out
    assert (
        f"facts    vLLM {TO} needs these in the release facts before committing; "
        "`vllm-overlay lint` fails until then\n"
    ) in out
    assert facts.read_text() == before


def test_a_since_it_cannot_write_on_one_line_is_named_not_written(checkout, capsys):
    """An entry written as a table of several lines is not the file's form:
    the rebase says to write the `since` by hand and leaves the file as it
    was."""
    before = f'[[upstream_tests]]\npath = "{FACTS_TEST}"\nsince = "{RELEASE}"\n'
    facts, out = rebase_onto_older(checkout, capsys, before)
    assert (
        f'facts    {facts}: cannot write since = "{OLDER}" into upstream_tests '
        f"entry 1 ({FACTS_TEST}, since {RELEASE}), which must be one line holding "
        "its path and since; write it by hand\n"
    ) in out
    assert facts.read_text() == before


@pytest.mark.parametrize(
    ("with_test", "said"),
    [
        (False, f"facts    the release facts' upstream_tests fit vLLM {OLDER}'s"),
        (None, f"facts    not checked: vLLM {OLDER}'s sources are not cached"),
    ],
)
def test_a_rebase_says_when_the_release_facts_fit_or_were_not_checked(
    checkout, capsys, with_test, said
):
    release_facts(checkout, RELEASE)
    pin_target(checkout, drifted(), version=OLDER)
    committed(checkout)
    if with_test is not None:
        cache_release_sources(checkout, OLDER, with_test=with_test)
    code, out, err = rebase(capsys, RELEASE, OLDER)
    assert code == 0, err
    assert said in out


def test_a_rebase_names_the_nixl_the_new_release_pins(checkout, capsys):
    """A release's sources pin a NIXL (requirements/kv_connectors*.txt) that
    its test environment may not take (0.33.0 refused 1.4.1, 0.34.0 pins a
    1.5.2 PyPI cannot install): the rebase names both, for the maintainer
    to decide."""
    release_facts(checkout, RELEASE)
    pin_target(checkout, drifted(), version=OLDER)
    committed(checkout)
    sources = cache_release_sources(checkout, OLDER, with_test=False)
    (sources / "requirements").mkdir()
    (sources / "requirements" / "kv_connectors.txt").write_text(
        "# NIXL\nlmcache >= 0.3\nnixl == 1.5.2  # for P/D\n"
    )
    code, out, err = rebase(capsys, RELEASE, OLDER)
    assert code == 0, err
    assert (
        f"facts    vLLM {OLDER} pins nixl==1.5.2 (requirements/kv_connectors.txt:3);"
    ) in out


def test_a_forward_rebase_says_nothing_of_backports(checkout, capsys):
    pin_target(checkout, drifted())
    committed(checkout)
    assert "backport" not in rebase(capsys, RELEASE, TO)[2]


OTHER_PROBE = "tests/probes/test_other.py::test_other"


@dataclass
class FakeProbeRuns:
    """What the fake probe runner was asked, and what it answers."""

    outcomes: dict[str, str] = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)


@pytest.fixture
def probe_env(monkeypatch, checkout) -> FakeProbeRuns:
    """Stands for TO's cached test environment holding a patched build of TO
    (`probing.env_python` finds it) and for the one pytest process
    `probing.run_probes` starts there, whose plugin serves TO's files patched
    by the checkout's TO series: records each run (and the TO series on disk
    at that moment) and answers each probe with `outcomes` (default passed)."""
    fake = FakeProbeRuns()

    def run_probes(probes, release, python, repo, plugin, env=None):
        fake.runs.append(
            {
                "probes": list(probes),
                "release": release,
                "python": python,
                "repo": repo,
                "plugin": plugin,
                "env": dict(env or {}),
                "series": [p.name for p in release_series(TO).patches],
            }
        )
        return {probe: fake.outcomes.get(probe, "passed") for probe in probes}

    monkeypatch.setattr(
        probing, "env_python", lambda release, cache: cache / "envs" / release
    )
    monkeypatch.setattr(probing, "run_probes", run_probes)
    return fake


def with_absorbed_second_patch(checkout) -> None:
    """A second patch (probe `OTHER_PROBE`) that TO already has, beside the
    demo patch, which TO keeps."""
    (checkout.root / "tests" / "probes" / "test_other.py").write_text(
        "def test_other():\n    assert True\n"
    )
    checkout.add_patch(
        "scheduler-other.patch",
        format_patch(
            checkout.workdir,
            {SCHEDULER: scheduler_edit(20, PATCHED_LINE)},
            {SCHEDULER: scheduler_edit(20, PATCHED_LINE).replace("line 30\n", "l30\n")},
            subject="scheduler: other change",
            trailers=TRAILERS.replace(
                "test_demo.py::test_demo", "test_other.py::test_other"
            ),
        ),
    )
    pin_target(checkout, SCHEDULER_SOURCE.replace("line 30\n", "l30\n"))
    committed(checkout)


def test_rebase_runs_both_series_probes_on_the_rebased_sources(
    checkout, probe_env, capsys
):
    with_absorbed_second_patch(checkout)
    probe_env.outcomes[DEMO_PROBE] = "failed"
    code, out, err = rebase(capsys, RELEASE, TO)
    assert code == 1, err
    assert "dropped  scheduler-other.patch: reverse-applies" in out
    assert f"wrote {target_dir(checkout)}" in out
    assert f"probes   {PATCH}: fail: test_demo.py::test_demo failed" in out
    assert (
        f"probes   test_other.py::test_other passed: cited by no patch of {TO} "
        f"(in {RELEASE}: scheduler-other.patch)"
    ) in out
    assert f"1 probe(s) do not pass on vLLM {TO} patched by the new series" in err
    (run,) = probe_env.runs
    assert run["probes"] == [DEMO_PROBE, OTHER_PROBE]
    assert run["plugin"] == probing.WORKTREE_PLUGIN == "vllm_overlay.testing.worktree"
    assert run["env"] == {"VLLM_OVERLAY_PATCHES": str(checkout.patches)}
    assert (run["repo"], run["series"]) == (checkout.root, [PATCH])
    assert run["python"] == checkout.cache / "envs" / TO
    assert release_series(TO).patches[0].name == PATCH


def test_an_uncited_probe_that_fails_fails_the_rebase(checkout, probe_env, capsys):
    with_absorbed_second_patch(checkout)
    probe_env.outcomes[OTHER_PROBE] = "error"
    code, out, _ = rebase(capsys, RELEASE, TO)
    assert code == 1
    assert f"probes   {PATCH}: pass" in out
    assert "probes   test_other.py::test_other error: cited by no patch" in out


def test_passing_probes_pass_the_rebase(checkout, probe_env, capsys):
    pin_target(checkout, drifted())
    committed(checkout)
    code, out, err = rebase(capsys, RELEASE, TO)
    assert code == 0, err
    assert out.splitlines()[-1] == f"probes   {PATCH}: pass"
    assert [run["probes"] for run in probe_env.runs] == [[DEMO_PROBE]]


def test_probes_run_after_continue(checkout, probe_env, capsys):
    conflicting(checkout)
    rebase(capsys, RELEASE, TO)
    assert probe_env.runs == []
    (repo_of(checkout) / SCHEDULER).write_text(scheduler_edit(20, "resolved"))
    run_git(repo_of(checkout), "add", SCHEDULER)
    probe_env.outcomes[DEMO_PROBE] = "failed"
    code, out, _ = rebase(capsys, "--continue")
    assert code == 1
    assert f"probes   {PATCH}: fail: test_demo.py::test_demo failed" in out
    assert [run["series"] for run in probe_env.runs] == [[PATCH]]


def test_without_an_environment_the_probe_check_is_skipped(checkout, capsys):
    pin_target(checkout, drifted())
    committed(checkout)
    code, out, _ = rebase(capsys, RELEASE, TO)
    assert code == 0
    assert out.splitlines()[-1] == (
        f"probes   skipped: vLLM {TO} has no cached test environment holding its "
        f"build; `tools/test.sh {TO}` builds one and runs every test under "
        "tests/probes/ on the new series"
    )


def to_environment(checkout, tmp_path) -> None:
    """`envs/TO/bin/python`: this interpreter with a `vllm` whose manifest says
    it is a patched build of TO from TO's pinned wheel, as `tools/test.sh TO`
    leaves it. Its scheduler is TO's own file, so the probe (which reads the
    scheduler it imports) sees the patched line only where the worktree plugin
    serves the new TO series."""
    site = tmp_path / "site-to"
    (site / SCHEDULER).parent.mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / SCHEDULER).write_text(drifted())
    wheel = checkout.cache / "wheels" / f"vllm-{TO}-cp38-abi3-linux_x86_64.whl"
    manifest = {
        "format": MANIFEST_FORMAT,
        "release": TO,
        "source": {"filename": wheel.name, "sha256": sha256_file(wheel)},
        "patches": [{"name": PATCH, "files": [SCHEDULER]}],
    }
    (site / MANIFEST_PATH).write_text(json.dumps(manifest))
    python = checkout.cache / "envs" / TO / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH:{site}" exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    (checkout.root / "tests" / "probes" / "test_demo.py").write_text(DEMO_PROBE_SOURCE)


def test_probes_really_run_on_to_patched_by_the_new_series(checkout, tmp_path, capsys):
    pin_target(checkout, drifted())
    to_environment(checkout, tmp_path)
    committed(checkout)
    code, out, err = rebase(capsys, RELEASE, TO)
    assert code == 0, err
    assert out.splitlines()[-1] == f"probes   {PATCH}: pass"
    assert f"running 1 probes on vLLM {TO} patched by the new series" in err


def test_a_resolution_that_loses_the_change_fails_its_probe(checkout, tmp_path, capsys):
    conflicting(checkout)
    to_environment(checkout, tmp_path)
    committed(checkout)
    rebase(capsys, RELEASE, TO)
    (repo_of(checkout) / SCHEDULER).write_text(scheduler_edit(20, "line 20, merged"))
    run_git(repo_of(checkout), "add", SCHEDULER)
    code, out, _ = rebase(capsys, "--continue")
    assert code == 1
    assert f"kept     {PATCH}" in out
    assert out.splitlines()[-1] == (
        f"probes   {PATCH}: fail: test_demo.py::test_demo failed"
    )


def test_a_rebase_onto_a_git_commit_writes_the_named_directory(
    checkout, tmp_path, capsys
):
    """FROM's series replayed onto a commit of a vLLM clone: written to --out
    as it would be for a release, nothing pinned, the history untouched."""
    clone = make_vllm_clone(tmp_path / "vllm")
    pins_before = (checkout.patches / "vllm" / "releases.toml").read_bytes()
    out = tmp_path / "onto-main"
    code, stdout, err = rebase(
        capsys, RELEASE, "--source", f"{clone}@moved", "--out", str(out)
    )
    assert code == 0, stdout + err
    commit = run_git(clone, "rev-parse", "moved").strip()
    assert f"onto {clone} at moved@{commit[:12]}" in err
    assert f"kept     {PATCH}" in stdout
    assert f"wrote {out} (1 kept, 0 dropped)" in stdout
    assert "probes   not run: a git commit has no test environment" in stdout
    text = (out / PATCH).read_text()
    assert "@@ -20,7 +20,7 @@" in text
    assert (out / "series").read_text().splitlines()[-1] == PATCH
    assert (checkout.patches / "vllm" / "releases.toml").read_bytes() == pins_before
    assert not (checkout.patches / HISTORY_FILE).exists()
    assert not state_dir(checkout.patches).exists()


def test_a_rebase_onto_a_commit_that_absorbed_the_patch_drops_it(
    checkout, tmp_path, capsys
):
    """The reason names the commit that has the change, not the release
    whose backports it holds."""
    clone = make_vllm_clone(tmp_path / "vllm")
    out = tmp_path / "onto-main"
    code, stdout, _ = rebase(
        capsys, RELEASE, "--source", f"{clone}@absorbed", "--out", str(out)
    )
    assert code == 0
    commit = run_git(clone, "rev-parse", "absorbed").strip()
    assert (
        f"dropped  {PATCH}: reverse-applies: vLLM absorbed@{commit[:12]} already "
        "has the change"
    ) in stdout
    assert not (out / PATCH).exists()
    assert not (checkout.patches / HISTORY_FILE).exists()


def test_a_commit_that_merges_the_patch_to_nothing_is_named(checkout, tmp_path, capsys):
    clone = make_vllm_clone(tmp_path / "vllm")
    upstream = scheduler_edit(20, PATCHED_LINE).replace("line 17\n", "line 17 new\n")
    (clone / SCHEDULER).write_text(upstream)
    run_git(clone, "commit", "-qam", "absorbed beside other edits")
    commit = run_git(clone, "rev-parse", "main").strip()
    out = tmp_path / "onto-main"
    code, stdout, _ = rebase(
        capsys, RELEASE, "--source", f"{clone}@main", "--out", str(out)
    )
    assert code == 0
    assert (
        f"dropped  {PATCH}: empty after a 3-way merge: vLLM main@{commit[:12]} "
        "already has the change"
    ) in stdout


def test_a_rebase_onto_a_git_commit_stops_at_a_conflict_and_resumes(
    checkout, tmp_path, capsys
):
    clone = make_vllm_clone(tmp_path / "vllm")
    (clone / SCHEDULER).write_text(scheduler_edit(20, "line twenty, upstream"))
    run_git(clone, "commit", "-qam", "clash")
    out = tmp_path / "onto-main"
    code, stdout, err = rebase(
        capsys, RELEASE, "--source", f"{clone}@main", "--out", str(out)
    )
    assert code == 1
    assert f"stopped  {PATCH}: merge conflict" in stdout
    assert "does not merge onto vLLM main@" in err
    assert "recorded in the history" not in err
    assert (
        "`vllm-overlay rebase --skip` to leave the patch out of the series "
        "written to --out (a rebase onto a git commit records nothing in the "
        "history)"
    ) in " ".join(err.split())
    assert not out.exists()
    repo = state_dir(checkout.patches) / "repo"
    (repo / SCHEDULER).write_text(scheduler_edit(20, PATCHED_LINE))
    run_git(repo, "add", SCHEDULER)
    code, stdout, _ = rebase(capsys, "--continue")
    assert code == 0, stdout
    assert f"wrote {out} (1 kept, 0 dropped)" in stdout
    assert PATCHED_LINE in (out / PATCH).read_text()


def test_skip_at_a_conflict_on_a_git_commit_records_nothing(checkout, tmp_path, capsys):
    clone = make_vllm_clone(tmp_path / "vllm")
    (clone / SCHEDULER).write_text(scheduler_edit(20, "line twenty, upstream"))
    run_git(clone, "commit", "-qam", "clash")
    out = tmp_path / "onto-main"
    assert rebase(capsys, RELEASE, "--source", str(clone), "--out", str(out))[0] == 1
    code, stdout, _ = rebase(capsys, "--skip")
    assert code == 0, stdout
    assert f"dropped  {PATCH}: skipped by the maintainer" in stdout
    assert f"wrote {out} (0 kept, 1 dropped)" in stdout
    assert not (checkout.patches / HISTORY_FILE).exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--source", "{clone}", "--ref", "main"], "`--source PATH@REF`"),
        (["--source", "{clone}"], "needs both --source and --out"),
        (["--out", "{out}"], "needs both --source and --out"),
        ([RELEASE, TO, "--source", "{clone}", "--out", "{out}"], "needs FROM only"),
        (["--continue", "--source", "{clone}"], "take no --source or --out"),
        ([RELEASE, "--source", "{clone}@nothing", "--out", "{out}"], "names no commit"),
        ([RELEASE, "--source", "{clone}", "--out", "{clone}"], "exists; --out names"),
    ],
)
def test_bad_source_rebases_are_refused(checkout, tmp_path, capsys, argv, message):
    names = {
        "clone": str(make_vllm_clone(tmp_path / "vllm")),
        "out": str(tmp_path / "o"),
    }
    code, out, err = rebase(capsys, *(a.format(**names) for a in argv))
    assert (code, out) == (1, "")
    assert message in err
    assert not state_dir(checkout.patches).exists()
