"""`vllm-overlay extract`: one patch as an upstream contribution, from the
synthetic release; the probe check runs in a fake release environment."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    PATCHED,
    RELEASE,
    SCHEDULER,
    SCHEDULER_SOURCE,
    TRAILERS,
    fake_release_env,
    format_patch,
    run_cli,
)

from vllm_overlay.common.locations import cache_root

PATCH = "scheduler-demo.patch"
PACKAGE = "tests/v1/core/scheduler_demo"
SIGNOFF = "Signed-off-by: Ann Maintainer <ann@example.invalid>"
PROBE_CONFTEST = """import importlib.util
import os
from pathlib import Path, PurePath

import pytest


@pytest.fixture
def scheduler_text():
    spec = importlib.util.find_spec("vllm.v1.core.sched.scheduler")
    return Path(spec.origin).read_text()


@pytest.fixture
def unused_fixture():
    return os.sep, PurePath()
"""
PROBE = '''"""Probe: the demo line is patched."""

import pytest
from demo_helper import PATCHED_LINE


# The probes read the installed file.
def test_demo(scheduler_text):
    assert PATCHED_LINE in scheduler_text


@pytest.mark.parametrize("line", [PATCHED_LINE])
def test_twice(scheduler_text, line):
    assert line + " twice" in scheduler_text
'''
SPDX = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def identity(tmp_path, monkeypatch) -> Path:
    config = tmp_path / "gitconfig"
    config.write_text(
        "[user]\n\tname = Ann Maintainer\n\temail = ann@example.invalid\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    return config


@pytest.fixture
def ready(project, tmp_path, identity):
    """A release environment for the probe check, the pinned sdist in the
    cache, and a probe with a helper module and a conftest fixture."""
    fake_release_env(project, tmp_path)
    probes = project.root / "tests" / "probes"
    (probes / "conftest.py").write_text(PROBE_CONFTEST)
    (probes / "demo_helper.py").write_text('PATCHED_LINE = "line twenty, patched"\n')
    (probes / "test_demo.py").write_text(PROBE)
    sdist = project.cache / "sources" / f"vllm-{RELEASE}"
    for package in ("tests", "tests/v1", "tests/v1/core", "tests/v1/metrics"):
        (sdist / package).mkdir(parents=True, exist_ok=True)
        (sdist / package / "__init__.py").write_text("")
    (sdist / "tests/v1/core/test_sched.py").write_text(
        "from vllm.v1.core.sched.scheduler import Scheduler\n"
    )
    (sdist / "tests/v1/metrics/test_stats.py").write_text("import vllm.v1.metrics\n")
    (sdist / ".vllm-overlay-sdist-sha256").write_text("0" * 64)
    return project


def extract(capsys, tmp_path, *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "extract", PATCH, "--out", str(tmp_path / "out"), *argv)


def test_mbox_and_description(ready, tmp_path, capsys):
    code, out, err = extract(capsys, tmp_path)
    assert code == 0, err
    directory = tmp_path / "out" / "scheduler-demo"
    assert str(directory) in out
    mbox = (directory / "scheduler-demo.mbox").read_text()
    assert SIGNOFF in mbox
    for trailer in ("Upstream-Status:", "Upstream-PR:", "Drop-When:", "Probe:"):
        assert trailer not in mbox
    assert "+line twenty, patched" in mbox
    for name in ("__init__.py", "conftest.py", "demo_helper.py", "test_demo.py"):
        assert f"b/{PACKAGE}/{name}" in mbox
    assert "+from .demo_helper import PATCHED_LINE" in mbox
    assert "+def scheduler_text():" in mbox
    assert "unused_fixture" not in mbox
    # only the left-out fixture used these
    assert "+import os\n" not in mbox and "PurePath" not in mbox
    assert "+from pathlib import Path\n" in mbox
    # our words are upstream's there: no `Probe:` label, tests not probes
    assert '+"""The demo line is patched."""' in mbox
    assert "+# The tests read the installed file." in mbox
    assert "Probe" not in mbox and "probe" not in mbox.replace("tests/probes", "")
    assert "+def test_twice(" in mbox  # cited by no patch: kept

    description = (directory / "PR.md").read_text()
    assert description.startswith("# scheduler: demo change\n")
    assert description.index("## Purpose") < description.index("## Test Plan")
    assert description.index("## Test Plan") < description.index("## Test Result")
    assert (
        "## Purpose\n\nScheduler: demo change. Changes "
        f"`{SCHEDULER}`; adds the tests in `{PACKAGE}/`.\n"
    ) in description
    assert "\nWhy.\n" in description
    assert f"based on vLLM v9.9.0:\n\n```bash\npytest {PACKAGE} -v\n```" in description
    assert f"- `{PACKAGE}/test_demo.py::test_demo`: failed" in description
    for jargon in ("Probe", "probe", "overlay", "with the patch", "series"):
        assert jargon not in description


def vllm_checkout(tmp_path: Path, scheduler: str = SCHEDULER_SOURCE) -> Path:
    repo = tmp_path / "vllm-checkout"
    (repo / SCHEDULER).parent.mkdir(parents=True)
    (repo / SCHEDULER).write_text(scheduler)
    (repo / "tests" / "v1" / "core").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "upstream")
    return repo


def test_branch_in_a_vllm_checkout(ready, tmp_path, capsys):
    repo = vllm_checkout(tmp_path)
    code, out, err = extract(capsys, tmp_path, "--repo", str(repo))
    assert code == 0, err
    assert "branch overlay/scheduler-demo" in out
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    message = git(repo, "log", "-1", "--format=%B", "overlay/scheduler-demo")
    assert message.startswith("scheduler: demo change\n\nWhy.\n\n" + SIGNOFF)
    assert git(repo, "show", f"overlay/scheduler-demo:{SCHEDULER}") == PATCHED
    test = git(repo, "show", f"overlay/scheduler-demo:{PACKAGE}/test_demo.py")
    assert test.startswith(SPDX)
    assert "\nfrom .demo_helper import PATCHED_LINE\n" in test


def test_failed_apply_leaves_the_checkout_as_it_was(ready, tmp_path, capsys):
    repo = vllm_checkout(tmp_path, SCHEDULER_SOURCE.replace("line 20\n", "moved\n"))
    code, _, err = extract(capsys, tmp_path, "--repo", str(repo))
    assert code == 1
    # git's cause, not its closing hint about an `am` already aborted
    assert "does not apply to" in err
    assert "sha1 information is lacking or useless" in err
    assert "could not build fake ancestor" in err
    assert "hint" not in err and "--show-current-patch" not in err
    assert git(repo, "branch", "--format=%(refname:short)").split() == ["main"]
    assert git(repo, "status", "--porcelain") == ""
    assert not (tmp_path / "out").exists()


def assert_refused(capsys, tmp_path, message: str, *argv: str) -> None:
    code, out, err = extract(capsys, tmp_path, *argv)
    assert (code, out) == (1, "")
    assert message in err, err
    leftovers = (
        list((tmp_path / "out").iterdir()) if (tmp_path / "out").exists() else []
    )
    assert leftovers == []


def test_inappropriate_patch_is_refused(ready, tmp_path, capsys):
    path = ready.series_dir / PATCH
    path.write_text(
        path.read_text().replace(
            "Upstream-Status: Pending", "Upstream-Status: Inappropriate overlay only"
        )
    )
    assert_refused(capsys, tmp_path, "is Upstream-Status: Inappropriate overlay only")


def test_probe_that_passes_on_the_base_is_refused(ready, tmp_path, capsys):
    (ready.root / "tests" / "probes" / "test_demo.py").write_text(
        "def test_demo():\n    assert True\n"
    )
    assert_refused(
        capsys,
        tmp_path,
        "do not all fail on unpatched vLLM 9.9.0 (upstream-equivalent)",
    )


def test_without_a_release_environment_it_is_refused(
    project, tmp_path, capsys, identity
):
    assert_refused(capsys, tmp_path, "no environment (run tools/test.sh 9.9.0)")


def add_follow_up(project, status: str = "Pending") -> None:
    """A patch that applies only on top of scheduler-demo.patch, with a
    probe of its own in the same module."""
    project.add_patch(
        "scheduler-follow-up.patch",
        format_patch(
            project.workdir,
            {SCHEDULER: PATCHED},
            {SCHEDULER: PATCHED.replace(", patched\n", ", patched twice\n")},
            subject="scheduler: follow-up",
            trailers=TRAILERS.replace("Pending", status).replace(
                "test_demo.py::test_demo", "test_demo.py::test_twice"
            ),
        ),
    )


def test_patch_needing_an_earlier_one_is_sent_as_a_stack(ready, tmp_path, capsys):
    add_follow_up(ready)
    repo = vllm_checkout(tmp_path)
    code, out, err = run_cli(
        capsys,
        *("extract", "scheduler-follow-up", "--out", str(tmp_path / "out")),
        *("--repo", str(repo)),
    )
    assert code == 0, err
    assert "stacked on scheduler-demo.patch" in out
    log = git(repo, "log", "--format=%s", "main..overlay/scheduler-follow-up")
    assert log.split("\n")[:2] == ["scheduler: follow-up", "scheduler: demo change"]
    directory = tmp_path / "out" / "scheduler-follow-up"
    mbox = (directory / "scheduler-follow-up.mbox").read_text()
    assert mbox.count(SIGNOFF) == 2
    # each commit carries its own tests, and only its own
    first = git(repo, "show", f"overlay/scheduler-follow-up~1:{PACKAGE}/test_demo.py")
    assert "def test_demo(" in first and "test_twice" not in first
    follow_up = "tests/v1/core/scheduler_follow_up/test_demo.py"
    second = git(repo, "show", f"overlay/scheduler-follow-up:{follow_up}")
    assert "def test_twice(" in second and "test_demo(" not in second
    description = (directory / "PR.md").read_text()
    assert "**Depends on an earlier change**, included as the first commit" in (
        description
    )
    assert "- scheduler: demo change\n" in description
    assert "scheduler_demo/test_demo.py::test_demo`: failed" in description
    assert "scheduler_follow_up/test_demo.py::test_twice`: failed" in description


def test_stack_refusals_come_before_the_probes(ready, tmp_path, capsys, monkeypatch):
    def no_probes(*args):
        raise AssertionError("the probes ran before the refusal")

    monkeypatch.setattr(
        "vllm_overlay.track.upstreaming.extract.run_pristine", no_probes
    )
    path = ready.series_dir / PATCH
    path.write_text(
        path.read_text().replace(
            "Upstream-Status: Pending", "Upstream-Status: Inappropriate overlay only"
        )
    )
    add_follow_up(ready)
    code, out, err = run_cli(
        capsys, "extract", "scheduler-follow-up", "--out", str(tmp_path / "out")
    )
    assert (code, out) == (1, "")
    assert (
        "scheduler-follow-up.patch applies to pristine vLLM only after "
        "scheduler-demo.patch, which is Upstream-Status: Inappropriate" in err
    )
    assert not (tmp_path / "out").exists()


def test_references_link_to_their_own_projects(ready, tmp_path, capsys):
    sdist = ready.cache / "sources" / f"vllm-{RELEASE}"
    (sdist / SCHEDULER).parent.mkdir(parents=True)
    (sdist / SCHEDULER).write_text(SCHEDULER_SOURCE)
    path = ready.series_dir / PATCH
    path.write_text(
        path.read_text().replace(
            "\n\nWhy.\n",
            "\n\nWhy: LMCache #2863, vllm#40001, #40002, acme/kv#789; see\n"
            "sched/scheduler.py:20 and lmcache/v1/cache.py:3.\n",
        )
    )
    code, _, err = extract(capsys, tmp_path)
    assert code == 0, err
    description = (tmp_path / "out" / "scheduler-demo" / "PR.md").read_text()
    for link in (
        "https://github.com/LMCache/LMCache/pull/2863",
        "https://github.com/vllm-project/vllm/pull/40001",
        "https://github.com/vllm-project/vllm/pull/40002",
        "https://github.com/acme/kv/pull/789",
    ):
        assert f"- {link}\n" in description
    assert "vllm-project/vllm/pull/2863" not in description
    assert (
        "Line numbers in references to vLLM files (`sched/scheduler.py:20`) are "
        "those of vLLM v9.9.0" in description
    )


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda repo: (repo / "dirty.py").write_text(""), "has uncommitted changes"),
        (
            lambda repo: git(repo, "branch", "overlay/scheduler-demo"),
            "already has a branch overlay/scheduler-demo",
        ),
        (lambda repo: git(repo, "rm", "-rq", "vllm"), "is not a vLLM git checkout"),
    ],
    ids=["dirty", "branch-exists", "not-vllm"],
)
def test_unsuitable_checkout_is_refused(ready, tmp_path, capsys, setup, message):
    repo = vllm_checkout(tmp_path)
    setup(repo)
    assert_refused(capsys, tmp_path, message, "--repo", str(repo))


def test_unknown_patch_is_refused(ready, tmp_path, capsys):
    code, _, err = run_cli(capsys, "extract", "nope", "--out", str(tmp_path / "out"))
    assert code == 1
    assert (
        "no patch nope.patch in the vLLM 9.9.0 series (it has: scheduler-demo.patch)"
        in err
    )


def test_existing_output_is_refused(ready, tmp_path, capsys):
    (tmp_path / "out" / "scheduler-demo").mkdir(parents=True)
    code, _, err = extract(capsys, tmp_path)
    assert code == 1
    assert "already exists; remove it first" in err


def test_missing_identity_is_refused(ready, tmp_path, capsys, identity):
    identity.write_text("")
    assert_refused(capsys, tmp_path, "git has no user.name")


def cached_vllm_sources() -> Path | None:
    """The newest release sources in the real cache that hold vLLM's SPDX
    check and ruff config (read only)."""
    found = [
        path
        for path in (cache_root() / "sources").glob("vllm-*")
        if (path / SPDX_CHECK).is_file() and (path / "pyproject.toml").is_file()
    ]
    return max(found, key=lambda p: p.name, default=None)


SPDX_CHECK = "tools/pre_commit/check_spdx_header.py"
VLLM_SOURCES = cached_vllm_sources()


@pytest.mark.skipif(
    VLLM_SOURCES is None,
    reason="no cached vLLM release sources with tools/pre_commit/"
    "check_spdx_header.py (run tools/test.sh RELEASE once)",
)
def test_new_tests_pass_vllms_offline_checks(ready, tmp_path, capsys):
    assert VLLM_SOURCES is not None
    sdist = ready.cache / "sources" / f"vllm-{RELEASE}"
    shutil.copy(VLLM_SOURCES / "pyproject.toml", sdist / "pyproject.toml")
    (sdist / "vllm").mkdir()  # where ruff finds that `vllm` is first-party
    repo = vllm_checkout(tmp_path)
    code, _, err = extract(capsys, tmp_path, "--repo", str(repo))
    assert code == 0, err
    git(repo, "checkout", "-q", "overlay/scheduler-demo")
    files = sorted(str(path) for path in (repo / PACKAGE).glob("*.py"))
    assert len(files) == 4
    config = ("--no-cache", "--config", str(VLLM_SOURCES / "pyproject.toml"))
    for command in (
        [str(VLLM_SOURCES / SPDX_CHECK)],
        ["-m", "ruff", "check", *config],
        ["-m", "ruff", "format", "--check", *config],
    ):
        proc = subprocess.run(
            [sys.executable, *command, *files], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
