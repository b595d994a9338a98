"""A branch's TCP port: the first one of the pool's range that is free on every listen address."""

from __future__ import annotations

import socket

from pgoverlay.errors import PortsExhaustedError
from pgoverlay.runner.pool import Pool


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(pool: Pool, used: set[int]) -> int:
    s = pool.settings
    hosts = [h.strip() for h in s.listen_address.split(",") if h.strip()]
    hosts = ["0.0.0.0" if h == "*" else h for h in hosts] or ["127.0.0.1"]
    for port in range(s.port_min, s.port_max + 1):
        if port not in used and all(_port_free(h, port) for h in hosts):
            return port
    raise PortsExhaustedError(
        f"every port from {s.port_min} to {s.port_max} is taken: destroy unused branches "
        "(`pgoverlay branch list`) or widen PGOVERLAY_PORT_MIN/PGOVERLAY_PORT_MAX"
    )
