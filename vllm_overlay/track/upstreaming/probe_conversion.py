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
import io
import re
import tokenize
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.runtime.source_overlay import module_name
from vllm_overlay.series.model import PACKAGE_DIR, TESTS_DIR, Patch

PROBES_DIR = Path("tests") / "probes"
# The two lines vLLM's `tools/pre_commit/check_spdx_header.py` requires in
# every Python file.
_LICENSE = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_DOCUMENTED = (ast.Module, *_DEFINITIONS)
_LABEL = re.compile(r'^(\s*(?:[rRbBuU]?"""|\'\'\'))Probe: (\w)')
# Our words for what upstream calls tests, in comments and docstrings only.
_PLAIN_WORDS = (
    (re.compile(r"\bProbes\b"), "Tests"),
    (re.compile(r"\bprobes\b"), "tests"),
    (re.compile(r"\bProbe\b"), "Test"),
    (re.compile(r"\bprobe\b"), "test"),
    (re.compile(r"\bPatched, "), "With this change, "),
    (re.compile(r"\bThe patch\b"), "This change"),
    (re.compile(r"\bthe patch\b"), "this change"),
)


@dataclass(frozen=True)
class ConvertedTests:
    """The new test package: its path in upstream's tree and its files."""

    package: str
    files: dict[str, str]
    test_ids: tuple[str, ...]


def convert_probes(
    patch: Patch, repo_root: Path, sdist_tree: Path, series: Sequence[Patch] = ()
) -> ConvertedTests:
    """The patch's probe modules and everything local they need, as one test
    package under the upstream directory chosen for the patch.

    A probe module can hold the probes of several patches of `series`; each
    patch's package keeps only its own (plus, for the patch that cites the
    module first, the tests no patch cites), so that every commit of a
    stacked contribution passes its own tests."""
    local = _local_modules(repo_root / PROBES_DIR)
    modules = sorted({Path(probe.split("::", 1)[0]).stem for probe in patch.probes})
    missing = [name for name in modules if name not in local]
    if missing:
        raise OverlayError(f"no probe module {', '.join(missing)} in {PROBES_DIR}")
    local.update(
        (name, _without_tests(source, _foreign_tests(patch, name, source, series)))
        for name, source in [(name, local[name]) for name in modules]
    )
    needed = _closure(modules, local)
    package = f"{upstream_test_dir(patch, sdist_tree)}/{_package_name(patch)}"
    files = {f"{package}/__init__.py": _LICENSE}
    for name in sorted(needed):
        source = local[name]
        if name == "conftest":
            source = _unused_imports_dropped(
                _prune_fixtures(source, [local[n] for n in needed - {name}])
            )
        source = _relative_imports(source, set(local))
        files[f"{package}/{name}.py"] = _LICENSE + "\n" + _plain_prose(source)
    test_ids = tuple(f"{package}/{probe.split('/')[-1]}" for probe in patch.probes)
    return ConvertedTests(package, files, test_ids)


def _cited(patch: Patch, module: str) -> set[str]:
    """The top-level tests of `module` that `patch` cites as probes."""
    return {
        re.split(r"::|\[", probe.split("::", 1)[1])[0]
        for probe in patch.probes
        if "::" in probe and Path(probe.split("::", 1)[0]).stem == module
    }


def _foreign_tests(
    patch: Patch, module: str, source: str, series: Sequence[Patch]
) -> set[str]:
    """The tests of `module` that belong to another patch of `series`: those
    another patch cites and `patch` does not, and, when an earlier patch
    cites the module (it is that patch's), every test `patch` does not cite."""
    own = _cited(patch, module)
    others = [p for p in series if p.name != patch.name and _cited(p, module)]
    position = series.index(patch) if patch in series else len(series)
    if any(series.index(p) < position for p in others):
        return {node.name for node in _tests(ast.parse(source))} - own
    return set().union(*(_cited(p, module) for p in others)) - own


def _tests(tree: ast.Module) -> list[ast.stmt]:
    return [
        node
        for node in tree.body
        if isinstance(node, _DEFINITIONS) and node.name.startswith(("test_", "Test"))
    ]


def _without_tests(source: str, foreign: set[str]) -> str:
    """`source` without the top-level tests named in `foreign`, and without
    the imports nothing left uses."""
    doomed = [node for node in _tests(ast.parse(source)) if node.name in foreign]
    return _unused_imports_dropped(_deleted(source, doomed)) if doomed else source


def _deleted(source: str, nodes: Iterable[ast.stmt]) -> str:
    """`source` without the statements `nodes` (decorators included) and the
    blank lines after each."""
    lines = source.splitlines(keepends=True)
    for node in sorted(nodes, key=lambda n: -n.lineno):
        decorators = getattr(node, "decorator_list", [])
        start = min([node.lineno, *(d.lineno for d in decorators)]) - 1
        end = node.end_lineno or node.lineno
        while end < len(lines) and not lines[end].strip():
            end += 1
        del lines[start:end]
    return "".join(lines).rstrip("\n") + "\n"


def _unused_imports_dropped(source: str) -> str:
    """`source` without the top-level imports, or the names of an import,
    that nothing uses any more (the tests or fixtures that used them were
    left out). A shortened import is written plainly; ruff formats it."""
    tree = ast.parse(source)
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    used = set().union(
        *(_referenced_names_of(n) for n in tree.body if n not in imports)
    )
    lines = source.splitlines(keepends=True)
    for node in sorted(imports, key=lambda n: -n.lineno):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        kept = [alias for alias in node.names if _bound_name(alias) in used]
        if len(kept) == len(node.names):
            continue
        node.names = kept
        text = [ast.unparse(node) + "\n"] if kept else []
        lines[node.lineno - 1 : node.end_lineno] = text
    return "".join(lines)


def _bound_name(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


def _plain_prose(source: str) -> str:
    """Comments and docstrings in upstream's words: a probe is a test there,
    and a module docstring does not open with our `Probe:` label."""
    strings = {
        node.body[0].value.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, _DOCUMENTED)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    }
    lines = source.splitlines(keepends=True)
    prose = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT or (
            token.type == tokenize.STRING and token.start[0] in strings
        ):
            prose.update(range(token.start[0] - 1, token.end[0]))
    for index in sorted(prose):
        line = _LABEL.sub(lambda m: m.group(1) + m.group(2).upper(), lines[index])
        for word, plain in _PLAIN_WORDS:
            line = word.sub(plain, line)
        lines[index] = line
    return "".join(lines)


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
