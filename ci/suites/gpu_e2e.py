"""The GPU end-to-end driver: what the CPU suite (`ci/suites/pd_e2e.py`) cannot run,
for users' GPU runners (`.github/workflows/ci.yml`, job `gpu`).

It builds the release's patched CUDA wheel with the builder `tools/apply.sh`
uses, makes one environment under `<cache>/gpu-e2e/<release>/` (the pinned,
verified `vllm` wheel with its dependencies from the index, lmcache 0.5.6 and
NIXL at the release's version, each with its dependencies), runs every case on
the unpatched release, installs the patched wheel over it with `--no-deps` as
README tells users, and runs them again, with the tiny random-weight models of
`ci/fixtures/tiny_model.py`:

1. `pd-offload`: P/D of the tiny Qwen3.5 hybrid behind upstream's toy proxy,
   the decode side behind MultiConnector[NixlConnector, OffloadingConnector]
   (`kv_buffer_device: cuda`), the layout the P/D decode patch is for, with
   plain NixlConnector as the yardstick: the patched build reuses the local
   prefix as NixlConnector does, the unpatched one re-pulls it, and every
   patched output equals the unpatched NixlConnector run's.
2. `lmcache-hybrid`: one server of the hybrid with LMCacheConnectorV1 in
   process (lmcache 0.5.6, CPU backend): upstream refuses it at start-up;
   patched it starts, gets zero external hits on a repeated prompt, and
   answers exactly as the patched build without a connector.
3. `lmcache-sliding`: the same with the tiny Gemma 3 (sliding-window and
   full attention, no recurrent state): out of the LMCache patch's scope, so
   both builds get external hits on the repeated prompt, the same counts and
   the same output as without a connector.
4. `lmcache-mp`: the hybrid with LMCacheMPConnector and an LMCache
   multi-process server, set up as lmcache 0.5.6 requires (the server's chunk
   size the hybrid's attention block size N, read from vLLM's start-up log;
   `--separate-object-groups`; `--mamba-cache-mode align`): hits on the
   repeated prompt, the output of no connector, and the same counts on both
   builds (no patch touches it).
5. For every single-server case, the time to first token of the repeated
   prompt, with and without the connector, from `/metrics`.
6. After its sequential prompts, each P/D pair runs the seed's layout under
   `vllm bench serve` (`ci/suites/pd/load.py` SEED_WORKLOAD: two 16,384-token
   prefixes, 1,024-token suffixes, 512 prompts, 256 at a time), the decode
   cache as large as the GPU share gives it, judged as the CPU suite judges
   its load runs (`load.checks`: every request completed, no traceback,
   both caches empty once idle, no read of released blocks, the patched
   outputs those of the unpatched NixlConnector run, the patched
   MultiConnector reusing as NixlConnector does, the unpatched one not).
7. The speculative-decoding cases the CPU cannot run (`ci/suites/gpu_mtp.py`,
   0.30.0 on): P/D of the hybrid with an MTP head, MTP on both servers and
   prefix caching on, the decode side NixlConnector and case 1's
   MultiConnector, against one MTP server and the P/D answer without
   speculation, the drafts' acceptance rate reported; and one MTP server's
   repeated prompt (vLLM #53912's symptom), reported as upstream's behaviour.

On vLLM 0.22.1 the hybrid is Qwen3-Next's layout (`gdn_hybrid` in
patches/vllm/release-facts.toml; 0.22.1 has no text-only Qwen3.5), and case 1
is the seed's decode-side reuse, which the CPU suite cannot run for 0.22.1
(only Qwen's Gated DeltaNet has CPU kernels in 0.22.1, and Qwen3-Next cannot
carry the case, as said below; see ci/suites/pd/cases.py): P/D of the tiny Nemotron-H
(Mamba2, float32) with prefix caching in Mamba "all" mode and
`VLLM_SSM_CONV_STATE_LAYOUT=DS` (which 0.22.1's NIXL worker requires of a
hybrid), plain NixlConnector and the MultiConnector layout. Upstream 0.22.1
takes the common hit over all groups, zero for a decode request, so its
NixlConnector pulls the whole prompt again; the patched build (the 0.22.1
backports) reuses the local prefix and pulls the rest, and answers exactly what
upstream does. (Qwen3-Next has only "align" mode, where upstream 0.22.1's
decode worker dies at the first transfer, on the assert the
`nixl-worker-hybrid-partial-hit` probe names.)

Nothing here runs without an NVIDIA GPU: it says so and exits 0 (exit 1 with
`--require-gpu`, for a GPU runner). This driver has never run on a GPU in this
project's CI (no GPU there); README and docs/maintainer/testing.md say what
was run where.

Usage: python -m ci.suites.gpu_e2e [RELEASE] [--require-gpu]
"""

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from http.client import HTTPException
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from ci.envs.requirements import nixl_file, pinned_requirements
from ci.fixtures.tiny_model import ensure_tiny_model
from ci.suites.gpu_mtp import NOT_RUN, mtp_cases, mtp_layout, run_mtp
from ci.suites.pd import load
from ci.suites.pd.cases import (
    LMCACHE,
    MAMBA2,
    TABLE_HEADER,
    Case,
    Check,
    Run,
    checks,
    multi,
)
from ci.suites.pd.completions import complete, make_prompts
from ci.suites.pd.gpu_verdicts import (
    HYBRID,
    SLIDING,
    Single,
    judge_mp,
    judge_single,
)
from ci.suites.pd.metrics import decode_counts, scrape, settled_metrics
from ci.suites.pd.mtp_verdicts import Served, judge_mtp
from ci.suites.pd.pair import PATCHED, UNPATCHED, Layout, start, start_vllm, wait_all
from ci.suites.pd_e2e import TOY_PROXY, run_case
from ci.suites.servers import Server, free_port, server_environment
from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.common.locations import cache_root
from vllm_overlay.series.facts import environment_facts, gdn_hybrid
from vllm_overlay.series.loader import pinned_releases, release_series
from vllm_overlay.series.model import Series
from vllm_overlay.series.pins import Dist
from vllm_overlay.upstream.fetch import fetch_sdist_tree, fetch_wheel
from vllm_overlay.wheel.builder import build_release

