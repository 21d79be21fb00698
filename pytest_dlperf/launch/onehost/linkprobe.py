"""What a fabric's links can do: how one is shaped (``shaping``), the bit rate one TCP stream
carries between two hosts, and whether the kernel can add a delay (netem)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any

from ...core.link import Link

# The queue TBF may hold before it drops.
_TBF_LATENCY = "50ms"


def shaping(link: Link, device: str) -> list[str]:
    """The ``tc`` arguments that shape ``device`` to ``link`` (empty: unshaped): netem where a
    delay is asked, else TBF with a burst sized for the rate."""
    if not link.shaped:
        return []
    if link.delay_ms is not None:
        rate = [] if link.rate_bps is None else ["rate", f"{int(link.rate_bps)}bit"]
        return ["qdisc", "replace", "dev", device, "root", "netem", "delay",
                f"{link.delay_ms * 1000:.0f}us", *rate, "limit", "10000"]
    assert link.rate_bps is not None
    return ["qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{int(link.rate_bps)}bit",
            "burst", str(link.burst_bytes()), "latency", _TBF_LATENCY]


def kernel_has_netem() -> bool:
    """Whether this kernel can add a delay (the netem qdisc), tried on a dummy device in a
    namespace of its own that vanishes with the probe."""
    if not shutil.which("unshare"):
        return False
    probe = ("ip link add dlpfprobe type dummy && ip link set dlpfprobe up && "
             "tc qdisc add dev dlpfprobe root netem delay 1ms")
    # (a user namespace of its own too, so that a user other than root can ask)
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "sh", "-c", probe],
                          capture_output=True)
    return done.returncode == 0


_RECEIVER = """
import socket, sys, time
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], 0)); server.listen(1)
print(server.getsockname()[1], flush=True)
conn, _ = server.accept(); total = 0; first = None
while True:
    chunk = conn.recv(1 << 20)
    if not chunk: break
    if first is None: first = time.perf_counter()
    total += len(chunk)
print(total, time.perf_counter() - (first or time.perf_counter()), flush=True)
"""
_SENDER = """
import socket, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
block = b"x" * (1 << 20); end = time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < end: conn.sendall(block)
conn.close()
"""


def measure_link(source: Any, target: Any, seconds: float) -> float:
    """Bit/s one TCP stream carries from ``source`` to ``target`` (``fabric.Host``s: inside their
    namespaces), counted by the receiver from its first byte to the end of the stream."""
    receiver = subprocess.Popen(target.command([sys.executable, "-c", _RECEIVER, target.address]),
                                stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        port = receiver.stdout.readline().strip()
        subprocess.run(source.command([sys.executable, "-c", _SENDER, target.address, port,
                                       str(seconds)]), check=True, timeout=seconds + 30)
        total, elapsed = receiver.stdout.readline().split()
        receiver.wait(timeout=30)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    return float(total) * 8 / max(float(elapsed), 1e-9)
