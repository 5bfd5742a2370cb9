"""Environments layered over a release's test environment: a fresh
virtualenv of its Python whose site-packages names the release
environment's (a `.pth` file, read after its own), so that what the layer
installs (an earlier build of the release, a variant a benchmark measures)
shadows the release's build and everything else is shared. It costs a
virtualenv and a `pip install --no-deps`, seconds, where a second test
environment costs gigabytes and minutes."""

import subprocess
from pathlib import Path

from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import cache_root

# The `.pth` file of a layered environment that names the release's packages.
RELEASE_PTH = "release-env.pth"


def layered_env(release: str, name: str) -> tuple[Path, Path]:
    """A fresh layered environment `name` of `release`: the environment
    and its own site-packages, where what the layer adds goes."""
    release_env = cache_layout.release_env(cache_root(), release)
    release_python = release_env / "bin" / "python"
    if not release_python.is_file():
        raise OverlayError(
            f"no test environment at {release_env}: run tools/test.sh {release}"
        )
    env = cache_layout.layered_env(cache_root(), release, name)
    subprocess.run([str(release_python), "-m", "venv", "--clear", str(env)], check=True)
    [own_site] = (env / "lib").glob("python3*/site-packages")
    [release_site] = (release_env / "lib").glob("python3*/site-packages")
    (own_site / RELEASE_PTH).write_text(f"{release_site}\n")
    return env, own_site


def wheel_env(release: str, wheel: Path, name: str) -> Path:
    """A layered environment `name` that runs `wheel` (a build of `release`)
    on the release environment's packages, with only the wheel installed in
    its own."""
    if not wheel.is_file():
        raise OverlayError(f"{wheel} is not a file")
    env, _ = layered_env(release, name)
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    # --ignore-installed: the release environment, which the .pth file shows,
    # may hold the same version (its files edited in place), and pip would
    # take that for this one.
    subprocess.run([*pip, "--no-deps", "--ignore-installed", str(wheel)], check=True)
    return env