NIXL_GPU: dict[str, object] = {
    "kv_connector": "NixlConnector",
    "kv_role": "kv_both",
    "kv_buffer_device": "cuda",
}
# OffloadingConnector's CPU tier (v1/kv_offload/cpu/spec.py:96-99 in 0.32.0:
# `cpu_bytes_to_use` is required).
OFFLOADING: dict[str, object] = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"cpu_bytes_to_use": 2 << 30},
}
# lmcache 0.5.6's in-process CPU backend (lmcache/v1/config.py:90-96).
LMCACHE_ENV = {
    "LMCACHE_CHUNK_SIZE": "256",
    "LMCACHE_LOCAL_CPU": "True",
    "LMCACHE_MAX_LOCAL_CPU_SIZE": "2",
}
BLOCK_SIZE_LINE = re.compile(r"Setting attention block size to (\d+) tokens")
LMCACHE_SERVER_TIMEOUT_S = 120
# Two servers share the GPU in the P/D case.
GPU_SERVE_ARGS = ("--gpu-memory-utilization", "0.3", "--max-model-len", "2048")
# The P/D pairs also serve the seed's 17,408-token prompts, longer than the
# tiny models' 2,048 positions: random weights make any length as good.
SEED_MAX_MODEL_LEN = 20480
PD_SERVE_ARGS = (
    *("--gpu-memory-utilization", "0.3"),
    *("--max-model-len", str(SEED_MAX_MODEL_LEN)),
    *("--hf-overrides", json.dumps({"max_position_embeddings": SEED_MAX_MODEL_LEN})),
)
PD_CASES = (
    Case("hybrid-nixl", HYBRID, NIXL_GPU),
    Case("hybrid-multi", HYBRID, multi(NIXL_GPU, OFFLOADING), upstream="hybrid-nixl"),
)
# The seed's decode-side reuse on 0.22.1 (see the module docstring), with
# prefix caching in Mamba "all" mode on both servers.
SEED_PD_CASES = (
    Case("seed-nixl", MAMBA2, NIXL_GPU),
    Case("seed-multi", MAMBA2, multi(NIXL_GPU, OFFLOADING), upstream="seed-nixl"),
)
SEED_MODEL_ARGS = {MAMBA2: ("--mamba-cache-mode", "all")}
# 0.22.1's NIXL worker takes a hybrid only with the conv state stored
# dim-first (nixl/worker.py:250-259 there: "Set VLLM_SSM_CONV_STATE_LAYOUT=DS").
SEED_ENV = {"VLLM_SSM_CONV_STATE_LAYOUT": "DS"}
# The first release whose upstream NIXL pairs a hybrid's blocks (vllm#42554);
# before it the series carries the seed's backports.
SEED_BEFORE = Version("0.23.0")


