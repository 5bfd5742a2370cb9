"""A release's source tree enters the cache only when pip unpacked its sdist
whole. pip stands in for itself here by what it leaves behind: it unpacks the
archive into `pip-download-*/vllm_*` under TMPDIR and then prepares metadata,
which fails for vLLM (its build needs CUDA tooling), so every real run exits 1.
A disk that fills while pip unpacks also exits non-zero and leaves a partial
tree with PKG-INFO in it: CI once kept such a tree of 0.32.0 and then blamed
the release facts for the upstream tests the tree lacked.

How pip is run: quiet, or on a terminal with its progress shown (a wheel
download is hundreds of megabytes)."""

import io
import os
import sys
from pathlib import Path

import pytest

from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.pins import Artifact, ReleasePin
from vllm_overlay.upstream import fetch
from vllm_overlay.upstream.fetch import PipRun, fetch_sdist_tree, last_error_line

RELEASE = ReleasePin("0.32.0", 1, Artifact("vllm-0.32.0.tar.gz", "a" * 64), ())

# The end of pip 26's output for vLLM's sdist, as it is every time.
METADATA_FAILED = """\
  Preparing metadata (pyproject.toml): finished with status 'error'
error: metadata-generation-failed

x Encountered error while generating package metadata.
"""
# The end of pip's output when the disk filled while it unpacked (CI, 0.32.0).
DISK_FULL = """\
ERROR: Exception:
Traceback (most recent call last):
  File "pip/_internal/utils/unpacking.py", line 250, in untar_file
    shutil.copyfileobj(fp, destfp)
OSError: [Errno 28] No space left on device
"""


def _pip_that_unpacks(returncode: int, output: str):
    def pip_download(requirement, workdir: Path, options, sha256=None, **_):
        tree = workdir / "pip-download-x" / "vllm_y"
        tree.mkdir(parents=True)
        (tree / "PKG-INFO").write_text(f"Name: vllm\nVersion: {RELEASE.version}\n")
        return PipRun(requirement, returncode, output)

    return pip_download


def test_a_tree_whose_metadata_step_failed_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "pip_download", _pip_that_unpacks(1, METADATA_FAILED))
    tree = fetch_sdist_tree(RELEASE, tmp_path)
    assert tree == cache_layout.sdist_tree(tmp_path, RELEASE.version)
    assert fetch.cached_sdist_tree(RELEASE, tmp_path) == tree


def test_a_tree_pip_could_not_finish_unpacking_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "pip_download", _pip_that_unpacks(2, DISK_FULL))
    with pytest.raises(OverlayError) as caught:
        fetch_sdist_tree(RELEASE, tmp_path)
    assert str(caught.value) == (
        "pip could not download vllm==0.32.0: "
        "OSError: [Errno 28] No space left on device"
    )
    assert not cache_layout.sdist_tree(tmp_path, RELEASE.version).exists()
    assert fetch.cached_sdist_tree(RELEASE, tmp_path) is None


@pytest.mark.parametrize(
    ("output", "line"),
    [
        (DISK_FULL, "OSError: [Errno 28] No space left on device"),
        (
            "ERROR: Could not find a version that satisfies the requirement x\n"
            "ERROR: No matching distribution found for x\n",
            "ERROR: No matching distribution found for x",
        ),
        ("something\nelse\n", "else"),
        ("", "no output"),
    ],
)
def test_the_reason_pip_gives_is_the_line_reported(output, line):
    assert last_error_line(output) == line


# A stand-in for pip's terminal output: it draws only on a terminal, redraws a
# progress line with carriage returns, and colours its error line.
DRAWS = (
    "import sys\n"
    "print('terminal' if sys.stdout.isatty() else 'pipe')\n"
    "print('Downloading vllm.whl 10 MB\\r 50%\\r100%')\n"
    "print('\\x1b[31mERROR: No matching distribution found for x\\x1b[0m')\n"
    "sys.exit(3)\n"
)


def test_on_a_terminal_pip_draws_and_its_output_is_shown_and_kept(monkeypatch):
    shown = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(shown))
    code, kept = fetch.shown_run([sys.executable, "-c", DRAWS], dict(os.environ))
    sys.stderr.flush()
    assert code == 3
    assert kept.splitlines() == [
        "terminal",
        "100%",
        "ERROR: No matching distribution found for x",
    ]
    assert b"\r 50%\r100%" in shown.getvalue()
    assert last_error_line(kept) == "ERROR: No matching distribution found for x"


def test_elsewhere_pip_runs_quiet(capfd):
    code, kept = fetch.quiet_run([sys.executable, "-c", DRAWS], dict(os.environ))
    assert (code, kept.splitlines()[0]) == (3, "pipe")
    assert capfd.readouterr() == ("", "")
