"""`vllm-overlay extract`: one patch as an upstream contribution, from the
synthetic release; the probe check runs in a fake release environment."""

import subprocess
from pathlib import Path

import pytest
from conftest import (
    PATCHED,
    RELEASE,
    SCHEDULER,
    SCHEDULER_SOURCE,
    fake_release_env,
    format_patch,
    run_cli,
)

PATCH = "scheduler-demo.patch"
PACKAGE = "tests/v1/core/scheduler_demo"
SIGNOFF = "Signed-off-by: Ann Maintainer <ann@example.invalid>"
PROBE_CONFTEST = """import importlib.util
from pathlib import Path

import pytest


@pytest.fixture
def scheduler_text():
    spec = importlib.util.find_spec("vllm.v1.core.sched.scheduler")
    return Path(spec.origin).read_text()


@pytest.fixture
def unused_fixture():
    return 1
"""
PROBE = """from demo_helper import PATCHED_LINE


def test_demo(scheduler_text):
    assert PATCHED_LINE in scheduler_text
"""


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
    description = (directory / "PR.md").read_text()
    assert description.startswith("# scheduler: demo change\n")
    assert "## Motivation\n\nWhy.\n" in description
    assert (
        "## Summary\n\nScheduler: demo change. Changes "
        f"`{SCHEDULER}`; adds the tests in `{PACKAGE}/`.\n"
    ) in description
    assert f"```bash\npytest {PACKAGE} -v\n```" in description
    assert f"- `{PACKAGE}/test_demo.py::test_demo`" in description
    assert "fail on vLLM 9.9.0 without this change" in description


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
    assert test.startswith("from .demo_helper import")


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


def test_patch_needing_an_earlier_one_is_refused(ready, tmp_path, capsys):
    ready.add_patch(
        "scheduler-follow-up.patch",
        format_patch(
            ready.workdir,
            {SCHEDULER: PATCHED},
            {SCHEDULER: PATCHED.replace(", patched\n", ", patched twice\n")},
            subject="scheduler: follow-up",
        ),
    )
    code, out, err = run_cli(
        capsys, "extract", "scheduler-follow-up", "--out", str(tmp_path / "out")
    )
    assert (code, out) == (1, "")
    assert "without the patches before it (scheduler-demo.patch)" in err


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
