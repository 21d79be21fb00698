"""Nodes as network hosts on this machine: one network namespace per node, each joined by a veth
pair to a private bridge, each with its own address, its link shaped to a rate (``Link``).

Traffic never leaves the machine:

- the addresses come from one private /24 that no route or address of this machine touches;
- **before** any namespace gets an address, the root namespace gets a ``blackhole`` route for
  that whole /24 (without one, a client in the root namespace sent traffic for such an address
  out through the default route, and something outside answered); the bridge itself has no
  address, and no namespace gets a default route;
- clients run inside a node's namespace (``Host.command``);
- ``Fabric.close`` removes every namespace, link and route (and kills what still runs in a
  namespace); a fabric whose owner died without closing it (SIGKILL) is removed by the next
  ``sweep``, which every new fabric runs first. What a fabric made is written to its record
  (``RECORDS``) *before* it is made, so a sweep finds everything.

Needs root (``ip netns``, ``tc``, bridges): ``available()`` says whether this process can.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..core.link import Link, format_rate

RECORDS = Path("/run/pytest-dlperf/fabrics")
NETNS_DIR = Path("/run/netns")
PREFIX = "dlpf"  # every bridge, veth and namespace a fabric makes starts with it
# Where addresses are taken from: 10.<second>.<third>.0/24 with <second> in this span.
_SECOND_OCTETS = range(200, 250)
# The queue TBF may hold before it drops.
_TBF_LATENCY = "50ms"

Observer = Callable[[list[str]], None]


# -- what this machine allows -----------------------------------------------------------------

def available() -> tuple[bool, str]:
    """Whether this process can build a fabric, and if not, why."""
    if not sys.platform.startswith("linux"):
        return False, "network namespaces are Linux only"
    if os.geteuid() != 0:
        return False, "making network namespaces, a bridge and routes needs root"
    missing = [tool for tool in ("ip", "tc", "nsenter") if not shutil.which(tool)]
    if missing:
        return False, f"{', '.join(missing)} not found (Debian: apt-get install iproute2 util-linux)"
    return True, ""


def kernel_has_netem() -> bool:
    """Whether this kernel can add a delay (the netem qdisc), tried on a dummy device in a
    namespace of its own that vanishes with the probe."""
    if not shutil.which("unshare"):
        return False
    probe = ("ip link add dlpfprobe type dummy && ip link set dlpfprobe up && "
             "tc qdisc add dev dlpfprobe root netem delay 1ms")
    done = subprocess.run(["unshare", "--net", "sh", "-c", probe], capture_output=True)
    return done.returncode == 0


# -- hosts and the fabric ---------------------------------------------------------------------

@dataclass(frozen=True)
class Host:
    """One node: its namespace (``/run/netns/<namespace>``), its address, the root side of its
    veth pair (``veth``; ``eth0`` inside)."""

    label: str
    namespace: str
    address: str
    veth: str

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.namespace)

    def command(self, command: list[str]) -> list[str]:
        """``command``, run inside this host's namespace (its network only: the filesystem,
        /sys and the cgroups stay the machine's)."""
        return ["nsenter", f"--net={self.netns_path}", "--", *command]


