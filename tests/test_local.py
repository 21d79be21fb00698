"""Local mode's rendezvous stays on this host: with a private network namespace nothing the case
binds is visible outside it; without one, torch's stores listen on every interface (the control
that shows the check can fail)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from pytest_dlperf.core import ports
from pytest_dlperf.core.protocol import Protocol
from pytest_dlperf.core.spec import OptimizerSpec, RankSpec
from pytest_dlperf.core.topology import Topology
from pytest_dlperf.launch import local
from pytest_dlperf.launch.local import netns
from pytest_dlperf.launch.onehost import fabric, userhosts

pytest.importorskip("torch")


def listening_ports(pid: int) -> dict[int, int]:
    """The TCP listeners of ``pid``'s network namespace, as that namespace sees them
    (``/proc/PID/net/tcp``: the namespace's table, whichever namespace reads it): socket inode
    to port."""
    ports: dict[int, int] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue  # ended meanwhile
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
    return ports


def sockets_of(pid: int) -> set[int]:
    """The inodes of the sockets ``pid`` holds open."""
    inodes: set[int] = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass  # ended meanwhile
    return inodes


def listeners_of_running_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              adapter: str, launcher: local.LocalLauncher) -> list[int]:
    """Start a 2-node local case that idles, wait until its stores listen where its processes
    are (their own namespace's table), and list the TCP ports its processes listen on as seen
    from this (the host's) network namespace; then stop it. (Before, the host was looked at for
    a fixed 8 s and an empty answer could mean the stores had not started yet: the test ran
    alone, 10 s each; now it waits for what it checks.)"""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    spec = RankSpec(framework=adapter, model="idle", protocol=Protocol(1, 1, 1), batch_size=1,
                    optimizer=OptimizerSpec(0.0, 0.0, 0.0)).to_json()
    topology, run_dir = Topology(2, 1, "cpu", "cpu"), tmp_path / "run"
    run_dir.mkdir()
    meeting = launcher.rendezvous(topology, run_dir)
    launch = launcher.start(spec, topology, run_dir, meeting, 120)
    me = psutil.Process()
    try:
        inside: set[int] = set()
        deadline = time.monotonic() + 90  # ~3 s quiet; the machine may be shared
        while not inside and time.monotonic() < deadline:
            tree = {p.pid for p in me.children(recursive=True)}
            held = {inode for pid in tree for inode in sockets_of(pid)}
            inside = {port for pid in tree for inode, port in listening_ports(pid).items()
                      if inode in held}
            time.sleep(0.2)
        assert inside, "the case's stores never listened, seen from inside its namespace"
        tree = {p.pid for p in me.children(recursive=True)}
        return sorted({c.laddr.port for c in psutil.net_connections("tcp")
                       if c.status == psutil.CONN_LISTEN and c.pid in tree})
    finally:
        launcher.stop(launch)
        launcher.close()


@pytest.mark.parametrize("node_hosts", [False, True, "user"],
                         ids=["one-namespace", "node-hosts", "node-hosts-in-a-user-namespace"])
def test_nothing_listens_outside_the_case_namespace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        hanging_adapter: Callable[[Path], str], node_hosts: bool | str) -> None:
    """Every way: the nodes' agents in one private namespace, or each in its own host (root's
    fabric, or built inside the launch's user namespace)."""
    if node_hosts is True and not fabric.available()[0]:
        pytest.skip(f"no nodes as hosts here: {fabric.available()[1]}")
    if node_hosts == "user" and not userhosts.available()[0]:
        pytest.skip(f"no nodes as hosts in a user namespace here: {userhosts.available()[1]}")
    if not node_hosts and not netns.available():
        pytest.skip("unprivileged network namespaces are not available on this host")
    launcher = local.LocalLauncher(node_hosts=node_hosts)
    assert launcher.isolation == "network-namespace"
    assert launcher.hosts_how == {False: "none", True: "root", "user": "user"}[node_hosts]
    assert listeners_of_running_case(tmp_path, monkeypatch, hanging_adapter(tmp_path),
                                     launcher) == []


def test_without_a_namespace_the_stores_listen_on_the_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        hanging_adapter: Callable[[Path], str]) -> None:
    monkeypatch.setattr(netns, "available", lambda: False)
    launcher = local.LocalLauncher(node_hosts=False)
    assert launcher.isolation == "none"
    assert listeners_of_running_case(tmp_path, monkeypatch, hanging_adapter(tmp_path),
                                     launcher) != []


def test_ports_handed_out_lie_below_the_kernels_ephemeral_range() -> None:
    """The kernel gives every outgoing connection (a store client, a gloo pair) a port of its
    ephemeral range; a port picked there is free when picked and may be a connection's by the
    time a rank binds it (CI's layouts run: EADDRINUSE on a store port picked minutes before).
    Below that range only a listener takes a port."""
    low = int(ports.EPHEMERAL_RANGE.read_text().split()[0])
    picked = ports.free_loopback_ports(40)
    assert len(set(picked)) == 40
    assert all(ports.LOWEST_PORT <= port < low for port in picked), picked
    for port in picked[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_kernel_with_no_room_below_its_ephemeral_range_still_gives_a_free_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", ranges)
    port = ports.free_loopback_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
