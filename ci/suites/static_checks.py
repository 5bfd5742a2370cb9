"""Item 1 of the suite (`ci/harness.py`): the checks that need no vLLM.
Each runs from the checkout, in the tooling environment (`tools/venv.sh`).

A pass is recorded with the digest of the checkout's files as they were
(every file git would commit: tracked, and untracked but not ignored), so
that `tools/test.sh --release-only` skips the checks only while nothing
they read has changed since: a rerun after a fix to a test or a patch runs
them again, where a maintainer would otherwise learn from CI.
"""

import hashlib
import json
import sys
import tempfile
from pathlib import Path

from ci.suites.pytest_runs import Counts, junit_counts, run
from vllm_overlay.common import atomic
from vllm_overlay.common.git import git_run
from vllm_overlay.common.locations import REPO_ROOT

# The record of the last pass, in the checkout's reports folder.
PASSED = "static-checks-passed.json"


def static_checks(reports: Path) -> tuple[list[str], Counts]:
    """Names of the failed checks, and the tooling tests' counts; a pass
    is recorded for the checkout's files as they were when the checks
    started."""
    python = sys.executable
    tooling = reports / "tooling.xml"
    digest = checkout_digest()
    (reports / PASSED).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-site-") as site:
        steps = {
            "ruff check": [python, "-m", "ruff", "check", "."],
            "ruff format": [python, "-m", "ruff", "format", "--check", "."],
            "vllm-overlay lint": [python, "-m", "vllm_overlay", "lint"],
            "PATCHES.md current": [python, "-m", "vllm_overlay", "table", "--check"],
            # mkdocs.yml sets strict: a broken link or anchor, or a page left
            # out of the nav, fails the build.
            "docs build": [python, "-m", "mkdocs", "build", "--strict", "-d", site],
            # SHA-pinned actions, least permissions, no persisted credentials,
            # no template expansion in shell (zizmor ships a program only).
            "workflow audit": [
                *(str(Path(python).parent / "zizmor"), "--offline", "--quiet"),
                ".github/workflows",
            ],
            "tooling tests": [
                *(python, "-m", "pytest", "tests/tooling", "-q"),
                *("-p", "no:cacheprovider", "--junit-xml", str(tooling)),
            ],
        }
        failed = [n for n, command in steps.items() if run(command, cwd=REPO_ROOT)]
    if not failed and digest is not None:
        atomic.write_text(reports / PASSED, json.dumps({"checkout": digest}) + "\n")
    return failed, junit_counts(tooling)


def passed_as_it_is(reports: Path) -> bool:
    """Whether the checks last passed on the checkout's files as they are."""
    try:
        recorded = json.loads((reports / PASSED).read_text())["checkout"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return recorded == checkout_digest()


def checkout_digest() -> str | None:
    """The sha256 of every file git would commit in the checkout, by path
    and content; None outside a git work tree."""
    listed = git_run(
        REPO_ROOT,
        *("ls-files", "-z", "--cached", "--others", "--exclude-standard"),
        user_config=True,
    )
    if listed.returncode != 0:
        return None
    digest = hashlib.sha256()
    for name in sorted(set(listed.stdout.split("\0")) - {""}):
        path = REPO_ROOT / name
        # A file deleted from the work tree is still in git's index.
        content = path.read_bytes() if path.is_file() else b""
        for part in (name.encode(), content):
            digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()
