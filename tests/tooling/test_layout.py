"""The package's layout is its pipeline:
series -> upstream -> wheel / runtime -> testing / doctor -> track -> cli;
the harness beside it (`ci/`) is in rooms: fixtures and envs -> suites ->
harness, none of which the package imports.

Read statically from every import statement (those inside functions too), so
that a lazy import cannot hide a cycle or a stage that reaches back up. No
module is over `MAX_MODULE_LINES`: one job a module."""

import ast
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_overlay"
# The stage of each top-level name; a module may import from its own stage
# and the ones before it, never from a later one.
STAGES = {
    "common": 0,
    "argparsing": 0,
    # Written by setuptools-scm when the package is built or installed.
    "_version": 0,
    "series": 1,
    "upstream": 2,
    "wheel": 3,
    "runtime": 3,
    "testing": 4,
    "doctor": 4,
    "track": 5,
    "about": 6,
    "arguments": 6,
    "cli": 6,
    "launcher": 7,
    "__main__": 8,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The package's modules `path` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found.update(n if n in known else node.module for n in names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in known}


@cache
def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py") if "boot" not in p.parts}
    return {
        name: imported_modules(path, set(paths)) - {name}
        for name, path in paths.items()
    }


def later_imports(
    graph: dict[str, set[str]], rank: Callable[[str], int | None], module: str
) -> list[str]:
    """What `module` imports from a later rank than its own (a module of no
    rank is taken as the first)."""
    return [t for t in sorted(graph[module]) if (rank(t) or 0) > (rank(module) or 0)]


def stage(module: str) -> int | None:
    parts = module.split(".")
    return STAGES.get(parts[1]) if len(parts) > 1 else None


# The cache's folders are named in one module, which the package and the
# harness both import (a path under the cache spelled anywhere else hides a
# dependency on a layout the other side writes).
CACHE_LAYOUT = PACKAGE / "common" / "cache_layout.py"
CACHE_ROOT = re.compile(r"(^|\.)cache(_root\(\))?$")


def cache_folders_spelled(source: str) -> list[str]:
    """`cache / "name"` and `cache_root() / "name"` in `source`: a folder
    named right under the cache root, with its line."""
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Div)
        and isinstance(node.right, (ast.Constant, ast.JoinedStr))
        and CACHE_ROOT.search(ast.unparse(node.left))
    ]


def test_only_the_cache_layout_names_the_cache_folders():
    roots = [PACKAGE, PACKAGE.parent / "ci", PACKAGE.parent / "benchmarks"]
    spelled = [
        f"{path.relative_to(PACKAGE.parent)}:{found}"
        for root in roots
        for path in sorted(root.rglob("*.py"))
        if path != CACHE_LAYOUT
        for found in cache_folders_spelled(path.read_text(encoding="utf-8"))
    ]
    assert spelled == []


def test_a_cache_folder_spelled_outside_the_layout_is_found():
    source = (
        'p = cache / "envs" / release\n'
        'q = cache_root() / f"x-{y}"\n'
        'r = project.cache / "wheels"\n'
        "s = cache_layout.wheels(cache) / name\n"
    )
    assert sorted(cache_folders_spelled(source)) == [
        "1: cache / 'envs'",
        "2: cache_root() / f'x-{y}'",
        "3: project.cache / 'wheels'",
    ]


TRACK = PACKAGE / "track"
# track/'s rooms, each with its rank, in the order of a maintainer's steps: a
# module imports from its own room's rank and the ones before it.
TRACK_RANKS = {
    "records": 0,
    "workspace": 0,
    "status": 1,
    "pinning": 1,
    "rebasing": 2,
    "checks": 2,
    "upstreaming": 3,
    "arguments": 4,
}


def track_rank(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["vllm_overlay", "track"] or len(parts) < 3:
        return None
    return TRACK_RANKS.get(parts[2])


def test_track_is_in_rooms_named_after_the_maintainers_steps():
    rooms = {
        p.stem for p in TRACK.iterdir() if p.name not in ("__init__.py", "__pycache__")
    }
    assert rooms == set(TRACK_RANKS), sorted(rooms)
    for room in rooms - {"arguments"}:
        init = TRACK / room / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), room


@pytest.mark.parametrize(
    "module", sorted(m for m in import_graph() if m.startswith("vllm_overlay.track."))
)
def test_no_track_room_imports_a_later_one(module):
    later = later_imports(import_graph(), track_rank, module)
    assert not later, f"{module} (rank {track_rank(module)}) imports {later}"


