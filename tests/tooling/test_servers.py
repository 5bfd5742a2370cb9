"""`ci/suites/servers.py`: the ports the end-to-end suites give their servers,
and the sessions they start, stall and stop."""

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from ci.suites.servers import Server, free_port, session_processes


def test_free_ports_are_distinct_and_outside_the_ephemeral_range():
    """Ports are chosen seconds before a server binds them, while other
    servers bind ephemeral ports: a port from that range can be taken in
    between (a NIXL side channel was), one below it cannot."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)
    assert all(port < low for port in ports)


def test_a_session_lists_its_live_processes_and_no_zombie():
    """What `Server.stop` reports as left behind: the session leader's
    child, not the caller, and nothing once it is reaped."""
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(session_processes(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        live = session_processes(leader.pid)
        assert leader.pid in live and len(live) == 2
        assert os.getpid() not in live
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
    deadline = time.monotonic() + 10
    while session_processes(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session_processes(leader.pid) == []


def _states(pids: list[int]) -> set[str]:
    return {psutil.Process(pid).status() for pid in pids}


def test_a_paused_server_stops_every_process_of_its_session_until_resumed(tmp_path):
    """The fleet's silent prefill server (`ci/suites/pd/fleet.py`): every
    process of the session stalls, the worker a server starts as well as
    its leader, and all run again once resumed."""
    server = Server(["sh", "-c", "sleep 60 & wait"], dict(os.environ), tmp_path / "log")
    try:
        deadline = time.monotonic() + 10
        while len(session_processes(server.proc.pid)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pids = session_processes(server.proc.pid)
        server.pause()
        deadline = time.monotonic() + 10
        while _states(pids) != {psutil.STATUS_STOPPED}:
            assert time.monotonic() < deadline, _states(pids)
            time.sleep(0.05)
        server.resume()
        deadline = time.monotonic() + 10
        while psutil.STATUS_STOPPED in _states(pids):
            assert time.monotonic() < deadline, _states(pids)
            time.sleep(0.05)
    finally:
        server.kill()
    assert session_processes(server.proc.pid) == []
