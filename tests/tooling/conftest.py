"""Fixtures: a small synthetic vLLM wheel, its pins, and series written with
real `git format-patch`, so the tooling is tested in seconds without vLLM."""

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from vllm_overlay.cli import main
from vllm_overlay.series.manifest import MANIFEST_FORMAT, MANIFEST_PATH
from vllm_overlay.track.records.readme_table import (
    BEGIN,
    END,
    README_FILE,
    render_release_table,
)

pytest_plugins = ["pytester"]

RELEASE = "9.9.0"
AUTHOR = "Test Maintainer <test@example.invalid>"
SCHEDULER = "vllm/v1/core/sched/scheduler.py"
SCHEDULER_SOURCE = "".join(f"line {n}\n" for n in range(1, 41))
EXTENSION = b"\x7fELF" + bytes(range(256)) * 64
TRAILERS = """Upstream-Status: Pending
Upstream-PR: none
Drop-When: upstream validates the value itself
Probe: tests/probes/test_demo.py::test_demo
"""


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """`vllm-overlay ARGV...` in this process: exit status, stdout, stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refusal(capsys, *argv: str) -> str:
    """The one line `vllm-overlay ARGV...` refuses with (status 1, no stdout)."""
    code, out, err = run_cli(capsys, *argv)
    assert (code, out) == (1, "")
    (line,) = err.splitlines()
    assert line.startswith("vllm-overlay: error: ")
    return line


def record_hash(content: bytes) -> str:
    digest = hashlib.sha256(content).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def make_wheel(
    path: Path,
    dist: str = "vllm",
    members: dict | None = None,
    version: str = RELEASE,
) -> Path:
    """A wheel shaped like vLLM's: Python files, a compiled extension stored
    without compression, a `_version.py` and a dist-info with RECORD."""
    dist_info = f"{dist.replace('-', '_')}-{version}.dist-info"
    files = {
        "vllm/__init__.py": b"from vllm._version import __version__\n",
        "vllm/_version.py": f'__version__ = "{version}"\n'.encode(),
        SCHEDULER: SCHEDULER_SOURCE.encode(),
        "vllm/v1/metrics/stats.py": b"STATS = 1\n",
        "vllm/_C.abi3.so": EXTENSION,
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.4\nName: {dist}\nVersion: {version}\n"
            "Summary: test\n\nA description.\nName: not a header\n"
        ).encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n",
        f"{dist_info}/entry_points.txt": b"[console_scripts]\nvllm = vllm:main\n",
        **(members or {}),
    }
    record = "".join(
        f"{name},{record_hash(data)},{len(data)}\n" for name, data in files.items()
    )
    record += f"{dist_info}/RECORD,,\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 10, 1, 12, 0, 0))
            info.external_attr = 0o644 << 16
            stored = name.endswith(".so")
            archive.writestr(
                info,
                data,
                compress_type=zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED,
            )
        archive.writestr(f"{dist_info}/RECORD", record)
    return path


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_git(cwd: Path, *args: str) -> str:
    """git in `cwd` with a fixed identity, for the test's own repositories;
    a failure raises."""
    return subprocess.run(
        ["git", "-c", "user.name=T", "-c", "user.email=t@example.invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def make_vllm_clone(repo: Path) -> Path:
    """A vLLM-like git history built from the fixture's own release: 9.9.0's
    scheduler tagged `v9.9.0`, then upstream edits on `main`, one commit
    each and each tagged with its name: code moved down (`moved`), the line
    the patch changes changed too (`conflict`: no 3-way merge takes it), the
    patch's change itself (`absorbed`)."""
    (repo / SCHEDULER).parent.mkdir(parents=True)
    run_git(repo, "init", "-q")
    run_git(repo, "symbolic-ref", "HEAD", "refs/heads/main")
    steps = [
        ("release", SCHEDULER_SOURCE, f"v{RELEASE}"),
        ("moved", "moved in\n" * 3 + SCHEDULER_SOURCE, ""),
        ("conflict", "moved in\n" * 3 + scheduler_edit(20, "rewritten"), ""),
        ("absorbed", scheduler_edit(20, "line twenty, patched"), ""),
    ]
    for message, text, tag in steps:
        (repo / SCHEDULER).write_text(text)
        run_git(repo, "add", "-A")
        run_git(repo, "commit", "-qm", message, "--date", "2026-11-20T12:00:00")
        run_git(repo, "tag", message)
        if tag:
            run_git(repo, "tag", tag)
    return repo


def format_patch(
    workdir: Path,
    originals: dict[str, str],
    edits: dict[str, str],
    subject: str = "scheduler: demo change",
    trailers: str = TRAILERS,
) -> str:
    """The text `git format-patch` writes for one commit turning `originals`
    into `edits` (path -> full new text)."""
    repo = workdir / f"git-{len(list(workdir.glob('git-*')))}"
    repo.mkdir(parents=True)
    git = partial(run_git, repo)
    git("init", "-q")
    for name, text in originals.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git("add", "-A")
    git("commit", "-q", "--allow-empty", "-m", "base")
    for name, text in edits.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git("add", "-A")
    git("commit", "-q", f"--author={AUTHOR}", "-m", f"{subject}\n\nWhy.\n\n{trailers}")
    return git("format-patch", "-1", "--zero-commit", "--no-signature", "--stdout")


