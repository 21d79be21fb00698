"""Local nodes as network hosts (``launch.fabric``): real namespaces, veth pairs, a bridge, routes
and ``tc`` shaping, and the plugin's cases across them. Needs root, ``ip``, ``tc``, ``nsenter``;
skipped where this process cannot make namespaces (the loopback path is tested everywhere)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_dlperf.core.link import Link
from pytest_dlperf.launch.onehost import fabric
from pytest_dlperf.store.baselines import BaselineStore

# What a fabric is made of shares the machine (scripts/test's first pass); what a link carries
# and a slower link's verdict do not.

CAN, WHY = fabric.available()
needs_fabric = pytest.mark.skipif(not CAN, reason=f"no namespace hosts here: {WHY}")


# -- the link option's values -----------------------------------------------------------------

@pytest.mark.parametrize("raw, rate, delay, text", [
    ("10gbit", 10e9, None, "10gbit"), ("1gbit,0.2ms", 1e9, 0.2, "1gbit,0.2ms"),
    ("100mbit", 100e6, None, "100mbit"), ("12.5MBps", 100e6, None, "100mbit"),
    ("1gbit,50us", 1e9, 0.05, "1gbit,0.05ms"), ("unshaped", None, None, "unshaped"),
])
def test_link_values(raw: str, rate: float | None, delay: float | None, text: str) -> None:
    link = Link.parse(raw)
    assert (link.rate_bps, link.delay_ms, str(link)) == (rate, delay, text)


@pytest.mark.parametrize("raw, says", [
    ("10", "with a unit"), ("fast", "with a unit"), ("0gbit", "positive"),
    ("1gbit,3", "the delay after the comma must be a time with a unit"),
])
def test_bad_link_values_say_what_is_accepted(raw: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Link.parse(raw)


def test_a_bad_link_option_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--dlperf-link", "10 gigabit")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value for --dlperf-link=10 gigabit: '10 gigabit': the rate "
                                 "must be a positive number of bits per second with a unit*"])


# -- the fabric itself ------------------------------------------------------------------------

def _blackholes() -> str:
    return subprocess.run(["ip", "-4", "route", "show", "type", "blackhole"],
                          capture_output=True, text=True, check=True).stdout


@needs_fabric
def test_the_blackhole_route_is_in_place_before_the_first_address_and_gone_after() -> None:
    seen: list[tuple[str, bool]] = []
    made: fabric.Fabric | None = None

    def observe(command: list[str]) -> None:  # runs before each command; looks at the machine
        if "addr" in command and "add" in command:
            assert made is not None and made.subnet is not None
            seen.append((" ".join(command), str(made.subnet) in _blackholes()))

    made = fabric.Fabric(observe=observe)
    with made:
        hosts = made.ensure(2)
        subnet, names = str(made.subnet), [h.namespace for h in hosts]
        assert [ok for _, ok in seen] == [True, True], seen
        assert subnet in _blackholes()
        # no namespace has a way out: its only routes are its own subnet's
        routes = subprocess.run(["ip", "-n", names[0], "route"], capture_output=True,
                                text=True).stdout
        assert "default" not in routes and subnet in routes
    assert subnet not in _blackholes()
    left = fabric.leftovers()
    assert not [n for n in left["namespaces"] + left["links"] if made.tag in n], left
    assert not Path(made.record_path).exists()


_CONNECT = ("import socket, sys; s = socket.socket(); s.settimeout(2); "
            "print(s.connect_ex((sys.argv[1], 9)))")


@needs_fabric
def test_nodes_reach_each_other_and_the_root_namespace_reaches_none() -> None:
    import errno

    with fabric.Fabric() as made:
        first, second = made.ensure(2)
        node_to_node = subprocess.run(first.command([sys.executable, "-c", _CONNECT,
                                                     second.address]),
                                      capture_output=True, text=True, check=True).stdout
        from_root = subprocess.run([sys.executable, "-c", _CONNECT, second.address],
                                   capture_output=True, text=True, check=True).stdout
    # refused: the packet reached node 1, where nothing listens on port 9
    assert int(node_to_node) == errno.ECONNREFUSED
    # the blackhole route: never sent (EINVAL), not refused by a host somewhere else
    assert int(from_root) == errno.EINVAL


@needs_fabric
@pytest.mark.alone("it measures what a link carries against the shaped rate")
def test_a_shaped_link_carries_its_rate_and_an_unshaped_one_far_more() -> None:
    with fabric.Fabric(Link.parse("100mbit")) as shaped:
        slow = shaped.measure(seconds=1.0)
    with fabric.Fabric() as unshaped:
        fast = unshaped.measure(seconds=1.0)
    assert 60e6 < slow < 110e6, fabric.format_rate(slow)
    assert fast > 5 * slow, (fabric.format_rate(fast), fabric.format_rate(slow))


@needs_fabric
def test_a_host_that_fails_half_made_takes_the_whole_fabric_down() -> None:
    made = fabric.Fabric()
    made.ensure(1)
    tag, subnet = made.tag, str(made.subnet)
    with pytest.raises(fabric.FabricError, match="ip netns add"):
        made.add_host("no/such/name")  # a namespace name ip refuses
    left = fabric.leftovers()
    assert not [n for n in left["namespaces"] + left["links"] if tag in n], left
    assert subnet not in _blackholes() and not made.record_path.exists()
    made.ensure(2)  # a new fabric, usable
    try:
        assert made.tag == tag and len(made.hosts) == 2 and str(made.subnet) in _blackholes()
    finally:
        made.close()


_DIES = """
import os, signal
from pytest_dlperf.launch.onehost.fabric import Fabric
made = Fabric()
made.ensure(2)
print(made.tag, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@needs_fabric
def test_a_fabric_whose_owner_was_killed_is_swept_and_nothing_else() -> None:
    with fabric.Fabric() as alive:  # a live owner's fabric stays
        alive.ensure(1)
        died = subprocess.run([sys.executable, "-c", _DIES], capture_output=True, text=True)
        tag = died.stdout.strip()
        assert died.returncode == -9 and tag, died.stderr
        left = fabric.leftovers()
        assert any(tag in n for n in left["namespaces"]), left
        # What a live owner's fabric holds is in use, not left over; the dead owner's is not.
        live = fabric.live_parts()
        assert {h.namespace for h in alive.hosts} | {str(alive.subnet)} <= live, live
        assert not [part for part in live if tag in part], live
        assert tag in fabric.sweep()
        left = fabric.leftovers()
        assert not [n for n in left["namespaces"] + left["links"] if tag in n], left
        assert any(alive.tag in n for n in left["namespaces"]), left
        assert str(alive.subnet) in _blackholes()


@needs_fabric
def test_a_delay_the_kernel_cannot_add_is_a_usage_error(pytester: pytest.Pytester) -> None:
    if fabric.kernel_has_netem():
        pytest.skip("this kernel has netem: a delay is given (not the case on this project's VMs)")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--dlperf-link", "1gbit,0.2ms")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dlperf-link=1gbit,0.2ms asks for a delay, but this kernel "
                                 "has no netem qdisc*give the rate alone*"])


