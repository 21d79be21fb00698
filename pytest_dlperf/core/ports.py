"""Free TCP ports on loopback (or an address of this network namespace), for rendezvous stores,
schedulers and framework servers: the standard library only, so every layer may use it."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# The kernel's ephemeral range: every outgoing connection (a store client, a gloo pair) gets a
# port from it, so a port picked there now may be a connection's by the time a rank binds it
# (EADDRINUSE, seen in CI on a store port picked minutes earlier). Below it, from LOWEST_PORT up,
# only a listener takes a port; each one handed out is checked free by binding it.
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000
_PICK = random.SystemRandom()


def free_loopback_port() -> int:
    """A TCP port free on loopback now, outside the kernel's ephemeral range where it leaves room."""
    return free_loopback_ports(1)[0]


def free_loopback_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on ``host`` (loopback, or an address of this network
    namespace) now (see EPHEMERAL_RANGE)."""
    try:
        below = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        below = LOWEST_PORT
    ports: list[int] = []
    tries = 0
    while len(ports) < count and below - LOWEST_PORT >= 1000 and tries < 100 * count:
        tries += 1
        port = _PICK.randrange(LOWEST_PORT, below)
        if port not in ports and _bindable(host, port):
            ports.append(port)
    while len(ports) < count:  # no room below the range (or all taken): the kernel picks
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in ports:
            ports.append(port)
    return ports


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


__all__ = ["EPHEMERAL_RANGE", "LOWEST_PORT", "free_loopback_port", "free_loopback_ports"]
