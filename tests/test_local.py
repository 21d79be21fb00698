"""Local mode's rendezvous stays on this host: with a private network namespace nothing the case
binds is visible outside it; without one, torch's stores listen on every interface (the control
that shows the check can fail)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from pytest_dlperf.core import ports
from pytest_dlperf.core.protocol import Protocol
from pytest_dlperf.core.spec import OptimizerSpec, RankSpec
from pytest_dlperf.core.topology import Topology
from pytest_dlperf.launch import LaunchError, local
from pytest_dlperf.launch.local import netns
from pytest_dlperf.launch.onehost import fabric, userhosts

pytestmark = pytest.mark.alone("it waits a bounded time for the agents' stores")

pytest.importorskip("torch")

def listeners_of_running_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              adapter: str, launcher: local.LocalLauncher) -> list[int]:
    """Start a 2-node local case that idles, and list the TCP ports its processes listen on,
    as seen from this (the host's) network namespace."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    spec = RankSpec(framework=adapter, model="idle", protocol=Protocol(1, 1, 1), batch_size=1,
                    optimizer=OptimizerSpec(0.0, 0.0, 0.0)).to_json()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            launcher.run(spec, Topology(2, 1, "cpu", "cpu"), tmp_path / "run", 10)
        except LaunchError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    me = psutil.Process()
    ports: set[int] = set()
    deadline = time.monotonic() + 8  # agents start their stores within ~3 s
    while time.monotonic() < deadline and not ports:
        tree = {p.pid for p in me.children(recursive=True)}
        ports |= {c.laddr.port for c in psutil.net_connections("tcp")
                  if c.status == psutil.CONN_LISTEN and c.pid in tree}
        time.sleep(0.5)
    thread.join(timeout=60)
    launcher.close()
    assert errors and errors[0].kind == "timeout"  # the case itself idled until killed
    return sorted(ports)


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
