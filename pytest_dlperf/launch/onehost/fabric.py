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

import functools
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.link import Link, format_rate
from . import linkprobe

RECORDS = Path("/run/pytest-dlperf/fabrics")
NETNS_DIR = Path("/run/netns")
PREFIX = "dlpf"  # every bridge, veth and namespace a fabric makes starts with it
# Where addresses are taken from: 10.<second>.<third>.0/24 with <second> in this span.
_SECOND_OCTETS = range(200, 250)

Observer = Callable[[list[str]], None]


# -- what this machine allows -----------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """Whether this process can build a fabric, and if not, why: root, the tools, and a bridge
    made and removed here (root in a container may lack the capability)."""
    if not sys.platform.startswith("linux"):
        return False, "network namespaces are Linux only"
    if os.geteuid() != 0:
        return False, "making network namespaces, a bridge and routes needs root"
    missing = [tool for tool in ("ip", "tc", "nsenter") if not shutil.which(tool)]
    if missing:
        return False, f"{', '.join(missing)} not found (Debian: apt-get install iproute2 util-linux)"
    probe = f"{PREFIX}p{os.getpid() % 10**8}"
    made = subprocess.run(["ip", "link", "add", probe, "type", "bridge"], capture_output=True,
                          text=True)
    if made.returncode != 0:
        return False, f"cannot make a bridge here ({made.stderr.strip()})"
    subprocess.run(["ip", "link", "del", probe], capture_output=True)
    return True, ""


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

    def _open(self) -> ipaddress.IPv4Network:
        """The record, the range and its blackhole route, the bridge: once, before any host.
        The range is chosen and routed under a lock, so two runs never take one /24."""
        ok, why = available()
        if not ok:
            raise FabricError(why)
        sweep()
        import fcntl

        import psutil

        me = psutil.Process()
        self._record = {"owner": me.pid, "started": me.create_time(), "netns": _netns_id(),
                        "subnet": None, "bridge": self.bridge, "namespaces": [], "veths": []}
        self._save()  # before anything exists: a crash from here on is swept
        with open(RECORDS / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = _free_subnet()
            self._run(["ip", "route", "add", "blackhole", str(subnet)])
            self._record["subnet"] = str(subnet)  # ours to remove only once it is added
            self._save()
        _check_blackholed(subnet)
        self._run(["ip", "link", "add", self.bridge, "type", "bridge"])
        # no address on the bridge, IPv6 link-local included
        self._run(["ip", "link", "set", self.bridge, "addrgenmode", "none"])
        self._run(["ip", "link", "set", self.bridge, "up"])
        return subnet

    def add_host(self, label: str) -> Host:
        """A new node: its namespace, veth pair, address and shaped link. If any step fails,
        the whole fabric is taken down (the next call builds a new one)."""
        try:
            return self._add_host(label)
        except BaseException:
            self.close()
            raise

    def _add_host(self, label: str) -> Host:
        if self.subnet is None:
            self.subnet = self._open()
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
        self._run(["ip", "link", "set", host.veth, "addrgenmode", "none"])
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
        if self.link.shaped:
            self._run(["tc", *linkprobe.shaping(self.link, host.veth)])
            self._run(["tc", "-n", host.namespace, *linkprobe.shaping(self.link, "eth0")])

    def measure(self, seconds: float = 0.5) -> float:
        """Bit/s carried from the first host to the second over TCP (one stream, ``seconds``),
        measured once and kept."""
        if self._measured is None:
            a, b = self.ensure(2)[:2]
            self._measured = linkprobe.measure_link(a, b, seconds)
        return self._measured

    # -- taking it down ---------------------------------------------------------------------

    def close(self) -> None:
        """Take everything down; the record stays (for the next sweep) if anything did not go."""
        if self._record:
            if teardown(self._record):
                self.record_path.unlink(missing_ok=True)
        self._record = {}
        self.hosts = []
        self.subnet = None


class FabricError(RuntimeError):
    pass


def teardown(record: dict[str, Any]) -> bool:
    """Remove what a record lists: what runs in its namespaces, the namespaces (their eth0
    and so the veth pairs go with them), leftover veths, the bridge, then the route (only once
    no namespace with an address is left). Whether everything went."""
    for namespace in record.get("namespaces", []):
        kill_namespace_processes(namespace)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    for veth in record.get("veths", []):
        if Path("/sys/class/net", veth).exists():
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
    if record.get("bridge") and Path("/sys/class/net", record["bridge"]).exists():
        subprocess.run(["ip", "link", "del", record["bridge"]], capture_output=True)
    left = [n for n in record.get("namespaces", []) if (NETNS_DIR / n).exists()]
    left += [link for link in [*record.get("veths", []), record.get("bridge") or ""]
             if link and Path("/sys/class/net", link).exists()]
    if left:
        return False
    if record.get("subnet"):
        subprocess.run(["ip", "route", "del", "blackhole", record["subnet"]], capture_output=True)
    return True


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


def records() -> Iterator[tuple[Path, dict[str, Any], bool]]:
    """Each fabric's record on this machine: its path, what it says, and whether its owner
    still runs. Records that cannot be read (one being written) are left out."""
    from ...core.lifeline import alive

    for path in sorted(RECORDS.glob("*.json")) if RECORDS.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            owner, started = int(record["owner"]), float(record["started"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        yield path, record, alive(owner, started)


def live_parts() -> set[str]:
    """The namespaces, links, bridges and subnets of the fabrics whose owner still runs (another
    pytest's, still in use: not left over)."""
    return {part for _, record, live in records() if live
            for part in (*record.get("namespaces", []), *record.get("veths", []),
                         record.get("bridge"), record.get("subnet")) if part}


def sweep() -> list[str]:
    """Remove the fabrics whose owner is gone (a run SIGKILLed, or a crash): their records say
    what they made. Returns the tags removed."""
    removed = []
    here = _netns_id()
    for path, record, live in records():
        if live or record.get("netns", here) != here:
            continue  # a live run's, or made from another network namespace (a container)
        if teardown(record):
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


def _netns_id() -> int:
    """This process's network namespace (its inode): records made in another one (a
    container's) are not this one's to sweep."""
    return os.stat("/proc/self/ns/net").st_ino


def _check_blackholed(subnet: ipaddress.IPv4Network) -> None:
    """The kernel's own answer for where the range's addresses go, from the root namespace:
    the blackhole, not a route of a policy rule ahead of the main table (a VPN's), else no
    address is given."""
    for address in (subnet.network_address + 10, subnet.broadcast_address - 1):
        done = subprocess.run(["ip", "-4", "route", "get", str(address)], capture_output=True,
                              text=True)
        if done.returncode == 0 and "blackhole" not in done.stdout:
            raise FabricError(f"{address} would be routed ({done.stdout.strip()!r}) despite the "
                              f"blackhole route for {subnet} (a policy rule ahead of the main "
                              "table?): no namespace gets an address")


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that overlaps nothing this machine routes or owns (the default route, 0/0,
    aside: it overlaps everything, and the blackhole route is what overrides it), nor another
    fabric's range."""
    taken = [net for net in _taken_networks() if net.prefixlen > 0]
    for _, record, _ in records():
        try:
            taken.append(ipaddress.IPv4Network(record["subnet"]))
        except (ValueError, KeyError, TypeError):
            continue
    rng = secrets.SystemRandom()
    for _ in range(200):
        candidate = ipaddress.IPv4Network(
            f"10.{rng.choice(list(_SECOND_OCTETS))}.{rng.randrange(256)}.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise FabricError("no free 10.x.y.0/24 for the nodes' addresses: every candidate overlaps a "
                      "route or address of this machine")


kernel_has_netem = linkprobe.kernel_has_netem

__all__ = ["Fabric", "FabricError", "Host", "Link", "available", "format_rate",
           "kernel_has_netem", "leftovers", "live_parts", "records", "sweep", "teardown"]
