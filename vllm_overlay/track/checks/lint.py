"""`vllm-overlay lint`: every defect of every series, in one run.

A registry of rules (`RULES`), like the doctor's: each a function from the
checkout to one-line problems. Besides each series' own files (see
`series.checks.series_problems`), the recorded verdicts and the history of
dropped patches, it checks what ties them to the rest of the checkout:

- every test under `tests/probes/` is the `Probe:` of some patch of some
  series, or is listed in `tests/probes/kept.toml` with the reason it is kept
  without one: a probe nobody cites is usually a change a rebase lost;
- the history only grows: the entries committed at git's HEAD are still there,
  unchanged and first;
- every patch parses as git will apply it (hunk line counts, file headers),
  with no sources: a hand-edited hunk header is found on a fresh clone;
- each pinned release's series applies with zero fuzz and zero offset to the
  release's cached sources, so a corrupted context line is found here rather
  than as an out-of-date `PATCHES.md`, and leaves no module reading a name it
  neither defines nor imports, so a replayed patch that relied on an import of
  its own release is found here rather than minutes into the probes, nor an
  attribute the release defines nowhere while another pinned release does
  (`attributes.py`: code merged onto a release older than the API it reads);
- each series is the one its release's `revision` was recorded for (the
  `series_digest` `vllm-overlay pin --bump` writes), so a changed series
  never reaches a build under the version of the old one;
- the release facts' `upstream_tests` name, as `since`, the first pinned
  release that has each file (against the cached sources where there are
  some), and each deselection range holds a pinned release, so a wrong entry
  is found here rather than minutes into `tools/test.sh RELEASE`.

A check that cannot run here (no git checkout, sources not cached) is named on
stderr as skipped; it is not a problem, but the closing verdict names the
releases whose series were not applied (`releases_without_sources`) rather
than claim them well-formed.
"""

import ast
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.git import git_run
from vllm_overlay.common.locations import PINS_FILE, cache_root
from vllm_overlay.common.toml_files import read_toml
from vllm_overlay.series.checks import series_problems
from vllm_overlay.series.deselections import (
    OUR_DESELECTIONS_FILE,
    UPSTREAM_DESELECTIONS_FILE,
    load_deselections,
)
from vllm_overlay.series.facts import (
    FACTS_FILE,
    forced_sd_checks,
    since_problems,
    triton_cpu_standin_releases,
)
from vllm_overlay.series.loader import load_series
from vllm_overlay.series.model import (
    PACKAGE_DIR,
    PATCH_SUFFIX,
    SERIES_FILE,
    TESTS_DIR,
    parse_patch,
    series_dir,
)
from vllm_overlay.series.pins import ReleasePin, load_pins
from vllm_overlay.series.platforms import records_platforms
from vllm_overlay.track.checks.attributes import missing_attributes, package_names
from vllm_overlay.track.checks.names import new_unbound_names
from vllm_overlay.track.pinning.platform_sources import platform_problems
from vllm_overlay.track.records.history import (
    HISTORY_FILE,
    history_changes,
    parse_history,
    read_history,
)
from vllm_overlay.track.records.verdicts import read_verdicts
from vllm_overlay.track.status.watch import (
    WATCH_FILE,
    pinned_versions,
    skipped_releases,
)
from vllm_overlay.upstream.applier import apply_series, syntax_problem
from vllm_overlay.upstream.fetch import cached_sdist_tree

PROBES_DIR = Path("tests") / "probes"
KEPT_FILE = PROBES_DIR / "kept.toml"


@dataclass(frozen=True)
class Checkout:
    """What every rule reads: the series tree, the pins, the series
    directories present, and the cache holding the releases' sources."""

    patches_root: Path
    pins: dict[str, ReleasePin]
    directories: tuple[Path, ...]
    cache: Path

    @property
    def repo_root(self) -> Path:
        return self.patches_root.parent


Rule = Callable[[Checkout], list[str]]


def lint(patches_root: Path, cache: Path | None = None) -> list[str]:
    """One-line problems: pins, series files, patch files, trailers, probes,
    the tests no patch cites, the history of dropped patches, the recorded
    verdicts, and each series against its release's cached sources; every
    rule of `RULES`, in order."""
    try:
        pins = load_pins(patches_root / PINS_FILE)
    except OverlayError as exc:
        return [str(exc)]
    directories = sorted(d for d in (patches_root / "vllm").glob("v*") if d.is_dir())
    checkout = Checkout(patches_root, pins, tuple(directories), cache or cache_root())
    return [problem for rule in RULES for problem in rule(checkout)]


