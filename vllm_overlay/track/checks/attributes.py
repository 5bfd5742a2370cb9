"""Attributes a series reads that its release defines nowhere.

A patch replayed onto an older release merges cleanly where its code reads
an attribute of upstream's that the older release does not have yet: the
replay of an older release met `connector_output.failed_recving` (a field
of `KVConnectorOutput` since 0.30.0) and `meta.awaiting_kvs`, both merged
without a conflict and found only by reading. No type is known without
running the code, so the check goes by name: an attribute the series adds
a read of (`x.name`, against the same file unpatched) is a problem when
nothing in the release's `vllm/` package, patched, can supply it (no
module-level or class-level name, no function or class, no `obj.name = `
store anywhere, no import alias), while another pinned release's package
does. A name no pinned release defines (another library's: `tensor.numel`)
is not judged, nor one that a builtin type or a standard-library module the
file imports supplies (`str.strip`, a `Future`'s `.done`, which some vLLM
release also happens to define), nor one some class of the release defines
for its own use: the check finds an API the release lacks, not every misuse.

Reading every module of a release takes seconds, so the names a release's
sources define are kept beside them in the cache (`DEFINED_FILE`), keyed by
`COLLECTOR`; the sources never change under their marker.
"""

import ast
import builtins
import functools
import importlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

DEFINED_FILE = ".vllm-overlay-defined-names.json"
# Bumped whenever `defined_names` changes what it collects.
COLLECTOR = 1
PACKAGE = "vllm"


def defined_names(source: bytes, filename: str) -> set[str]:
    """The names `source` can supply as an attribute: of the module (its
    functions, classes, assignments and imports), of a class (every name its
    body binds, dataclass fields included), and every attribute stored
    (`self.name = ...`). A function's local names are not attributes. Empty
    for a file Python cannot parse."""
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):
        return set()
    names = _bound_in_body(tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names |= _bound_in_body(node.body)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


def _bound_in_body(body: Iterable[ast.stmt]) -> set[str]:
    """The names a module's or class's own statements bind (not those of the
    functions in it), through `if`/`try`/`with` blocks."""
    names: set[str] = set()
    pending = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {
                    n.id
                    for n in ast.walk(target)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                }
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                pending += getattr(node, field, [])
    return names


def _attribute_reads(source: bytes, filename: str) -> set[str]:
    """Every attribute name `source` reads (`x.name` loaded)."""
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):
        return set()
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
    }


# What a builtin value supplies: the builtin types' attributes, and those of
# the files `open` returns.
BUILTIN_NAMES = frozenset(
    name
    for kind in (
        *(v for v in vars(builtins).values() if isinstance(v, type)),
        io.TextIOWrapper,
        io.BufferedReader,
        io.BufferedWriter,
        io.BytesIO,
        io.StringIO,
    )
    for name in dir(kind)
)


def _library_names(source: bytes, filename: str) -> set[str]:
    """The attribute names the standard-library modules `source` imports
    supply: each module's, and each of its classes' (a `ThreadPoolExecutor`'s
    `.submit`, its `Future`'s `.done`)."""
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):
        return set()
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
    names: set[str] = set()
    for module in modules:
        if module.split(".")[0] in sys.stdlib_module_names:
            names |= _stdlib_names(module)
    return names


@functools.cache
def _stdlib_names(module: str) -> frozenset[str]:
    try:
        imported = importlib.import_module(module)
    except ImportError:
        return frozenset()
    names = set(dir(imported))
    for value in vars(imported).values():
        if isinstance(value, type):
            names |= set(dir(value))
    return frozenset(names)


def package_names(sources: Path) -> frozenset[str]:
    """Every name the release's `vllm/` package (its unpacked sdist at
    `sources`) defines, as `defined_names` finds them; read once, then kept
    beside the sources."""
    kept = sources / DEFINED_FILE
    try:
        data = json.loads(kept.read_text(encoding="utf-8"))
        if data.get("collector") == COLLECTOR:
            return frozenset(data["names"])
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    names: set[str] = set()
    for path in sorted((sources / PACKAGE).rglob("*.py")):
        names |= defined_names(path.read_bytes(), str(path))
    text = json.dumps({"collector": COLLECTOR, "names": sorted(names)})
    handle, scratch = tempfile.mkstemp(prefix=f".{DEFINED_FILE}.", dir=sources)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(scratch, kept)
    return frozenset(names)


def missing_attributes(
    release: str,
    originals: Mapping[str, bytes],
    patched: Mapping[str, bytes | None],
    defined: frozenset[str],
    elsewhere: Mapping[str, frozenset[str]],
) -> list[str]:
    """A line per module of `patched` (path -> content; None: deleted) that
    the series makes read attributes `release` defines nowhere: not in its
    package (`defined`) nor in any patched module, while another pinned
    release (`elsewhere`: release -> its package's names) defines them."""
    supplied = set(defined)
    for name, content in patched.items():
        if content is not None and name.endswith(".py"):
            supplied |= defined_names(content, name)
    lines = []
    for name, content in sorted(patched.items()):
        if content is None or not name.endswith(".py"):
            continue
        before = originals.get(name)
        added = _attribute_reads(content, name) - (
            _attribute_reads(before, name) if before is not None else set()
        )
        library = BUILTIN_NAMES | _library_names(content, name)
        lacking = sorted(
            attr
            for attr in added - supplied - library
            if any(attr in names for names in elsewhere.values())
        )
        if lacking:
            lines.append(_line(release, name, lacking, elsewhere))
    return lines


def _line(
    release: str,
    name: str,
    lacking: list[str],
    elsewhere: Mapping[str, frozenset[str]],
) -> str:
    described = []
    for attr in lacking:
        having = ", ".join(r for r, names in elsewhere.items() if attr in names)
        described.append(f"`.{attr}` (defined in vLLM {having})")
    return (
        f"the series makes {name} read {', '.join(described)}, which vLLM "
        f"{release} defines nowhere: port the code onto {release}'s API (the "
        "same patch in the other releases' series shows how)"
    )
