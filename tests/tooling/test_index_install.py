"""`ci/suites/index_install.py`'s new virtualenv: it sees the release environment's
dependency layer without vLLM, and pip in it never writes into that layer
(the suite's install from the index runs in the CPU suite, for 0.32.0)."""

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

import pip

from ci.suites import index_install
from vllm_overlay.series.loader import release_series

VERSION_DIR = f"python{sys.version_info.major}.{sys.version_info.minor}"


def fake_release_env(base: Path) -> Path:
    """A release environment's shape: its Python and a site-packages with a
    dependency (`demo` 1.0), vLLM and vllm-overlay."""
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "python").symlink_to(sys.executable)
    site = base / "lib" / VERSION_DIR / "site-packages"
    files = {
        "demo/__init__.py": "VERSION = '1.0'\n",
        "demo-1.0.dist-info/METADATA": "Name: demo\nVersion: 1.0\n",
        "demo-1.0.dist-info/RECORD": "demo/__init__.py,,\n",
        "demo-1.0.dist-info/INSTALLER": "pip\n",
        "vllm/__init__.py": "",
        "vllm-0.32.0+cpu.hybridkv.1.dist-info/METADATA": "Name: vllm\n",
        "vllm_overlay/__init__.py": "",
        "vllm_overlay-0.2.0.dist-info/METADATA": "Name: vllm-overlay\n",
    }
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    # The new environment runs the layer's pip, as it runs the release's.
    pip_dir = Path(pip.__file__).parent
    for entry in [pip_dir, *pip_dir.parent.glob("pip-*.dist-info")]:
        (site / entry.name).symlink_to(entry)
    return site


def demo_wheel(folder: Path) -> Path:
    wheel = folder / "demo-2.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo/__init__.py", "VERSION = '2.0'\n")
        archive.writestr(
            "demo-2.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: demo\nVersion: 2.0\n",
        )
        archive.writestr(
            "demo-2.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr("demo-2.0.dist-info/RECORD", "")
    return wheel


def snapshot(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_new_env_sees_the_layer_without_vllm_and_never_writes_into_it(tmp_path):
    site = fake_release_env(tmp_path / "base")
    before = snapshot(site)
    venv = index_install._new_env(tmp_path, tmp_path / "base")
    layer = sorted(p.name for p in (tmp_path / "layer").iterdir())
    assert [name for name in layer if not name.startswith("pip")] == [
        "demo",
        "demo-1.0.dist-info",
    ]
    python = str(venv / "bin" / "python")
    probe = (
        "import importlib.util as u, importlib.metadata as m, demo;"
        "print(demo.VERSION, m.version('demo'), u.find_spec('vllm'))"
    )
    seen = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    assert seen.stdout.split() == ["1.0", "1.0", "None"], seen.stderr
    pip = [python, "-m", "pip", "--isolated", "--disable-pip-version-check"]
    installed = subprocess.run(
        [*pip, "install", "--no-index", str(demo_wheel(tmp_path))],
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, installed.stderr
    assert "outside environment" in installed.stdout
    seen = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    assert seen.stdout.split() == ["2.0", "2.0", "None"]
    assert snapshot(site) == before


def test_a_wheel_that_is_not_the_build_is_one_failure(tmp_path, capsys):
    series = release_series(index_install.RELEASE)
    wheel = tmp_path / "vllm-0.32.0+hybridkv.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    failures = index_install.index_install_failures(series, wheel, tmp_path)
    version = series.build_version(index_install.DIST)
    assert failures == [
        f"install from the index: {wheel.name} is not the {version} build"
    ]
    assert "install from the index: FAILED" in capsys.readouterr().out


def test_the_cpu_incompatible_requirements_get_metadata_only_stand_ins(tmp_path):
    layer = tmp_path / "layer"
    (layer / "torch-2.13.0+cpu.dist-info").mkdir(parents=True)
    (layer / "torch-2.13.0+cpu.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n"
    )
    wheel = tmp_path / "vllm-0.32.0+cpu.hybridkv.1-py3-none-any.whl"
    requires = [
        "torch==2.13.0+cpu",
        'torchaudio; platform_machine != "s390x"',
        "torchcodec>=0.14",
        'torchaudio-extra; extra == "audio"',
        "numpy",
    ]
    metadata = "Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu.hybridkv.1\n"
    metadata += "".join(f"Requires-Dist: {line}\n" for line in requires)
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm-0.32.0+cpu.hybridkv.1.dist-info/METADATA", metadata)
    assert index_install._stand_in_absent(layer, wheel) == ["torchaudio", "torchcodec"]
    found = {
        dist.metadata["Name"]: dist.version
        for dist in importlib.metadata.distributions(path=[str(layer)])
    }
    assert found == {
        "torch": "2.13.0+cpu",
        "torchaudio": "0+standin",
        "torchcodec": "0.14+standin",
    }
    assert not (layer / "torchaudio").exists()