def series_files(checkout: Checkout) -> list[str]:
    """Each pinned release's series directory and each series directory's
    release, and every defect of each series' own files
    (`series.checks.series_problems`)."""
    problems = []
    for version in checkout.pins:
        directory = series_dir(checkout.patches_root, version)
        if not directory.exists():
            # Between pinning a release and rebasing onto it (docs/maintainer/
            # releases.md, "Rebasing onto a new release"): a normal state, not a
            # problem.
            _note(
                f"vLLM {version} is pinned and has no series yet "
                f"(`vllm-overlay rebase FROM {version}` writes it)"
            )
        elif not (directory / SERIES_FILE).is_file():
            problems.append(
                f"{directory}: vLLM {version}'s series has no {SERIES_FILE}"
            )
    for directory in checkout.directories:
        if directory.name[1:] not in checkout.pins:
            problems.append(f"{directory}: release {directory.name[1:]} is not pinned")
        problems.extend(series_problems(directory, checkout.repo_root))
    return problems


def patch_syntax(checkout: Checkout) -> list[str]:
    """Every patch file of every series directory that git cannot read as a
    patch (`applier.syntax_problem`); no sources needed."""
    return [
        problem
        for directory in checkout.directories
        for path in sorted(directory.glob(f"*{PATCH_SUFFIX}"))
        if (problem := syntax_problem(path))
    ]


def recorded_files(checkout: Checkout) -> list[str]:
    """The history of dropped patches and the recorded verdicts parse."""
    problems = []
    for reader in (read_history, read_verdicts):
        try:
            reader(checkout.patches_root)
        except OverlayError as exc:
            problems.append(str(exc))
    return problems


def _note(text: str) -> None:
    """A line on stderr about a check that is not a problem."""
    print(f"vllm-overlay lint: {text}", file=sys.stderr)


def _skipped(check: str, why: str) -> None:
    _note(f"skipped {check}: {why}")


def uncited_tests(checkout: Checkout) -> list[str]:
    """A problem for every test under `tests/probes/` that no patch of any
    series cites and `kept.toml` does not list, and for every entry of
    `kept.toml` that names no test or a cited one."""
    tests, problems = probe_tests(checkout.repo_root)
    kept, kept_problems = _kept_tests(checkout.repo_root)
    problems += kept_problems
    cited = _cited(checkout.directories)
    for test in tests:
        if test not in kept and not _citers(cited, test):
            problems.append(
                f"{test}: no patch of any series cites it as a Probe:; cite it, "
                f"or list it in {KEPT_FILE} with the reason it is kept"
            )
    for test in kept:
        if test not in tests:
            problems.append(f"{KEPT_FILE}: {test} names no test under {PROBES_DIR}/")
        elif citers := _citers(cited, test):
            problems.append(
                f"{KEPT_FILE}: {test} is cited by {', '.join(sorted(citers))}; "
                "remove the entry"
            )
    return problems


def probe_tests(repo_root: Path) -> tuple[list[str], list[str]]:
    """The node id of every test function in `tests/probes/**/test_*.py` (as
    pytest collects them: `test*` functions, and `test*` methods of `Test*`
    classes), read statically as `series.probe_problem` reads probes; and a
    problem for each module that does not parse."""
    tests, problems = [], []
    for path in sorted((repo_root / PROBES_DIR).rglob("test_*.py")):
        module = path.relative_to(repo_root).as_posix()
        try:
            body = ast.parse(path.read_text(encoding="utf-8")).body
        except SyntaxError as exc:
            problems.append(
                f"{module}: not valid Python ({exc.msg}, line {exc.lineno})"
            )
            continue
        for node in body:
            if _is_test(node):
                tests.append(f"{module}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                tests += [
                    f"{module}::{node.name}::{method.name}"
                    for method in node.body
                    if _is_test(method)
                ]
    return tests, problems


def _is_test(node: ast.stmt) -> bool:
    return isinstance(
        node, ast.FunctionDef | ast.AsyncFunctionDef
    ) and node.name.startswith("test")