def pd_cases(release: str) -> tuple[Case, ...]:
    return SEED_PD_CASES if Version(release) < SEED_BEFORE else PD_CASES


def pd_env(release: str) -> dict[str, str]:
    """What the P/D servers of `release` get beside LMCache's settings."""
    return SEED_ENV if Version(release) < SEED_BEFORE else {}


def has_gpu() -> str:
    """Why this machine cannot run the GPU cases ("" when it can)."""
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi on PATH"
    proc = subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True, text=True, check=False
    )
    if proc.returncode or "GPU" not in proc.stdout:
        return f"nvidia-smi lists no GPU ({proc.stdout.strip() or proc.stderr.strip()})"
    return ""


def _pip(venv: Path, *args: str) -> None:
    python = str(venv / "bin" / "python")
    proc = subprocess.run([python, "-m", "pip", "--quiet", *args], check=False)
    if proc.returncode:
        raise OverlayError(f"pip {' '.join(args[:3])} failed in {venv}")


def ensure_env(release: str, cache: Path) -> Path:
    """`<cache>/gpu-e2e/<release>/venv`: the pinned, verified `vllm` wheel
    with its dependencies from the index, lmcache 0.5.6 and the `nixl` meta
    package with theirs (on a GPU they are the real ones), as a user installs
    them. NIXL is taken at the version of the release's CPU environment
    (`ci.envs.requirements.nixl_file`: 1.5.0 for 0.33.0, which refuses older);
    with its dependencies it brings both of its CUDA builds, so its module
    finds the one for the CUDA major of the release's torch (13 for every
    pinned release's PyPI torch)."""
    pin = pinned_releases()[release]
    venv = cache_layout.gpu_env(cache, release)
    if not (venv / "bin" / "vllm").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        wheel = fetch_wheel(pin, Dist.VLLM, cache).path
        _pip(venv, "install", str(wheel), "lmcache==0.5.6", nixl_pin(release))
    return venv


def nixl_pin(release: str) -> str:
    """`nixl==<version>`: the meta package at the version that
    `release`'s CPU environment pins."""
    path = nixl_file(release, environment_facts())
    for req in pinned_requirements(path):
        if canonicalize_name(req.name) == "nixl":
            return str(req)
    raise OverlayError(f"{path} pins no `nixl` meta package")


def install(venv: Path, wheel: Path) -> None:
    """Put `wheel` in place of the installed vLLM, as README tells users."""
    _pip(venv, "install", "--no-deps", "--force-reinstall", str(wheel))


def run_single(
    layout: Layout,
    build: str,
    model: str,
    kv_config: dict[str, object] | None,
    prompt: list[int],
    name: str,
    extra_args: Sequence[str] = (),
) -> Single:
    """`prompt` twice through one fresh server; what `/metrics` counted for
    each request."""
    with ExitStack() as stack:
        server, port = start_vllm(
            stack, layout, build, model, name, kv_config, extra_args=extra_args
        )
        wait_all([(server, port, "/health")])
        path = layout.models[model]
        before = scrape(port)
        first = complete(port, path, prompt)
        middle = settled_metrics(port, before, len(prompt))
        second = complete(port, path, prompt)
        after = settled_metrics(port, middle, len(prompt))
        server.stop()
    return Single(
        [first, second], decode_counts(before, middle), decode_counts(middle, after)
    )