@dataclass
class Fabric:
    """A private bridge and the hosts on it. ``observe``: called with each command before it
    runs (a test watches the order of what is done)."""

    link: Link = field(default_factory=Link)
    observe: Observer | None = None
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: list[Host] = field(default_factory=list)
    subnet: ipaddress.IPv4Network | None = None
    _record: dict[str, Any] = field(default_factory=dict)
    _measured: float | None = None

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.tag}br"

    @property
    def record_path(self) -> Path:
        return RECORDS / f"{self.tag}.json"

    def __enter__(self) -> Fabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- building ---------------------------------------------------------------------------

    def _run(self, command: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        if self.observe is not None:
            self.observe(command)
        done = subprocess.run(command, capture_output=True, text=True)
        if check and done.returncode != 0:
            raise FabricError(f"{' '.join(command)} failed: {done.stderr.strip() or done.stdout}")
        return done

    def _save(self) -> None:
        RECORDS.mkdir(parents=True, exist_ok=True)
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._record))
        os.replace(tmp, self.record_path)

    def _open(self) -> None:
        """The record, the range and its blackhole route, the bridge: once, before any host."""
        ok, why = available()
        if not ok:
            raise FabricError(why)
        sweep()
        import psutil

        me = psutil.Process()
        self.subnet = _free_subnet()
        self._record = {"owner": me.pid, "started": me.create_time(), "subnet": str(self.subnet),
                        "bridge": self.bridge, "namespaces": [], "veths": []}
        self._save()  # before anything exists: a crash from here on is swept
        self._run(["ip", "route", "add", "blackhole", str(self.subnet)])
        shown = self._run(["ip", "route", "show", "type", "blackhole", str(self.subnet)]).stdout
        if str(self.subnet.network_address) not in shown:
            raise FabricError(f"the blackhole route for {self.subnet} did not appear "
                              f"(ip route shows {shown!r}): no address will be given")
        self._run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._run(["ip", "link", "set", self.bridge, "up"])

    def add_host(self, label: str) -> Host:
        """A new node: its namespace, veth pair, address and shaped link."""
        if self.subnet is None:
            self._open()
        assert self.subnet is not None
        index = len(self.hosts)
        host = Host(label=label, namespace=f"{PREFIX}-{self.tag}-{label}",
                    address=str(self.subnet.network_address + 10 + index),
                    veth=f"{PREFIX}{self.tag}v{index}")
        self._record["namespaces"].append(host.namespace)
        self._record["veths"].append(host.veth)
        self._save()
        self._run(["ip", "netns", "add", host.namespace])
        self._run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
                   "netns", host.namespace])
        self._run(["ip", "link", "set", host.veth, "master", self.bridge, "up"])
        in_ns = ["ip", "-n", host.namespace]
        self._run([*in_ns, "link", "set", "lo", "up"])
        self._run([*in_ns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0"])
        self._run([*in_ns, "link", "set", "eth0", "up"])
        self._shape(host)
        self.hosts.append(host)
        return host

    def ensure(self, count: int, label: str = "node{}") -> list[Host]:
        """The first ``count`` hosts, made as needed (labels node0, node1, ...)."""
        while len(self.hosts) < count:
            self.add_host(label.format(len(self.hosts)))
        return self.hosts[:count]

    def _shape(self, host: Host) -> None:
        """The link in both directions: into the node (the veth's bridge side) and out of it
        (eth0 inside)."""
        if not self.link.shaped:
            return
        for where in (["tc"], ["tc", "-n", host.namespace]):
            device = host.veth if len(where) == 1 else "eth0"
            if self.link.delay_ms is not None:
                rate = ([] if self.link.rate_bps is None
                        else ["rate", f"{int(self.link.rate_bps)}bit"])
                self._run([*where, "qdisc", "replace", "dev", device, "root", "netem", "delay",
                           f"{self.link.delay_ms * 1000:.0f}us", *rate, "limit", "10000"])
            else:
                assert self.link.rate_bps is not None
                self._run([*where, "qdisc", "replace", "dev", device, "root", "tbf", "rate",
                           f"{int(self.link.rate_bps)}bit", "burst",
                           str(self.link.burst_bytes()), "latency", _TBF_LATENCY])

    def measure(self, seconds: float = 0.5) -> float:
        """Bit/s carried from the first host to the second over TCP (one stream, ``seconds``),
        measured once and kept."""
        if self._measured is None:
            a, b = self.ensure(2)[:2]
            self._measured = measure_link(a, b, seconds)
        return self._measured

    # -- taking it down ---------------------------------------------------------------------

    def close(self) -> None:
        if self._record:
            teardown(self._record)
            self.record_path.unlink(missing_ok=True)
        self._record = {}
        self.hosts = []
        self.subnet = None


class FabricError(RuntimeError):
    pass


def teardown(record: dict[str, Any]) -> None:
    """Remove what a record lists: what runs in its namespaces, the namespaces (their eth0
    and so the veth pairs go with them), leftover veths, the bridge, the route."""
    for namespace in record.get("namespaces", []):
        kill_namespace_processes(namespace)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    for veth in record.get("veths", []):
        if Path("/sys/class/net", veth).exists():
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
    if record.get("bridge") and Path("/sys/class/net", record["bridge"]).exists():
        subprocess.run(["ip", "link", "del", record["bridge"]], capture_output=True)
    if record.get("subnet"):
        subprocess.run(["ip", "route", "del", "blackhole", record["subnet"]], capture_output=True)


def kill_namespace_processes(namespace: str, grace_s: float = 3.0) -> None:
    """SIGTERM then SIGKILL to every process in the namespace (``ip netns pids``)."""
    def pids() -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        victims = pids()
        if not victims:
            return
        for pid in victims:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids() and time.monotonic() < deadline:
            time.sleep(0.05)


def sweep() -> list[str]:
    """Remove the fabrics whose owner is gone (a run SIGKILLed, or a crash): their records say
    what they made. Returns the tags removed."""
    from ..core.lifeline import alive

    removed = []
    for path in sorted(RECORDS.glob("*.json")) if RECORDS.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            owner, started = int(record["owner"]), float(record["started"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if alive(owner, started):
            continue
        teardown(record)
        path.unlink(missing_ok=True)
        removed.append(path.stem)
    return removed


def leftovers() -> dict[str, list[str]]:
    """Every namespace, link and blackhole route of a fabric on this machine now (any owner)."""
    namespaces = sorted(p.name for p in NETNS_DIR.glob(f"{PREFIX}-*")) if NETNS_DIR.is_dir() else []
    links = sorted(p.name for p in Path("/sys/class/net").glob(f"{PREFIX}*"))
    routes = []
    for path in sorted(RECORDS.glob("*.json")) if RECORDS.is_dir() else []:
        try:
            routes.append(str(json.loads(path.read_text())["subnet"]))
        except (OSError, ValueError, KeyError):
            pass
    shown = subprocess.run(["ip", "-4", "route", "show", "type", "blackhole"],
                           capture_output=True, text=True).stdout
    ours = [line.split()[1] for line in shown.splitlines()
            if len(line.split()) > 1 and _in_our_span(line.split()[1])]
    return {"namespaces": namespaces, "links": links, "routes": sorted(set(routes) | set(ours))}


def _in_our_span(text: str) -> bool:
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    first = int(str(net.network_address).split(".")[0])
    second = int(str(net.network_address).split(".")[1])
    return first == 10 and second in _SECOND_OCTETS and net.prefixlen == 24


def _taken_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 prefix this machine routes or has an address in (all routing tables)."""
    taken = []
    for command in (["ip", "-4", "-o", "route", "show", "table", "all"], ["ip", "-4", "-o", "addr"]):
        out = subprocess.run(command, capture_output=True, text=True).stdout
        for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", out):
            try:
                taken.append(ipaddress.IPv4Network(token, strict=False))
            except ValueError:
                pass
    return taken


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that overlaps nothing this machine routes or owns (the default route, 0/0,
    aside: it overlaps everything, and the blackhole route is what overrides it)."""
    taken = [net for net in _taken_networks() if net.prefixlen > 0]
    rng = secrets.SystemRandom()
    for _ in range(200):
        candidate = ipaddress.IPv4Network(
            f"10.{rng.choice(list(_SECOND_OCTETS))}.{rng.randrange(256)}.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise FabricError("no free 10.x.y.0/24 for the nodes' addresses: every candidate overlaps a "
                      "route or address of this machine")


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


def measure_link(source: Host, target: Host, seconds: float) -> float:
    """Bit/s one TCP stream carries from ``source`` to ``target`` (both inside their
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


__all__ = ["Fabric", "FabricError", "Host", "Link", "available", "format_rate",
           "kernel_has_netem", "leftovers", "measure_link", "sweep", "teardown"]