# -- cases across the nodes' links ------------------------------------------------------------

# ~1M parameters (4 MiB of gradients a step) and little compute: a step's time is mostly the
# all-reduce between the nodes, so the link's rate shows in the throughput.
WIDE = """
from pytest_dlperf import Parts, Workload


def wide(ctx):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    return Parts(model=model, inputs=torch.randn(ctx.batch_size, 1024),
                 targets=lambda: torch.randint(0, 10, (ctx.batch_size,)))


WIDE = Workload("wide", recipes={"torch": wide}, batch_size={"cpu": 8})
"""
WIDE_TEST = """
import pytest
from wide import WIDE


@pytest.mark.multinode
def test_wide(cluster, layout, throughput_meter):
    report = throughput_meter.measure("torch", WIDE)
    assert report.environment["data_parallel_ranks"] == cluster.world_size
"""
ACROSS = ["-p", "no:cacheprovider", "-m", "multinode", "--nodes", "2", "--devices-per-node",
          "1", "-k", "2n1d", "--dlperf-warmup-steps", "2", "--dlperf-steps", "5",
          "--dlperf-repeats", "2", "--dlperf-launches", "2", "--dlperf-baselines", "bl",
          "--dlperf-machine", "box", "--dlperf-unstable-cv", "10",
          "--dlperf-straggler-threshold", "0.99", "-rA"]


