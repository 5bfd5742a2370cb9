"""Turn a patch's probes into tests for upstream's `tests/` tree.

Our probes live in `tests/probes/` and import their helpers by bare module
name (`from conftest import ...`), the way a plain pytest directory does.
vLLM's test tree is a package (`tests/__init__.py` down to each test
directory), so the probe modules, the local helpers they import and the
fixtures they use move together into one new test package, with every bare
import of a local module made relative. The package goes next to upstream's
own tests of the code the patch changes: beside an upstream test file the
patch itself updates, else in the directory whose tests import the patched
module most often.
"""

import ast
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay.errors import OverlayError
from vllm_overlay.series import PACKAGE_DIR, TESTS_DIR, Patch
from vllm_overlay.source_overlay import module_name

PROBES_DIR = Path("tests") / "probes"
_LICENSE = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)


@dataclass(frozen=True)
class ConvertedTests:
    """The new test package: its path in upstream's tree and its files."""

    package: str
    files: dict[str, str]
    test_ids: tuple[str, ...]


def convert_probes(patch: Patch, repo_root: Path, sdist_tree: Path) -> ConvertedTests:
    """The patch's probe modules and everything local they need, as one test
    package under the upstream directory chosen for the patch."""
    modules = sorted({probe.split("::", 1)[0] for probe in patch.probes})
    local = _local_modules(repo_root / PROBES_DIR)
    wanted = [Path(m).stem for m in modules]
    needed = _closure(wanted, local)
    package = f"{upstream_test_dir(patch, sdist_tree)}/{_package_name(patch)}"
    files = {f"{package}/__init__.py": _LICENSE}
    for name in sorted(needed):
        source = local[name]
        if name == "conftest":
            source = _prune_fixtures(source, [local[n] for n in needed - {name}])
        files[f"{package}/{name}.py"] = _relative_imports(source, set(local))
    test_ids = tuple(f"{package}/{probe.split('/')[-1]}" for probe in patch.probes)
    return ConvertedTests(package, files, test_ids)


def upstream_test_dir(patch: Patch, sdist_tree: Path) -> str:
    """Where upstream keeps the tests of what `patch` changes: the directory
    whose test files mention the patched modules most often, among those of
    the upstream tests the patch updates when it updates any."""
    modules = [module_name(f) for f in patch.files if f.startswith(PACKAGE_DIR)]
    if not modules:
        raise OverlayError(f"{patch.name} changes no file under {PACKAGE_DIR}")
    pattern = re.compile("|".join(rf"\b{re.escape(m)}\b" for m in modules))
    counts = Counter(
        str(path.parent.relative_to(sdist_tree))
        for path in sorted((sdist_tree / TESTS_DIR).rglob("test_*.py"))
        if pattern.search(path.read_text(encoding="utf-8", errors="replace"))
    )
    updated = [str(Path(f).parent) for f in patch.files if f.startswith(TESTS_DIR)]
    candidates = updated or list(counts) or [TESTS_DIR.rstrip("/")]
    return max(candidates, key=lambda d: (counts[d], -candidates.index(d)))


def _package_name(patch: Patch) -> str:
    return re.sub(r"[^a-z0-9]+", "_", patch.name.removesuffix(".patch").lower())


def _local_modules(probes: Path) -> dict[str, str]:
    """Module name -> source of every Python file of `tests/probes/`."""
    return {
        path.stem: path.read_text(encoding="utf-8")
        for path in sorted(probes.glob("*.py"))
    }


def _closure(wanted: list[str], local: dict[str, str]) -> set[str]:
    """`wanted` and every local module they import, transitively; the
    conftest always, since its fixtures reach tests without an import."""
    missing = [name for name in wanted if name not in local]
    if missing:
        raise OverlayError(f"no probe module {', '.join(missing)} in {PROBES_DIR}")
    start = [*wanted, *(["conftest"] if "conftest" in local else [])]
    return _reachable(
        start, lambda name: (n for n in _imported_names(local[name]) if n in local)
    )


def _reachable(start: Iterable[str], edges: Callable[[str], Iterable[str]]) -> set[str]:
    """`start` and every name reachable from it along `edges`."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(edges(name))
    return seen


def _imported_names(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
    return names


def _relative_imports(source: str, local: set[str]) -> str:
    """`from conftest import X` -> `from .conftest import X`, and `import
    helper` -> `from . import helper`, for local modules only."""
    lines = source.splitlines(keepends=True)
    for node in ast.walk(ast.parse(source)):
        index = getattr(node, "lineno", 0) - 1
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module and node.module.split(".")[0] in local:
                lines[index] = lines[index].replace(
                    f"from {node.module} ", f"from .{node.module} ", 1
                )
        elif isinstance(node, ast.Import) and any(a.name in local for a in node.names):
            if len(node.names) != 1 or node.names[0].asname:
                raise OverlayError(
                    f"cannot rewrite `{lines[index].strip()}`: import one "
                    "local module a line"
                )
            lines[index] = lines[index].replace(
                f"import {node.names[0].name}", f"from . import {node.names[0].name}", 1
            )
    return "".join(lines)


def _prune_fixtures(conftest: str, users: list[str]) -> str:
    """The conftest without the fixtures nothing in `users` (or a kept
    fixture) asks for: the probes of other patches need the rest."""
    tree = ast.parse(conftest)
    fixtures = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(_is_fixture(d) for d in node.decorator_list)
    }
    used = set().union(*(_referenced_names(source) for source in users))
    kept = _reachable(
        (n for n, node in fixtures.items() if n in used or _autouse(node)),
        lambda name: (n for n in _referenced_names_of(fixtures[name]) if n in fixtures),
    )
    lines = conftest.splitlines(keepends=True)
    for name in sorted(set(fixtures) - kept, key=lambda n: -fixtures[n].lineno):
        node = fixtures[name]
        start = min(d.lineno for d in node.decorator_list) - 1
        end = node.end_lineno or node.lineno
        while end < len(lines) and not lines[end].strip():
            end += 1
        del lines[start:end]
    return "".join(lines).rstrip("\n") + "\n"


def _autouse(node: ast.FunctionDef) -> bool:
    return any(
        isinstance(d, ast.Call)
        and any(
            k.arg == "autouse" and isinstance(k.value, ast.Constant) and k.value.value
            for k in d.keywords
        )
        for d in node.decorator_list
    )


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "fixture"


def _referenced_names(source: str) -> set[str]:
    return _referenced_names_of(ast.parse(source))


def _referenced_names_of(tree: ast.AST) -> set[str]:
    """Every name `tree` uses: loaded names, attributes and the parameters
    by which pytest hands fixtures to tests and to other fixtures."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.update(re.findall(r"\w+", node.value))
    return names
