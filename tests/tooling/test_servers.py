"""`ci/suites/servers.py`: the ports the end-to-end suites give their servers."""

import os
import signal
import subprocess
import time
from pathlib import Path

from ci.suites.servers import free_port, session_processes


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
