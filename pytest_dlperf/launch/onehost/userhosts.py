"""Nodes as network hosts without root: the same layout as ``fabric`` (a namespace per node, each
joined by a veth pair to a bridge, each with its own address and shaped link), built inside a
user namespace of the run's own.

``unshare --user --map-root-user --net`` gives an unprivileged process a network namespace in
which it may make bridges, veth pairs, more network namespaces and ``tc`` qdiscs. Local mode
already starts a case's processes in one (``netns``); where the kernel lets that namespace make
veth pairs (``available``), the process inside builds the nodes there (``build``) and starts
each node's agent in its node's namespace (``nsenter --net`` into a process holding it).

Why no blackhole route: the outer namespace has loopback and the bridge and nothing else (no
device that leads out of it, no default route), so no packet of these addresses can reach the
machine's own network, let alone another machine; the root namespace never sees them. Nothing
needs taking down either: every namespace and link belongs to the case's processes and goes with
the last of them (and they end with pytest, SIGKILL included: ``core.lifeline``).
"""

from __future__ import annotations

import functools
import ipaddress
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ...core.lifeline import tethered
from ...core.link import Link
from . import linkprobe

# Private to each case's own namespace: the same range every time is no clash.
SUBNET = ipaddress.IPv4Network("10.251.0.0/24")
BRIDGE = "dlpfbr"
ENTER = ["unshare", "--user", "--map-root-user", "--net"]


@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """Whether this process may build nodes as hosts in a user namespace, and if not, why."""
    if not sys.platform.startswith("linux"):
        return False, "network namespaces are Linux only"
    missing = [tool for tool in ("ip", "tc", "nsenter", "unshare") if not shutil.which(tool)]
    if missing:
        return False, f"{', '.join(missing)} not found (Debian: apt-get install iproute2 util-linux)"
    probe = ("ip link add dlpfb type bridge && ip link add dlpfv type veth peer name dlpfp && "
             "ip link set dlpfv master dlpfb && tc qdisc add dev dlpfv root tbf rate 1gbit "
             "burst 16kb latency 50ms")
    try:
        done = subprocess.run([*ENTER, "sh", "-c", probe], capture_output=True, text=True,
                              timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"a user namespace could not be made ({exc})"
    if done.returncode != 0:
        return False, ("a user namespace here cannot make a bridge, veth pairs and qdiscs "
                       f"({done.stderr.strip()[:200]})")
    return True, ""


def addresses(count: int) -> list[str]:
    """The nodes' addresses, node 0 first."""
    return [str(SUBNET.network_address + 10 + index) for index in range(count)]


@dataclass(frozen=True)
class Node:
    """One node built inside the user namespace: the process holding its network namespace."""

    label: str
    address: str
    holder: subprocess.Popen[str]

    def command(self, command: list[str]) -> list[str]:
        return ["nsenter", "-t", str(self.holder.pid), "--net", "--", *command]


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip() or done.stdout}")


def build(count: int, link: Link) -> list[Node]:
    """Inside the user namespace (its root): the bridge and ``count`` nodes on it, each link
    shaped to ``link`` in both directions. The holders end with this process."""
    _run(["ip", "link", "set", "lo", "up"])
    _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    _run(["ip", "link", "set", BRIDGE, "addrgenmode", "none"])
    _run(["ip", "link", "set", BRIDGE, "up"])
    nodes: list[Node] = []
    try:
        for index, address in enumerate(addresses(count)):
            holder = subprocess.Popen(
                tethered(["unshare", "--net", "--", "sh", "-c", "echo; exec sleep infinity"]),
                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
            nodes.append(Node(f"node{index}", address, holder))
            assert holder.stdout is not None
            holder.stdout.readline()  # its namespace exists
            veth = f"dlpfv{index}"
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns",
                  str(holder.pid)])
            _run(["ip", "link", "set", veth, "addrgenmode", "none"])
            _run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
            inside = nodes[-1].command
            _run(inside(["ip", "link", "set", "lo", "up"]))
            _run(inside(["ip", "addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", "eth0"]))
            _run(inside(["ip", "link", "set", "eth0", "up"]))
            if link.shaped:
                _run(["tc", *linkprobe.shaping(link, veth)])
                _run(inside(["tc", *linkprobe.shaping(link, "eth0")]))
    except BaseException:
        release(nodes)
        raise
    return nodes


def release(nodes: list[Node]) -> None:
    for node in nodes:
        if node.holder.poll() is None:
            node.holder.kill()
        node.holder.wait()


def measure(link: Link, seconds: float = 0.5) -> float:
    """Bit/s one TCP stream carries from node 0 to node 1 of a pair built as a case's are (in a
    user namespace of its own, gone when this returns)."""
    done = subprocess.run([*ENTER, sys.executable, "-m", "pytest_dlperf.launch.onehost.userhosts",
                           "measure", str(link), str(seconds)], capture_output=True, text=True,
                          timeout=seconds + 60)
    if done.returncode != 0:
        raise OSError(f"measuring the link failed: {done.stderr.strip()[-300:]}")
    return float(done.stdout.split()[-1])


def main(argv: list[str]) -> int:
    if argv[:1] != ["measure"] or len(argv) != 3:
        print("usage: python -m pytest_dlperf.launch.onehost.userhosts measure LINK SECONDS",
              file=sys.stderr)
        return 2
    nodes = build(2, Link.parse(argv[1]))
    try:
        print(linkprobe.measure_link(nodes[0], nodes[1], float(argv[2])))
    finally:
        release(nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