class Reshaper:
    """Behind the plugin's back, as a failing switch port or a neighbour's traffic would: every
    veth of a fabric made after ``start`` gets ``tc ... tbf rate RATE`` once the plugin has
    shaped it (to ``asked``) itself."""

    def __init__(self, rate: str, asked: str, veths: int = 2) -> None:
        self.rate, self.asked, self.veths = rate, asked, veths
        self.before = set(fabric.leftovers()["links"])
        self.done: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.done) < self.veths:
            links = {p.name for p in Path("/sys/class/net").glob(f"{fabric.PREFIX}*")}
            for link in links - self.before - set(self.done):
                if link.endswith("br"):
                    continue
                shown = subprocess.run(["tc", "qdisc", "show", "dev", link], capture_output=True,
                                       text=True).stdout
                if f"rate {self.asked}" not in shown:
                    continue  # the bridge, or a veth the plugin has not shaped yet
                shaped = subprocess.run(["tc", "qdisc", "replace", "dev", link, "root", "tbf",
                                         "rate", self.rate, "burst", "16kb", "latency", "50ms"],
                                        capture_output=True)
                if shaped.returncode == 0:
                    self.done.append(link)
            time.sleep(0.02)

    def __enter__(self) -> Reshaper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@needs_fabric
@pytest.mark.alone("it judges a slower link by the case's timings")
@pytest.mark.usefixtures("subprocess_env")
def test_a_slower_link_behind_the_plugins_back_is_a_regression(
        pytester: pytest.Pytester) -> None:
    """What a communication regression on a real cluster looks like: the fingerprint (10 Gbit/s
    asked) is unchanged, the link is not. Under DDP the gradients' all-reduce crosses it; under
    FSDP2 (issue 40) the parameters' all-gathers and the gradients' reduce-scatters do. Both
    layouts are cases of the same two sessions (one fabric each, its two veths slowed in the
    second)."""
    pytester.makepyfile(wide=WIDE, test_wide=WIDE_TEST)
    at_10g = [*ACROSS, "--dlperf-link", "10gbit", "--dlperf-layouts", "dp,fsdp"]
    idents = ("2n1d", "2n1d-fsdp2")
    recorded = pytester.runpytest_subprocess(*at_10g, "--dlperf-update-baselines", "--dlperf-json",
                                             "rec.json", timeout=400)
    recorded.assert_outcomes(passed=2)
    cases = {b["name"]: b["extra_info"]
             for b in json.loads((pytester.path / "rec.json").read_text())["benchmarks"]}
    assert sorted(cases) == sorted(f"test_wide[{ident}]" for ident in idents), sorted(cases)
    for case in cases.values():
        network = case["network"]
        assert network["link"] == "10gbit" and case["fingerprint"]["link"] == "10gbit"
        assert len(set(network["addresses"])) == 2, network  # two nodes, two addresses
    # One device trains alike under both layouts: the 1n1d reference is measured once (a
    # launch of each of them before, whose medians differed).
    dp, fsdp = (cases[f"test_wide[{ident}]"] for ident in idents)
    assert dp["samples_per_s"] / dp["speedup"] == pytest.approx(
        fsdp["samples_per_s"] / fsdp["speedup"], rel=1e-9)

    # The link slowed behind the plugin's back, judged as a user's run is, at the default
    # tolerance: at 200 Mbit/s a step of either layout takes ~0.2-0.35 s to carry the 4 MiB of
    # gradients (quiet here, 2026-12-07: dp 78.9 samples/s against 875 recorded, -91.0%, p 5e-5;
    # fsdp2 46.2 against 518, -91.1%, p 0.002), beyond the factor of 2 that this VM drifts
    # between runs, so the verdict rests on the launches alone. (Before: 50 Mbit/s at a 90%
    # tolerance, -98%, and a third session between, unchanged, that passed at 90%, as it does
    # whatever this VM does: the test took 142 s, now 69. What says the link is the cause is the
    # message's split of the step, below.)
    with Reshaper("200mbit", asked="10Gbit") as reshaper:
        # (judged by its throughput: no 1n1d reference launched for a speedup, a launch less)
        slowed = pytester.runpytest_subprocess(*at_10g, "--dlperf-speedup", "off", timeout=400)
    assert len(reshaper.done) >= 2, reshaper.done  # both nodes' veths were slowed
    slowed.assert_outcomes(failed=2)
    for ident in idents:
        slowed.stdout.fnmatch_lines([f"*REGRESSION in test_wide.py::test_wide[[]{ident}[]]*"])
    # issue 41: the message says where the time went
    line = next(x for x in slowed.outlines if "REGRESSION in test_wide.py::test_wide[2n1d]" in x)
    moved, _, unchanged = line.split("Where the step's time went")[1].rpartition(";")
    assert "exposed communication" in moved and "-> " in moved, line
    assert "forward" in unchanged and "backward" in unchanged, line

    # Another link setting never shares the baseline recorded at 10 Gbit/s: the link asked is
    # in the fingerprint (above), and a fingerprint's baseline is a file of its own. (A fourth
    # session on two nodes, ~25 s, showed the same through a run's "no-baseline" verdict.)
    store = BaselineStore(pytester.path / "bl")  # ACROSS's --dlperf-baselines
    files = set((pytester.path / "bl").rglob("*.json"))
    for case in cases.values():
        fingerprint = case["fingerprint"]
        recorded_file = store.path_for(case["case"], fingerprint)
        assert recorded_file in files
        other = store.path_for(case["case"], {**fingerprint, "link": "1gbit"})
        assert other != recorded_file and not other.exists()
    assert len(files) == 2, files


