"""`ci/servers.py`: the ports the end-to-end suites give their servers."""

from pathlib import Path

from ci.servers import free_port


def test_free_ports_are_distinct_and_outside_the_ephemeral_range():
    """Ports are chosen seconds before a server binds them, while other
    servers bind ephemeral ports: a port from that range can be taken in
    between (a NIXL side channel was), one below it cannot."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)
    assert all(port < low for port in ports)