def single_runs(
    layout: Layout, build: str, prompt: list[int]
) -> dict[tuple[str, str, bool], Single | str]:
    """Each single-server case on `build`, with and without LMCache; a run
    that failed gives its log and error instead."""
    runs: dict[tuple[str, str, bool], Single | str] = {}
    for model in (HYBRID, SLIDING):
        for connector in (False, True):
            name = f"{build}-single-{model}-{'lmcache' if connector else 'plain'}"
            config = LMCACHE if connector else None
            try:
                runs[build, model, connector] = run_single(
                    layout, build, model, config, prompt, name
                )
            except (OSError, HTTPException, OverlayError) as exc:
                log = (layout.logs / f"{name}.log").read_text(errors="replace")
                runs[build, model, connector] = f"{log}\n{exc}"
    return runs


def hybrid_block_size(log: Path) -> int:
    """N, the hybrid's attention block size, as vLLM raised it at start-up
    (platforms/interface.py:1097 in 0.32.0 logs it)."""
    found = BLOCK_SIZE_LINE.findall(log.read_text(errors="replace"))
    if not found:
        raise OverlayError(f"{log} does not say the hybrid's attention block size")
    return int(found[-1])


def wait_listening(port: int, server: Server) -> None:
    """Until something accepts TCP connections on 127.0.0.1:`port` (the
    LMCache server's ZMQ socket), bounded."""
    deadline = time.monotonic() + LMCACHE_SERVER_TIMEOUT_S
    while time.monotonic() < deadline and server.proc.poll() is None:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(1)
    raise OverlayError(f"the LMCache server never listened; see {server.log}")


def run_lmcache_mp(
    layout: Layout, build: str, prompt: list[int], plain_log: Path
) -> Single | str:
    """The hybrid with LMCacheMPConnector and an LMCache multi-process server
    (lmcache 0.5.6: `python -m lmcache.v1.multiprocess.server`), with the
    settings lmcache checks and `vllm-overlay doctor` names: the server's
    chunk size N, `--separate-object-groups`, `--mamba-cache-mode align` and
    `--max-num-batched-tokens` of at least N. N comes from the log of the
    server without a connector, `plain_log`."""
    name = f"{build}-single-{HYBRID}-lmcache-mp"
    port = free_port()
    config = {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": port,
        },
    }
    python = str(layout.envs[build] / "bin" / "python")
    try:
        n = hybrid_block_size(plain_log)
        with ExitStack() as stack:
            server = start(
                stack,
                [
                    *(python, "-m", "lmcache.v1.multiprocess.server"),
                    *("--host", "127.0.0.1", "--port", str(port)),
                    *("--chunk-size", str(n), "--l1-size-gb", "2"),
                    "--separate-object-groups",
                ],
                server_environment(layout.vllm_cache),
                layout.logs / f"{build}-lmcache-server.log",
            )
            wait_listening(port, server)
            args = ("--mamba-cache-mode", "align")
            args += ("--max-num-batched-tokens", str(max(n, 2048)))
            return run_single(layout, build, HYBRID, config, prompt, name, args)
    except (OSError, HTTPException, OverlayError) as exc:
        log = layout.logs / f"{name}.log"
        return f"{log.read_text(errors='replace') if log.exists() else ''}\n{exc}"


def layouts(series: Series, cache: Path, venv: Path) -> tuple[Layout, Layout]:
    """Where the single-server cases and the P/D pairs of `series`' release
    run: one environment for both builds (the patched wheel is installed
    over the unpatched one between them), the tiny models, the logs."""
    release = series.release.version
    folders = cache_layout.gpu_e2e(cache)
    checkpoints = {
        HYBRID: gdn_hybrid(release),
        SLIDING: SLIDING,
        **{c.model: c.model for c in pd_cases(release) if c.model != HYBRID},
    }
    layout = Layout(
        envs={UNPATCHED: venv, PATCHED: venv},
        models={
            role: ensure_tiny_model(name, folders.models, venv / "bin" / "python")
            for role, name in checkpoints.items()
        },
        proxy=fetch_sdist_tree(series.release, cache) / TOY_PROXY,
        logs=folders.logs / release,
        vllm_cache=folders.vllm_cache,
        serve_args=GPU_SERVE_ARGS,
        extra_env=LMCACHE_ENV,
    )
    layout.logs.mkdir(parents=True, exist_ok=True)
    pd_layout = replace(
        layout,
        serve_args=PD_SERVE_ARGS,
        model_args=SEED_MODEL_ARGS,
        extra_env={**layout.extra_env, **pd_env(release)},
    )
    return layout, pd_layout


