"""Item 1 of the suite (`ci/harness.py`): the checks that need no vLLM.
Each runs from the checkout, in the tooling environment (`tools/venv.sh`)."""

import sys
import tempfile
from pathlib import Path

from ci.suites.pytest_runs import Counts, junit_counts, run
from vllm_overlay.common.locations import REPO_ROOT


def static_checks(reports: Path) -> tuple[list[str], Counts]:
    """Names of the failed checks, and the tooling tests' counts."""
    python = sys.executable
    tooling = reports / "tooling.xml"
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
    return failed, junit_counts(tooling)
