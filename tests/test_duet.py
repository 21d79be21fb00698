"""Duet A/B (``--dlperf-ab-mode duet``): the barrier both sides' ranks meet at (real
processes), a rank's pinning to its half, the host's halves, and the cases it refuses by name.
The end-to-end A/B runs, in turns and in duet beside CPU hogs, are in ``test_ab``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_dlperf.core.topology import Topology
from pytest_dlperf.launch import Cluster
from pytest_dlperf.launch.base import Launcher
from pytest_dlperf.plugin import duet
from pytest_dlperf.rank.barrier import Barrier
from pytest_dlperf.rank.worker import own_cpus

pytestmark = pytest.mark.alone(
    "a duet's sides share out the machine's cores and pace each other by the clock")

# One party of a barrier in a process of its own: arrives after DELAY seconds at each of its
# phases, and prints when each wait ended (or the error).
PARTY = """
import json, sys, time
from pathlib import Path
from pytest_dlperf.rank.barrier import Barrier, BarrierError
folder, parties, delay, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
barrier = Barrier(Path(folder), parties, timeout, sys.argv[5])
released = []
try:
    for phase in ("window-0", "window-1"):
        time.sleep(delay)
        barrier.wait(phase)
        released.append(time.time())
    print(json.dumps({"released": released}))
except BarrierError as exc:
    print(json.dumps({"error": str(exc)}))
"""


# Reads every broken marker as a waiting rank would, as fast as it can, until told to stop.
LOOKER = """
import json, sys
from pathlib import Path
folder = Path(sys.argv[1])
read = blank = 0
print("looking", flush=True)
while not (folder / "done").exists():
    for marker in folder.glob("broken-*"):
        try:
            read += 1
            blank += not marker.read_text().strip()
        except FileNotFoundError:
            pass
