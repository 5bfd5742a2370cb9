"""The package's layout is its pipeline:
series -> upstream -> wheel / runtime -> testing / doctor -> track -> cli.

Read statically from every import statement (those inside functions too), so
that a lazy import cannot hide a cycle or a stage that reaches back up. No
module is over `MAX_MODULE_LINES`: one job a module."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_overlay"
# The stage of each top-level name; a module may import from its own stage
# and the ones before it, never from a later one.
STAGES = {
    "errors": 0,
    "locations": 0,
    "locking": 0,
    "atomic": 0,
    "git": 0,
    "trees": 0,
    "dist_metadata": 0,
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


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py") if "boot" not in p.parts}
    return {
        name: imported_modules(path, set(paths)) - {name}
        for name, path in paths.items()
    }


def stage(module: str) -> int | None:
    parts = module.split(".")
    return STAGES.get(parts[1]) if len(parts) > 1 else None


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


@pytest.mark.parametrize("module", sorted(import_graph()))
def test_no_stage_imports_a_later_one(module):
    later = [
        target
        for target in sorted(import_graph()[module])
        if (stage(target) or 0) > (stage(module) or 0)
    ]
    assert not later, f"{module} (stage {stage(module)}) imports {later}"


# A module that outgrows this does two jobs; split it at its seam, each part
# with a docstring that says why it exists.
MAX_MODULE_LINES = 500


def test_no_module_is_over_the_size_limit():
    sizes = {
        path.relative_to(PACKAGE.parent).as_posix(): len(
            path.read_text(encoding="utf-8").splitlines()
        )
        for path in PACKAGE.rglob("*.py")
    }
    over = {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert sizes and not over, f"over {MAX_MODULE_LINES} lines: {over}"
