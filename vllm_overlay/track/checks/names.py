"""Names a series makes a module read that the module never binds.

A patch replayed onto another release can merge without a conflict and still
fail at import: it uses a name that its own release's file imports and the
other release's does not. Pinning 0.30.0 from 0.31.0's series met exactly
that (`nixl-decode-confirms-reads` calls `field(...)` in `nixl/metadata.py`,
which imports `dataclasses.field` in 0.31.0 and not in 0.30.0), and the
NameError came only from the probes, after the release's test environment
was built. Python's own symbol tables (`symtable`) find it without importing
anything: a global name read anywhere in the module, bound nowhere at module
level and not a builtin.

Only names the series adds are reported, against the same file unpatched, so
that what upstream resolves dynamically (a module `__getattr__`, names set
through `globals()`) is not called a problem; a module with a star import
binds names no table shows, and is not judged.
"""

import ast
import builtins
import symtable

# Names every module has bound besides the builtins.
MODULE_NAMES = frozenset(
    {"__file__", "__path__", "__cached__", "__builtins__", "__annotations__"}
)


class Unjudged(Exception):
    """The module binds names its symbol table cannot show (a star import)."""


def unbound_globals(source: bytes, filename: str) -> set[str]:
    """The global names `source` reads and never binds at module level (an
    assignment, import, def or class, or a `global` statement's assignment
    in a function). Raises SyntaxError where Python cannot compile it, and
    Unjudged where a star import binds names unknown here."""
    text = source.decode("utf-8")
    if any(
        isinstance(node, ast.ImportFrom) and node.names[0].name == "*"
        for node in ast.walk(ast.parse(text, filename))
    ):
        raise Unjudged(filename)
    top = symtable.symtable(text, filename, "exec")
    bound: set[str] = set()
    read: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        for symbol in table.get_symbols():
            name = symbol.get_name()
            binds = symbol.is_assigned() or symbol.is_imported()
            if binds and (table is top or symbol.is_declared_global()):
                bound.add(name)
            if (table is top or symbol.is_global()) and symbol.is_referenced():
                read.add(name)
        tables.extend(table.get_children())
    return read - bound - set(dir(builtins)) - MODULE_NAMES


def new_unbound_names(
    name: str, original: bytes | None, patched: bytes | None
) -> str | None:
    """One line when the series makes the module `name` read a global name
    it never binds, or leaves it unparseable; None otherwise (and for files
    that are not Python, deleted, or not judged)."""
    if not name.endswith(".py") or patched is None:
        return None
    try:
        before = set() if original is None else unbound_globals(original, name)
    except (SyntaxError, ValueError, Unjudged):
        return None  # unpatched already not judged: nothing to compare with
    try:
        added = sorted(unbound_globals(patched, name) - before)
    except SyntaxError as exc:
        return f"the series leaves {name} unparseable: {exc.msg} (line {exc.lineno})"
    except (ValueError, Unjudged):
        return None
    if not added:
        return None
    listed = ", ".join(f"`{n}`" for n in added)
    return (
        f"the series makes {name} read {listed}, which the file neither defines "
        "nor imports (an import the patch's own release has? add it to the patch)"
    )