def _kept_tests(repo_root: Path) -> tuple[dict[str, str], list[str]]:
    """`kept.toml`'s tests and their reasons, and its defects."""
    path = repo_root / KEPT_FILE
    if not path.is_file():
        return {}, []
    try:
        data = read_toml(path, "kept-tests file")
    except OverlayError as exc:
        return {}, [str(exc)]
    kept = data.get("kept", {})
    if set(data) - {"kept"} or not isinstance(kept, dict):
        return {}, [f"{KEPT_FILE}: holds one table, [kept]: test id = reason"]
    unexplained = [
        test
        for test, reason in kept.items()
        if not isinstance(reason, str) or not reason.strip()
    ]
    return kept, [f"{KEPT_FILE}: {test} needs a reason" for test in unexplained]


def _cited(directories: Iterable[Path]) -> dict[str, set[str]]:
    """Probe id (without parameters) -> the patches that cite it, over every
    patch file that parses (the others are reported by the series check)."""
    cited: dict[str, set[str]] = {}
    for directory in directories:
        for path in sorted(directory.glob(f"*{PATCH_SUFFIX}")):
            try:
                patch = parse_patch(path)
            except OverlayError:
                continue
            for probe in patch.probes:
                label = f"{directory.name}/{patch.name}"
                cited.setdefault(probe.split("[", 1)[0], set()).add(label)
    return cited


def _citers(cited: dict[str, set[str]], test: str) -> set[str]:
    """The patches that cite `test`, or its class, as a probe."""
    parts = test.split("::")
    prefixes = ("::".join(parts[:n]) for n in range(2, len(parts) + 1))
    return set().union(*(cited.get(prefix, set()) for prefix in prefixes))


def history_edits(checkout: Checkout) -> list[str]:
    """The history's append-only rule against its copy at git's HEAD."""
    patches_root = checkout.patches_root
    path = patches_root / HISTORY_FILE
    committed = _committed_history(patches_root)
    if committed is None:
        return []
    try:
        current = read_history(patches_root)
    except OverlayError:
        return []  # reported by the history check itself
    try:
        old = parse_history(committed, f"{path} at HEAD")
    except OverlayError as exc:
        _skipped("the append-only check of the history", str(exc))
        return []
    return history_changes(old, current, path)


def _committed_history(patches_root: Path) -> str | None:
    """The history file's text at HEAD, or None when there is nothing to
    compare with: no commit holds it yet, or the check cannot run here (said
    on stderr).

    The checkout is the maintainer's own, so git reads it with their config:
    a checkout owned by another user is readable only where that config lists
    it in `safe.directory`."""
    check = "the append-only check of the history"
    try:
        inside = git_run(
            patches_root, "rev-parse", "--is-inside-work-tree", user_config=True
        )
    except FileNotFoundError:
        _skipped(check, "git is not installed")
        return None
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        _skipped(check, f"{patches_root} is not in a git checkout")
        return None
    shown = git_run(
        patches_root, "show", f"HEAD:./{HISTORY_FILE.as_posix()}", user_config=True
    )
    return shown.stdout if shown.returncode == 0 else None


def revision_problems(checkout: Checkout) -> list[str]:
    """A problem for each series that is not the one recorded for its
    release's `revision`. A series not recorded yet (one `rebase` just wrote)
    is named on stderr, not a problem: there is nothing to compare with."""
    patches_root, pins = checkout.patches_root, checkout.pins
    problems = []
    for version in sorted(pins, key=Version):
        release = pins[version]
        try:
            series = load_series(patches_root, release)
        except OverlayError:
            continue  # no series yet, or its defects are listed elsewhere
        bump = f"`vllm-overlay pin --bump {version}`"
        if release.series_digest is None:
            _note(
                f"vLLM {version}'s series is not recorded for revision "
                f"{release.revision} yet ({bump} records it)"
            )
        elif release.series_digest != series.digest:
            problems.append(
                f"{series.directory}: the series changed since revision "
                f"{release.revision} was recorded, and its revision did not; "
                f"run {bump}"
            )
    return problems