print(json.dumps({"read": read, "blank": blank}))
"""


def party(folder: Path, delay: float, name: str, parties: int = 2,
          timeout: float = 30.0) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", PARTY, str(folder), str(parties), str(delay),
                             str(timeout), name], stdout=subprocess.PIPE, text=True)


def outcome(process: subprocess.Popen[str]) -> dict:
    out, _ = process.communicate(timeout=60)
    return json.loads(out)


def test_two_processes_leave_the_barrier_together(tmp_path: Path) -> None:
    """The early one waits for the late one at every phase: both leave within a few polls of
    each other, the late one's arrival (0.4 s after it left the phase before) setting the
    pace."""
    started = time.time()
    early, late = party(tmp_path, 0.0, "early"), party(tmp_path, 0.4, "late")
    a, b = outcome(early)["released"], outcome(late)["released"]
    # Within half the late one's delay: without the barrier the early one would leave 0.4 s
    # ahead. (0.1 s failed once in a fresh-clone CI rehearsal of 2026-11-27, the suite's own
    # processes on both cores delaying one party's wake-up.)
    for x, y in zip(a, b):
        assert abs(x - y) < 0.2
    # The early one leaves no sooner than the late one arrives: 0.4 s after the start, then 0.4
    # s after the late one left the first phase. (Measured from the early one's own first
    # release, the second gap read 0.3995 s in a rehearsal of 2026-11-28: the late one had seen
    # the first phase complete a poll before the early one did.)
    assert a[0] - started >= 0.4 and a[1] - b[0] >= 0.4


def test_a_side_that_never_comes_is_an_error_naming_the_barrier(tmp_path: Path) -> None:
    alone = outcome(party(tmp_path, 0.0, "alone", timeout=0.5))
    assert alone["error"].startswith(f"duet barrier {tmp_path} (window-0): 1 of 2 ranks "
                                     "arrived within 0.5 s; the other side never came")


def test_a_side_that_failed_stops_the_other_at_once(tmp_path: Path) -> None:
    waiting = party(tmp_path, 0.0, "waiting", timeout=30.0)
    time.sleep(0.3)
    Barrier(tmp_path, 2, 1.0, "failed").break_("rank 0: RuntimeError: the base's recipe broke")
    started = time.time()
    said = outcome(waiting)["error"]
    assert time.time() - started < 10
    assert "a rank of the other side failed while this one waited: rank 0: RuntimeError: " \
           "the base's recipe broke" in said


def test_a_broken_marker_is_never_seen_without_its_reason(tmp_path: Path) -> None:
    """The waiting side polls every millisecond: a marker it can see before its reason is
    written gives it an error with the reason blank (CI of 2026-12-07 read "... failed while
    this one waited: " and nothing after). Another process polls as the barrier does while this
    one breaks one barrier after another."""
    looker = subprocess.Popen([sys.executable, "-c", LOOKER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert looker.stdout is not None and looker.stdout.readline() == "looking\n"
        for number in range(3000):
            Barrier(tmp_path, 2, 1.0, "failed").break_(f"rank 0: reason {number}")
            (tmp_path / "broken-failed").unlink()
    finally:
        (tmp_path / "done").touch()
    seen = json.loads(looker.communicate(timeout=60)[0])
    assert seen["read"] > 0 and seen["blank"] == 0, seen


# A rank's placement as the worker does it first thing (``rank.worker.place``), then what the
# kernel says of the process.
PLACED = """
import json, os, sys
from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.rank.worker import place
place(json.loads(sys.argv[1]), DistEnv.from_environ(dict(os.environ)))
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({"allowed": status["Cpus_allowed_list"].strip(),
                  "affinity": sorted(os.sched_getaffinity(0)),
                  "threads": os.environ.get("OMP_NUM_THREADS"),
                  "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}))
"""


def placed_in_a_process(spec: dict, **variables: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PLACED, json.dumps(spec)], check=True,
                          capture_output=True, text=True, env={**os.environ, **variables})
    return json.loads(done.stdout)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to split")
def test_a_duet_rank_is_pinned_to_its_half_before_any_framework_loads() -> None:
    last = max(os.sched_getaffinity(0))
    seen = placed_in_a_process({"cpus": [last], "threads": 1, "visible_devices": ["3"]})
    assert seen == {"allowed": str(last), "affinity": [last], "threads": "1", "cuda": "3"}
    # without cores in the spec (turns), nothing is changed
    seen = placed_in_a_process({"threads": 2}, OMP_NUM_THREADS="2")
    assert seen["affinity"] == sorted(os.sched_getaffinity(0)) and seen["threads"] == "2"


def test_each_rank_of_a_side_gets_its_share_of_the_half() -> None:
    assert [own_cpus([4, 5, 6, 7], r, 2) for r in range(2)] == [[4, 5], [6, 7]]
    assert own_cpus([4, 5, 6], 1, 2) == [5]
    assert own_cpus([4], 1, 2) == [4]  # fewer cores than ranks: all of them


def test_the_host_splits_in_two_equal_halves() -> None:
    assert duet.split([3, 1, 0, 2]).cpus == ([0, 1], [2, 3])
    assert duet.split([0, 1, 2]).cpus == ([0], [1])  # the odd core is left out: equal sides
    halves = duet.split(list(range(16)), ["2", "3", "5", "7"])
    assert halves.devices == (["2", "3"], ["5", "7"])
    assert halves.to_json()["B"] == {"cpus": list(range(8, 16)), "devices": ["5", "7"]}
    # GPUs: the visible devices' entries, else as many as the host has
    gpus = duet.host_halves("cuda", 4, {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"})
    assert gpus.devices == (["GPU-a"], ["GPU-b"])
    assert duet.host_halves("cuda", 4, {}).devices == (["0", "1"], ["2", "3"])
    assert duet.host_halves("cpu", 0, {}).devices is None
    assert [duet.base_half(i) for i in range(4)] == [0, 1, 0, 1]  # swapped every launch


class _Named(Launcher):
    def __init__(self, name: str) -> None:
        self.name = name


def cluster_of(nodes: int, devices: int, device_type: str = "cpu",
               launcher: str = "local") -> Cluster:
    topology = Topology(nodes, devices, device_type, "test device")
    return Cluster(topology, _Named(launcher), Path("/nonexistent"), 60.0)


@pytest.mark.parametrize("where, why", [
    (cluster_of(1, 2), "1n2d does not fit in half: it runs 2 rank(s) a side and half of this "
                       "host's 2 cores is 1"),
    (cluster_of(2, 1), "2n1d does not fit in half: it is a 2-node case: duet splits one host"),
    (cluster_of(1, 1, launcher="slurm"), "the slurm launcher's ranks are not this host's"),
    (cluster_of(1, 2, "cuda"), "1n2d does not fit in half: it needs 2 GPU(s) a side and half "
                               "of this host's 2 is 1"),
])
def test_a_case_that_needs_more_than_half_the_machine_is_refused_saying_why(
        where: Cluster, why: str) -> None:
    halves = duet.split([0, 1], ["0", "1"] if where.device_type == "cuda" else None)
    said = duet.refusal(where, halves)
    assert said is not None and why in said
    assert said.startswith("--dlperf-ab-mode duet runs base and head at once on halves")
    assert said.endswith("run it with --dlperf-ab-mode turns")
    assert duet.refusal(cluster_of(1, 1), halves) is None


@pytest.mark.parametrize("args, says", [
    (["--dlperf-ab-mode", "duet"], "*--dlperf-ab-mode=duet is a way to run an A/B comparison: "
                                   "give --dlperf-ab REV and/or --dlperf-ab-python PATH*"),
    (["--dlperf-ab", "HEAD", "--dlperf-ab-mode", "together"],
     "*bad value for --dlperf-ab-mode=together: expected one of turns, duet*"),
])
def test_bad_duet_input_is_a_usage_error(pytester: pytest.Pytester, args: list[str],
                                         says: str) -> None:
    pytester.makepyfile(test_x="def test_x(): pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([says])
