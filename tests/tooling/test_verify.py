"""`vllm-overlay verify WHEEL`: a patched wheel against its rebuild from the
pinned upstream wheel and this checkout's series, compared byte for byte."""

import shutil
import zipfile

import pytest
from conftest import RELEASE, SCHEDULER, install_into, refusal, run_cli

from vllm_overlay.series.loader import release_series
from vllm_overlay.wheel.builder import build_release

PATCHED = f"vllm-{RELEASE}+hybridkv.1-cp38-abi3-linux_x86_64.whl"


@pytest.fixture
def built(project, capsys, tmp_path):
    """The demo release's patched wheel, its series recorded for revision 1
    (as every committed series is)."""
    assert run_cli(capsys, "pin", "--bump", RELEASE)[0] == 0
    return build_release(release_series(None), "vllm", tmp_path / "dist")


def rewritten(wheel, tmp_path, edit) -> object:
    """A copy of `wheel` under its own name, each member passed through
    `edit(name, data)` (None drops it)."""
    out = tmp_path / "changed" / wheel.name
    out.parent.mkdir()
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = edit(info.filename, src.read(info.filename))
            if data is not None:
                dst.writestr(info, data)
    return out


def test_a_wheel_rebuilt_the_same_is_identical_and_its_sha256_printed(built, capsys):
    code, out, err = run_cli(capsys, "verify", str(built))
    assert code == 0, err
    assert f"{built}: identical to its rebuild here from vLLM {RELEASE}'s vllm" in out
    assert "patched by revision 1 of this vllm-overlay's series" in out
    assert out.splitlines()[-1].startswith("sha256 ")


def test_every_member_that_differs_is_named(built, capsys, tmp_path):
    def edit(name, data):
        if name == SCHEDULER:
            return data.replace(b"patched", b"tampered")
        return None if name == "vllm/_C.abi3.so" else data

    code, out, _ = run_cli(capsys, "verify", str(rewritten(built, tmp_path, edit)))
    assert code == 1
    assert f"  {SCHEDULER}: differs\n" in out
    assert "  vllm/_C.abi3.so: missing\n" in out


def test_an_archive_with_the_same_members_is_not_called_identical(
    built, capsys, tmp_path
):
    recompressed = tmp_path / "recompressed" / built.name
    recompressed.parent.mkdir()
    with (
        zipfile.ZipFile(built) as src,
        zipfile.ZipFile(recompressed, "w", zipfile.ZIP_STORED) as dst,
    ):
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    code, out, _ = run_cli(capsys, "verify", str(recompressed))
    assert code == 1
    assert "every member is the same; the archive's own bytes differ" in out


@pytest.mark.parametrize(
    ("name", "said"),
    [
        (f"vllm-{RELEASE}-cp38-abi3-linux_x86_64.whl", "is not a patched build"),
        (f"other-{RELEASE}+hybridkv.1-py3-none-any.whl", "is not a patched build"),
        (f"vllm-{RELEASE}+hybridkv.7-cp38-abi3-linux_x86_64.whl", "is revision 7"),
        ("vllm-1.2.3+hybridkv.1-cp38-abi3-linux_x86_64.whl", "1.2.3 is not pinned"),
        ("not-a-wheel.zip", "is not a wheel's file name"),
    ],
)
def test_what_cannot_be_compared_is_refused_in_one_line(
    built, capsys, tmp_path, name, said
):
    other = tmp_path / name
    shutil.copy(built, other)
    assert said in refusal(capsys, "verify", str(other))


def test_a_series_changed_since_its_revision_is_refused(built, project, capsys):
    patch = project.series_dir / "scheduler-demo.patch"
    patch.write_text(patch.read_text().replace("\nWhy.\n", "\nWhy, changed.\n"))
    assert "is not the one recorded for revision 1" in refusal(
        capsys, "verify", str(built)
    )


def test_a_missing_wheel_is_refused(project, capsys, tmp_path):
    assert "is not a file" in refusal(capsys, "verify", str(tmp_path / PATCHED))


def test_the_installed_files_of_a_patched_build_are_checked(
    built, capsys, tmp_path, monkeypatch
):
    site = tmp_path / "site"
    install_into(built, site, monkeypatch)
    code, out, err = run_cli(capsys, "verify", "--installed")
    assert code == 0, err
    assert "identical to its rebuild here from vLLM" in out
    (site / SCHEDULER).write_text("edited\n")
    (site / "vllm" / "_C.abi3.so").unlink()
    code, out, _ = run_cli(capsys, "verify", "--installed")
    assert code == 1
    assert f"  {SCHEDULER}: differs\n" in out
    assert "  vllm/_C.abi3.so: missing\n" in out


def test_verify_takes_a_wheel_or_the_installed_vllm(project, capsys):
    assert "one of the arguments WHEEL --installed is required" in refusal(
        capsys, "verify"
    )


def test_an_installed_upstream_build_is_not_a_patched_one(
    project, capsys, tmp_path, monkeypatch
):
    upstream = project.cache / "wheels" / f"vllm-{RELEASE}-cp38-abi3-linux_x86_64.whl"
    install_into(upstream, tmp_path / "site", monkeypatch)
    assert "carries no series: it is not a patched build" in refusal(
        capsys, "verify", "--installed"
    )