@dataclass
class Results:
    """What the GPU cases gave: the P/D runs, their load runs, the verdicts."""

    runs: list[Run] = field(default_factory=list)
    loads: list[load.LoadRun] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    # What is reported and not judged (`mtp_verdicts.repeat_notes`).
    notes: list[str] = field(default_factory=list)

    def report(self) -> None:
        print(TABLE_HEADER)
        for run in self.runs:
            print(run.row())
        print(f"\nUnder load: {load.SEED_WORKLOAD.describe()}.")
        print(load.LOAD_TABLE_HEADER)
        for load_run in self.loads:
            print(load_run.row(None))
        for result in self.checks:
            print(result)
        for note in self.notes:
            print(note)


def run_gpu_cases(series: Series, cache: Path) -> Results:
    """Every case of the module docstring on the unpatched release, then on
    its patched build installed over it, and their verdicts."""
    pin = series.release
    venv = ensure_env(pin.version, cache)
    layout, pd_layout = layouts(series, cache, venv)
    prompts = make_prompts()
    results = Results()
    singles: dict[tuple[str, str, bool], Single | str] = {}
    mp: dict[str, Single | str] = {}
    spec_cases = mtp_cases(pin.version, NIXL_GPU, OFFLOADING)
    models, python = cache_layout.gpu_e2e(cache).models, venv / "bin" / "python"
    spec_layout = mtp_layout(layout, models, python) if spec_cases else layout
    spec_runs: list[Run] = []
    served: dict[tuple[str, str], Served | str] = {}
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-gpu-") as tmp:
        wheels = {
            UNPATCHED: fetch_wheel(pin, Dist.VLLM, cache).path,
            PATCHED: build_release(series, Dist.VLLM, Path(tmp)),
        }
        for build in (UNPATCHED, PATCHED):
            install(venv, wheels[build])
            for case in pd_cases(pin.version):
                run, load_run = run_case(
                    pd_layout, build, case, prompts, load.SEED_WORKLOAD
                )
                results.runs.append(run)
                if load_run is not None:
                    results.loads.append(load_run)
            singles.update(single_runs(layout, build, prompts[0]))
            plain_log = layout.logs / f"{build}-single-{HYBRID}-plain.log"
            mp[build] = run_lmcache_mp(layout, build, prompts[0], plain_log)
            runs, by_role = run_mtp(spec_layout, build, spec_cases, prompts)
            spec_runs += runs
            served.update(by_role)
    results.checks = checks(results.runs) + load.checks(results.loads, exact_models=())
    for model in (HYBRID, SLIDING):
        results.checks += judge_single(model, singles)
    results.checks += judge_mp(singles, mp)
    if spec_cases:
        spec_checks, results.notes = judge_mtp(spec_runs, served)
        results.checks += spec_checks
        results.runs += spec_runs
    else:
        results.notes = [NOT_RUN.format(release=pin.version)]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "release", nargs="?", help="a pinned release (default: the newest)"
    )
    parser.add_argument(
        "--require-gpu",
        action="store_true",
        help="fail instead of skipping without a GPU",
    )
    args = parser.parse_args(argv)
    missing = has_gpu()
    if missing:
        print(f"vllm-overlay: GPU end to end skipped: {missing}; no GPU case ran")
        return 1 if args.require_gpu else 0
    started = time.monotonic()
    try:
        results = run_gpu_cases(release_series(args.release), cache_root())
    except OverlayError as exc:
        report_error(exc)
        return 1
    results.report()
    print(f"wall time: {time.monotonic() - started:.0f}s")
    return 0 if all(r.ok for r in results.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