@dataclass
class Project:
    """A synthetic checkout: patches/, tests/probes/ and a download cache."""

    root: Path
    cache: Path
    workdir: Path

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    @property
    def series_dir(self) -> Path:
        return self.patches / "vllm" / f"v{RELEASE}"

    def add_patch(self, name: str, text: str) -> Path:
        path = self.series_dir / name
        path.write_text(text)
        series = self.series_dir / "series"
        series.write_text(series.read_text() + name + "\n")
        return path

    def pin(self, wheels: list[tuple[str, Path]], revision: int = 1) -> None:
        """Pin `wheels` ((dist, path) pairs) and put them in the cache."""
        entries = []
        for dist, path in wheels:
            cached = self.cache / "wheels" / path.name
            cached.parent.mkdir(parents=True, exist_ok=True)
            if path != cached:
                cached.write_bytes(path.read_bytes())
            entries.append(
                f'  {{ dist = "{dist}", filename = "{path.name}", '
                f'sha256 = "{sha256_file(path)}" }},'
            )
        (self.patches / "vllm" / "releases.toml").write_text(
            f'[releases."{RELEASE}"]\nrevision = {revision}\n'
            f'sdist = {{ filename = "vllm-{RELEASE}.tar.gz", sha256 = "{"0" * 64}" }}\n'
            "wheels = [\n" + "\n".join(entries) + "\n]\n"
        )

    def pin_release(self, version: str, scheduler: str) -> None:
        """Pin one more release, whose scheduler is `scheduler`, and cache its
        wheel; it has no series yet, as between pinning and `rebase`."""
        wheel = make_wheel(
            self.cache / "wheels" / f"vllm-{version}-cp38-abi3-linux_x86_64.whl",
            members={SCHEDULER: scheduler.encode()},
        )
        with (self.patches / "vllm" / "releases.toml").open("a") as pins:
            pins.write(
                f'\n[releases."{version}"]\nrevision = 1\n'
                f'sdist = {{ filename = "vllm-{version}.tar.gz", '
                f'sha256 = "{"0" * 64}" }}\n'
                f'wheels = [{{ dist = "vllm", filename = "{wheel.name}", '
                f'sha256 = "{sha256_file(wheel)}" }}]\n'
            )


def scheduler_edit(line: int, text: str) -> str:
    lines = SCHEDULER_SOURCE.splitlines(keepends=True)
    lines[line - 1] = text + "\n"
    return "".join(lines)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    """A project with one pinned release, one wheel in the cache, one patch."""
    proj = Project(tmp_path / "repo", tmp_path / "cache", tmp_path / "work")
    proj.series_dir.mkdir(parents=True)
    (proj.series_dir / "series").write_text(
        f"# Patch series over vLLM {RELEASE}, applied in this order.\n"
    )
    probes = proj.root / "tests" / "probes"
    probes.mkdir(parents=True)
    (probes / "test_demo.py").write_text("def test_demo():\n    assert True\n")
    wheel = make_wheel(proj.workdir / f"vllm-{RELEASE}-cp38-abi3-linux_x86_64.whl")
    proj.pin([("vllm", wheel)])
    proj.add_patch(
        "scheduler-demo.patch",
        format_patch(
            proj.workdir,
            {SCHEDULER: SCHEDULER_SOURCE},
            {SCHEDULER: scheduler_edit(20, "line twenty, patched")},
        ),
    )
    # README's generated table of pinned releases, current.
    (proj.root / README_FILE).write_text(
        f"# demo\n\n{BEGIN}\n{render_release_table(proj.patches)}{END}\n\nMore.\n"
    )
    monkeypatch.setenv("VLLM_OVERLAY_PATCHES", str(proj.patches))
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(proj.cache))
    return proj


PATCHED = scheduler_edit(20, "line twenty, patched")
DEMO_PROBE = """
import importlib.util
from pathlib import Path

def test_demo():
    spec = importlib.util.find_spec("vllm.v1.core.sched.scheduler")
    assert "line twenty, patched" in Path(spec.origin).read_text()
"""


def fake_release_env(project: Project, tmp_path: Path, release: str = "9.9.0") -> None:
    """`envs/9.9.0/bin/python` running this interpreter with a patched `vllm`
    installed: the scheduler as the series ships it and the series manifest
    naming the pinned source wheel."""
    site = tmp_path / "site"
    (site / "vllm" / "v1" / "core" / "sched").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / SCHEDULER).write_text(PATCHED)
    source = next((project.cache / "wheels").glob("vllm-*.whl"))
    manifest = {
        "format": MANIFEST_FORMAT,
        "release": release,
        "source": {"filename": source.name, "sha256": sha256_file(source)},
        "patches": [{"name": "scheduler-demo.patch", "files": [SCHEDULER]}],
    }
    (site / MANIFEST_PATH).write_text(json.dumps(manifest))
    python = project.cache / "envs" / "9.9.0" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH:{site}" exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    (project.root / "tests" / "probes" / "test_demo.py").write_text(DEMO_PROBE)


def install_into(wheel: Path, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`wheel` installed into `site` as an installer lays it out (its files
    unpacked, the dist-info's RECORD with the install-time INSTALLER and a
    console script), the folder `import vllm` finds."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
        top = {name.split("/")[0] for name in archive.namelist()}
    (dist_info,) = (site / name for name in top if name.endswith(".dist-info"))
    (dist_info / "INSTALLER").write_text("pip\n")
    with (dist_info / "RECORD").open("a") as record:
        record.write(f"{dist_info.name}/INSTALLER,,\n")
        # The console script pip writes outside site-packages.
        record.write("../../../bin/vllm,sha256=x,1\n")
    monkeypatch.syspath_prepend(str(site))
