"""`vllm_overlay.common.atomic`: a reader sees the old content or the new, whole."""

import pytest

from vllm_overlay.common import atomic


def test_a_failed_write_keeps_the_old_file_and_leaves_no_scratch(tmp_path):
    target = tmp_path / "pins.toml"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic.replacing(target) as scratch:
        scratch.write_text("half of the new")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pins.toml"]


def test_a_write_replaces_the_file(tmp_path):
    target = tmp_path / "verdicts.toml"
    target.write_text("old\n")
    atomic.write_text(target, "new\n")
    atomic.write_bytes(tmp_path / "data", b"\x00\x01")
    assert target.read_text() == "new\n"
    assert (tmp_path / "data").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "verdicts.toml"]


def test_replace_dir_swaps_the_whole_directory(tmp_path):
    target, staging = tmp_path / "v0.32.0", tmp_path / "staging"
    target.mkdir()
    (target / "gone.patch").write_text("old")
    staging.mkdir()
    (staging / "new.patch").write_text("new")
    atomic.replace_dir(staging, target)
    assert [p.name for p in target.iterdir()] == ["new.patch"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v0.32.0"]


def test_replace_dir_restores_the_old_directory_when_the_swap_fails(tmp_path):
    target = tmp_path / "v0.32.0"
    target.mkdir()
    (target / "kept.patch").write_text("old")
    with pytest.raises(OSError):
        atomic.replace_dir(tmp_path / "no-such-staging", target)
    assert [p.name for p in target.iterdir()] == ["kept.patch"]