def application_problems(checkout: Checkout) -> list[str]:
    """Each pinned release's series applied, zero fuzz and zero offset, to
    the release's sources in the cache (those the harness and `rebase`
    unpacked from the pinned sdist), and each module it changes reading no
    global name the series leaves unbound (`names.py`) and no attribute the
    release defines nowhere while another pinned release does
    (`attributes.py`, against the releases whose sources are cached); a
    release whose sources are not cached is skipped, and said so."""
    patches_root, pins, cache = checkout.patches_root, checkout.pins, checkout.cache
    trees = {
        version: tree
        for version, pin in pins.items()
        if (tree := cached_sdist_tree(pin, cache)) is not None
    }
    defined = {version: package_names(tree) for version, tree in trees.items()}
    problems = []
    for version in sorted(pins, key=Version):
        sources = trees.get(version)
        if sources is None:
            _skipped(
                f"zero-fuzz application to vLLM {version}",
                f"its sources are not cached "
                f"({cache_layout.sdist_tree(cache, version)})",
            )
            continue
        try:
            series = load_series(patches_root, pins[version])
        except OverlayError:
            continue  # its defects are listed by the series check
        names = (*series.touched_files, *series.upstream_test_files)
        originals = {
            n: (sources / n).read_bytes() for n in names if (sources / n).is_file()
        }
        for tree in (PACKAGE_DIR, TESTS_DIR):
            try:
                patched = apply_series(series, originals, tree)
            except OverlayError as exc:
                problems.append(f"{exc} (its cached sources {sources})")
                continue
            for name, content in patched.items():
                unbound = new_unbound_names(name, originals.get(name), content)
                if unbound is not None:
                    problems.append(f"vLLM {version}: {unbound}")
            if tree == PACKAGE_DIR:
                elsewhere = {r: n for r, n in defined.items() if r != version}
                problems += [
                    f"vLLM {version}: {line}"
                    for line in missing_attributes(
                        version, originals, patched, defined[version], elsewhere
                    )
                ]
    return problems


def releases_without_sources(
    patches_root: Path, cache: Path | None = None
) -> list[str]:
    """The pinned releases whose sources are not cached, oldest first: the
    series `application_problems` could not check, which `lint`'s verdict
    must name rather than claim."""
    pins = load_pins(patches_root / PINS_FILE)
    cache = cache or cache_root()
    return [
        version
        for version in sorted(pins, key=Version)
        if cached_sdist_tree(pins[version], cache) is None
    ]


def release_facts(checkout: Checkout) -> list[str]:
    """The `since` of each `upstream_tests` entry of the release facts
    against the pinned releases, and against their sources where the cache
    holds them (`facts.since_problems`: without network, that is all lint
    can know), each release's `[platform]` entry likewise, and the
    deselection files' entries, each of which must parse and hold a pinned
    release in its range. What a checkout lacks is skipped, and said so."""
    problems = []
    facts = checkout.patches_root / FACTS_FILE
    if facts.is_file():
        sources = {
            version: tree
            for version, pin in checkout.pins.items()
            if (tree := cached_sdist_tree(pin, checkout.cache)) is not None
        }
        try:
            problems += since_problems(checkout.patches_root, sources)
        except OverlayError as exc:
            problems.append(str(exc))
        if records_platforms(checkout.patches_root):
            problems += platform_problems(checkout.patches_root, sources)
        else:
            _skipped("the release facts' [platform]", f"{facts} has no such table")
        for read in (forced_sd_checks, triton_cpu_standin_releases):
            try:
                read(checkout.patches_root)
            except OverlayError as exc:
                problems.append(str(exc))
    else:
        _skipped("the release facts' `since`", f"{facts} does not exist")
    for name in (UPSTREAM_DESELECTIONS_FILE, OUR_DESELECTIONS_FILE):
        path = checkout.repo_root / name
        if not path.is_file():
            _skipped(f"the ranges of {name}", f"{path} does not exist")
            continue
        try:
            entries = load_deselections(path)
        except OverlayError as exc:
            problems.append(str(exc))
            continue
        problems += [
            f"{path}: deselect entry {number} ({entry.target}, {entry.span}) "
            "applies to no pinned release; remove it, or widen its range"
            for number, entry in enumerate(entries, 1)
            if not any(entry.applies_to(version) for version in checkout.pins)
        ]
    return problems


def release_watch(checkout: Checkout) -> list[str]:
    """The release watch's file (`track.watch`): the packages it follows
    pinned by the requirement files it names, and each skipped release
    written as "PACKAGE VERSION" with its reason."""
    path = checkout.patches_root / WATCH_FILE
    if not path.is_file():
        _skipped("the release watch's file", f"{path} does not exist")
        return []
    try:
        pinned_versions(checkout.patches_root)
        skipped_releases(checkout.patches_root)
    except OverlayError as exc:
        return [str(exc)]
    return []


# Every check of `vllm-overlay lint`, in the order its problems are listed.
RULES: tuple[Rule, ...] = (
    series_files,
    patch_syntax,
    uncited_tests,
    recorded_files,
    history_edits,
    revision_problems,
    application_problems,
    release_facts,
    release_watch,
)