@needs_fabric
@pytest.mark.usefixtures("subprocess_env")
def test_tensorflow_workers_train_across_two_node_hosts(pytester: pytest.Pytester) -> None:
    """TensorFlow's gRPC workers bind their node's address (torch's side: the WIDE test above;
    OneFlow's: tests/test_oneflow.py). A worker bound to an address its peer cannot reach
    (loopback, the machine's name) would leave MultiWorkerMirroredStrategy waiting."""
    pytest.importorskip("tensorflow")
    from test_slurm import RECIPES, SCALING

    pytester.makepyfile(mlp_recipes=RECIPES,
                        test_scale=SCALING.replace('"torch"', '"tensorflow"'))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-m", "multinode", "--nodes", "2", "--devices-per-node", "1",
        "-k", "2n1d", "--dlperf-warmup-steps", "1", "--dlperf-steps", "2", "--dlperf-repeats",
        "1", "--dlperf-launches", "1", "--dlperf-json", "r.json", "--dlperf-unstable-cv", "10",
        "--dlperf-timeout", "180", "--dlperf-speedup", "off",  # (no 1n1d TensorFlow beside it)
        timeout=300)
    result.assert_outcomes(passed=1)
    (bench,) = json.loads((pytester.path / "r.json").read_text())["benchmarks"]
    network = bench["extra_info"]["network"]
    assert len(set(network["addresses"])) == 2 and network["link"] == "unshaped", network
