"""What makes a release's series directory well-formed.

One check a function, each returning one-line messages that name the file:
the order file lists existing patches once each, every patch parses, carries
the required trailers with valid values, and every `Probe:` names a test
that exists in our tree. `lint` prints them all; `loader.load_series`
refuses a series on the first.
"""

import ast
import re
from pathlib import Path

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.model import (
    PATCH_SUFFIX,
    REQUIRED_TRAILERS,
    SERIES_FILE,
    parse_patch,
    read_series_file,
)

_SINGLE_TRAILERS = ("Upstream-Status", "Upstream-PR", "Drop-When")
_URL = r"https?://\S+"
_UPSTREAM_STATUS = re.compile(
    rf"Pending|Submitted {_URL}|Backport \S.*|Inappropriate \S.*"
)
_UPSTREAM_PR = re.compile(rf"none|{_URL}")
_PROBE_ID = re.compile(r"(tests/[\w/.-]+\.py)::([\w:]+)(\[.*\])?")


def series_problems(directory: Path, repo_root: Path) -> list[str]:
    """Every defect of one release's series directory, as one-line messages."""
    series_path = directory / SERIES_FILE
    if not series_path.is_file():
        return [f"{series_path}: missing"]
    names = read_series_file(series_path)
    problems = []
    seen = set()
    for name in names:
        if name in seen:
            problems.append(f"{series_path}: {name} is listed twice")
        seen.add(name)
        if "/" in name or not name.endswith(PATCH_SUFFIX):
            problems.append(
                f"{series_path}: {name} must be a *{PATCH_SUFFIX} file name"
            )
        elif not (directory / name).is_file():
            problems.append(f"{series_path}: lists {name}, which does not exist")
        else:
            problems.extend(_patch_problems(directory / name, repo_root))
    for path in sorted(directory.glob(f"*{PATCH_SUFFIX}")):
        if path.name not in seen:
            problems.append(f"{path}: not listed in {series_path}")
    return problems


def _patch_problems(path: Path, repo_root: Path) -> list[str]:
    try:
        patch = parse_patch(path)
    except OverlayError as exc:
        return [str(exc)]
    problems = []
    keys = [key for key, _ in patch.trailers]
    for key in REQUIRED_TRAILERS:
        if key not in keys:
            problems.append(f"{path}: missing trailer {key}:")
    for key in _SINGLE_TRAILERS:
        if keys.count(key) > 1:
            problems.append(f"{path}: trailer {key}: appears more than once")
    for key, value in patch.trailers:
        problems.extend(_trailer_problems(path, key, value, repo_root))
    if (
        "Upstream-Status" in keys
        and patch.upstream_status.startswith("Submitted ")
        and "Upstream-PR" in keys
        and patch.upstream_pr != patch.upstream_status.split(" ", 1)[1]
    ):
        problems.append(f"{path}: Upstream-PR must be the URL of Submitted")
    return problems


def _trailer_problems(path: Path, key: str, value: str, repo_root: Path) -> list[str]:
    if not value:
        return [f"{path}: {key}: is empty"]
    if key == "Upstream-Status" and not _UPSTREAM_STATUS.fullmatch(value):
        return [
            f"{path}: invalid Upstream-Status: {value!r} (Pending | Submitted <url> "
            "| Backport <release or commit> | Inappropriate <reason>)"
        ]
    if key == "Upstream-PR" and not _UPSTREAM_PR.fullmatch(value):
        return [f"{path}: invalid Upstream-PR: {value!r} (a URL or none)"]
    if key == "Probe":
        reason = probe_problem(value, repo_root)
        if reason:
            return [f"{path}: Probe: {value}: {reason}"]
    return []


def probe_problem(node_id: str, repo_root: Path) -> str | None:
    """Why `node_id` names no test in our tree, or None when it does.

    Checked statically (the test file's syntax tree), because probes only import
    inside an environment where vLLM is installed.
    """
    match = _PROBE_ID.fullmatch(node_id)
    if not match:
        return "not a pytest node id of the form tests/...py::test_name"
    file, qualname = match.group(1), match.group(2).split("::")
    source = repo_root / file
    if not source.is_file():
        return f"{file} does not exist"
    scope: list[ast.stmt] = ast.parse(source.read_text(encoding="utf-8")).body
    for part in qualname:
        node = next(
            (
                n
                for n in scope
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and n.name == part
            ),
            None,
        )
        if node is None:
            return f"{file} defines no {'::'.join(qualname)}"
        scope = node.body if isinstance(node, ast.ClassDef) else []
    return None