CI = PACKAGE.parent / "ci"
# ci/'s rooms and top-level modules, each with its rank: a module imports
# from its own rank and the ones before it. The fixtures and environments
# know no suite; the suites know no driver.
CI_RANKS = {
    "fixtures": 0,
    "envs": 0,
    "suites": 1,
    "harness": 2,
    "track_main": 2,
    "workflow": 2,
}


# A module that outgrows this does two jobs; split it at its seam.
@cache
def ci_graph() -> dict[str, set[str]]:
    """Every module of ci/ and what it imports of ci/ and the package."""
    paths = {module_name(p): p for p in [*CI.rglob("*.py"), *PACKAGE.rglob("*.py")]}
    return {
        name: imported_modules(paths[name], set(paths)) - {name}
        for name in paths
        if name.split(".")[0] == "ci"
    }


def ci_rank(module: str) -> int | None:
    parts = module.split(".")
    return CI_RANKS.get(parts[1]) if parts[0] == "ci" and len(parts) > 1 else None


def test_ci_is_in_rooms_a_newcomer_can_name():
    top = {p.stem for p in CI.iterdir() if p.name not in ("__init__.py", "__pycache__")}
    assert top == set(CI_RANKS) and len(top) <= 6, sorted(top)


@pytest.mark.parametrize("module", sorted(ci_graph()))
def test_no_ci_room_imports_a_later_one(module):
    later = later_imports(ci_graph(), ci_rank, module)
    assert not later, f"{module} (rank {ci_rank(module)}) imports {later}"


def test_the_package_imports_nothing_of_the_harness():
    known = {module_name(p) for p in CI.rglob("*.py")}
    reaching = {
        module_name(path): sorted(imported_modules(path, known))
        for path in PACKAGE.rglob("*.py")
        if imported_modules(path, known)
    }
    assert reaching == {}


def test_the_tiny_qwen3_5_config_has_one_source():
    """The probes, `tests/runtime` and the served checkpoints build a tiny
    Qwen3.5 config with `ci/fixtures/tiny_configs.py`, each with its own
    widths, rather than writing its layout out again."""
    source = CI / "fixtures" / "tiny_configs.py"
    trees = [CI, PACKAGE.parent / "tests", PACKAGE.parent / "benchmarks"]
    spelled = sorted(
        path.relative_to(CI.parent).as_posix()
        for tree in trees
        for path in tree.rglob("*.py")
        if path not in (source, Path(__file__).resolve())
        and any(
            isinstance(node, ast.Constant) and node.value == "qwen3_5_text"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    )
    assert spelled == []


def test_no_module_imports_itself_back():
    graph = import_graph()
    cycles = []

    def visit(module: str, trail: list[str]) -> None:
        for target in sorted(graph[module]):
            if target in trail:
                cycles.append(" -> ".join([*trail[trail.index(target) :], target]))
            elif len(trail) < len(graph):
                visit(target, [*trail, target])

    for module in sorted(graph):
        visit(module, [module])
    assert not cycles, cycles[0]


def test_every_top_level_name_has_a_stage():
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()}
    names = {n for n in names if not n.startswith(("_", ".")) or n == "__main__"}
    assert names - {"patches"} <= set(STAGES), sorted(names - set(STAGES))


def test_the_top_level_shows_the_command_line_and_the_stages_only():
    """The shared pieces live in `common/`: a reader of the listing sees the
    command line's modules and the stages' folders."""
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 8, modules


@pytest.mark.parametrize("module", sorted(import_graph()))
def test_no_stage_imports_a_later_one(module):
    later = later_imports(import_graph(), stage, module)
    assert not later, f"{module} (stage {stage(module)}) imports {later}"


# A module that outgrows this does two jobs; split it at its seam, each part
# with a docstring that says why it exists.
MAX_MODULE_LINES = 500


@pytest.mark.parametrize("tree", [PACKAGE, CI], ids=lambda tree: tree.name)
def test_no_module_is_over_the_size_limit(tree: Path):
    sizes = {
        path.relative_to(tree.parent).as_posix(): len(
            path.read_text(encoding="utf-8").splitlines()
        )
        for path in tree.rglob("*.py")
    }
    over = {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert sizes and not over, f"over {MAX_MODULE_LINES} lines: {over}"
