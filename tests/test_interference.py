"""What a launch ran beside (core/interference.py): the arithmetic on samples, nvidia-smi's
answer parsed, and real CPU hogs on this host, ours (children: not interference) and not ours
(orphans: interference). The history keeps it per case (schema 3)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pytest_dlperf.core import interference
from pytest_dlperf.core.interference import (
    CpuTimes,
    GpuProcess,
    Interference,
    Sample,
    between,
    parse_compute_apps,
    parse_cpu_line,
)
from pytest_dlperf.core.protocol import Result

pytestmark = [pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc"),
              pytest.mark.alone("it reads the whole machine's CPU load (/proc/stat)")]

HOG = "while True: pass"
PROC_STAT = """cpu  1000 10 300 5000 70 0 20 100 0 0
cpu0 500 5 150 2500 35 0 10 50 0 0
cpu1 500 5 150 2500 35 0 10 50 0 0
intr 123 0 0
"""


def test_the_aggregate_cpu_line_is_read_in_seconds_and_the_cores_counted() -> None:
    # busy: user + nice + system + irq + softirq; idle, iowait and steal are not busy
    assert parse_cpu_line(PROC_STAT, 100.0) == CpuTimes(busy_s=13.3, steal_s=1.0, cores=2)


def test_others_are_the_machine_s_busy_time_less_our_tree_s_over_wall_times_cores() -> None:
    start = Sample(at=10.0, cpu=CpuTimes(100.0, 5.0, 2), own_s=40.0)
    # 4 s on 2 cores: 8 CPU seconds; 6 busy, 2 of them ours, 0.4 stolen
    end = Sample(at=14.0, cpu=CpuTimes(106.0, 5.4, 2), own_s=42.0)
    seen = between(start, end)
    assert (seen.wall_s, seen.cores) == (4.0, 2)
    assert seen.others_cpu == pytest.approx(0.5) and seen.own_cpu == pytest.approx(0.25)
    assert seen.steal == pytest.approx(0.05) and seen.share == pytest.approx(0.55)
    # Tick rounding can make ours exceed the machine's: clamped to [0, 1], never negative
    clamped = between(start, Sample(14.0, CpuTimes(101.0, 5.0, 2), 43.0))
    assert clamped.others_cpu == 0.0 and clamped.share == 0.0
    assert between(start, Sample(14.0, CpuTimes(120.0, 5.0, 2), 40.0)).others_cpu == 1.0
    # No /proc: nothing measured, and nothing to judge on
    unmeasured = between(Sample(0.0, None, 0.0), Sample(1.0, None, 0.0))
    assert unmeasured.others_cpu is None and unmeasured.share is None


def test_nvidia_smi_s_compute_apps_less_our_own_processes() -> None:
    text = "4242, 5000 MiB\n17, 1200\n999, [N/A]\n\nNo running processes found\n"
    assert parse_compute_apps(text, ours={17}) == (GpuProcess(4242, 5000.0),
                                                   GpuProcess(999, 0.0))
    merged = interference.merge((GpuProcess(1, 10.0),), (GpuProcess(1, 30.0), GpuProcess(2, 5.0)))
    assert merged == (GpuProcess(1, 30.0), GpuProcess(2, 5.0))


def test_a_launch_s_interference_round_trips_and_every_launch_keeps_its_own() -> None:
    seen = Interference(3.0, 2, 0.48, 0.0, 0.5, (GpuProcess(7, 100.0),), retries=1)
    assert Interference.from_json(json.loads(json.dumps(seen.to_json()))) == seen
    one = Result([10.0], [1.0], 10, 4, 0.1, 3.0, interference=[seen])
    other = Result([11.0], [1.0], 10, 4, 0.1, 3.0, interference=[Interference(3.0, 2, 0.1, 0.0,
                                                                              0.5)])
    both = one.extended(other)
    assert [i.others_cpu for i in both.interference] == [0.48, 0.1]


def _busy_interval(seconds: float = 1.5) -> Interference:
    watch = interference.Watch()
    time.sleep(seconds)
    return watch.stop()


def _tree() -> set[int]:
    return {pid for pid, _ in interference.descendants(os.getpid())}


@contextmanager
def hogs(count: int, ours: bool) -> Iterator[list[int]]:
    """``count`` processes spinning a core each: this process's children (``ours``), or
    orphans another process started and left (not in our tree, as another job's)."""
    pids: list[int] = []
    children: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            if ours:
                children.append(subprocess.Popen([sys.executable, "-c", HOG]))
                pids.append(children[-1].pid)
            else:
                started = subprocess.run(
                    [sys.executable, "-c", "import subprocess, sys; print(subprocess.Popen("
                     f"[sys.executable, '-c', {HOG!r}], start_new_session=True, "
                     "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"],
                    capture_output=True, text=True, check=True)
                pids.append(int(started.stdout))
        time.sleep(0.3)  # the interpreters started: spinning, not importing
        yield pids
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for child in children:
            child.wait()


def test_other_processes_spinning_are_interference_and_an_idle_interval_is_far_below() -> None:
    idle = _busy_interval()
    with hogs(2, ours=False) as pids:
        assert not set(pids) & _tree()
        others = _busy_interval()
    assert idle.others_cpu is not None and others.others_cpu is not None
    # Two cores' worth of spinning that is not ours: the machine is others' (whatever other
    # jobs on this shared host add, the total is the machine)
    assert others.others_cpu >= 0.7 and others.own_cpu is not None and others.own_cpu < 0.1, (
        others)
    if idle.others_cpu <= 0.5:  # (where other jobs left this host an idle moment to compare)
        assert others.others_cpu >= idle.others_cpu + 0.3, (idle, others)


def _children_of(pid: int) -> list[int]:
    import psutil

    return [child.pid for child in psutil.Process(pid).children()]


def _cpu_s(pids: list[int]) -> float:
    import psutil

    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def test_our_own_children_spinning_are_ours_not_others_live_or_reaped() -> None:
    with hogs(2, ours=True) as pids:
        assert set(pids) <= _tree()
        before = _cpu_s(pids)
        live = _busy_interval()
        spun = _cpu_s(pids) - before
    assert live.own_cpu is not None and live.others_cpu is not None
    # What our children spun is ours, to the clock tick (0.01 s each end), not others': the
    # others' share is the machine's busy time less all of it (other jobs share this host, so
    # how much the hogs got varies; that it is all counted as ours does not)
    ours = live.own_cpu * live.wall_s * live.cores
    assert spun >= 0.3 and ours == pytest.approx(spun, abs=0.05 + 0.05 * spun), (spun, live)
    # A grandchild that ends inside the interval orphaned (its parent killed first, as the
    # launcher kills a launch's agents once the results are in): init reaps it, not us, and its
    # CPU time still counts as ours, as last seen.
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               f"subprocess.Popen([sys.executable, '-c', {HOG!r}])\n"
                               "time.sleep(60)"])
    try:
        time.sleep(0.3)
        (orphan,) = _children_of(parent.pid)
        watch = interference.Watch()
        time.sleep(1.0)
        spun = _cpu_s([orphan])
        parent.kill()
        parent.wait()
        os.kill(orphan, signal.SIGKILL)
        time.sleep(0.3)
        ended = watch.stop()
    finally:
        parent.kill()
        parent.wait()
    assert orphan not in _tree()
    assert ended.own_cpu is not None
    assert ended.own_cpu * ended.wall_s * ended.cores >= 0.5 * spun, (spun, ended)


def test_the_history_keeps_each_case_s_interference_and_a_schema_2_store_upgrades(
        tmp_path: Path) -> None:
    sa = pytest.importorskip("sqlalchemy")
    from pytest_dlperf.store import history as history_mod
    from pytest_dlperf.store.history import History

    url = str(tmp_path / "history.db")
    run = {"started_at": dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc), "commit_id": "a",
           "branch": "main", "dirty": False, "host": "h", "machine": "box",
           "plugin_version": "0", "protocol": {}}
    case = {"case_key": "t.py::test_a", "fingerprint": {}, "fingerprint_id": "f",
            "framework": "torch", "model": "mlp", "unit": "samples", "verdict": "pass",
            "metrics": {"samples_per_s": [[1.0]]}}
    History.open(url).append(run, [case])
    engine = sa.create_engine(history_mod.engine_url(url))
    with engine.begin() as conn:  # back to what schema 2 wrote
        conn.execute(sa.text("ALTER TABLE dlperf_cases DROP COLUMN interference"))
        conn.execute(sa.text("ALTER TABLE dlperf_cases DROP COLUMN phases"))  # schema 4's
        conn.execute(sa.text("UPDATE dlperf_meta SET value = '2' WHERE key = 'schema_version'"))
    store = History.open(url)
    assert store.schema_version() == history_mod.SCHEMA_VERSION
    seen = Interference(2.0, 2, 0.48, 0.0, 0.5).to_json()
    store.append(run, [{**case, "interference": [seen]}])
    with engine.connect() as conn:
        kept = [row[0] for row in conn.execute(sa.text(
            "SELECT interference FROM dlperf_cases ORDER BY id"))]
    assert kept[0] is None and json.loads(kept[1]) == [seen]
    assert len(store.series("t.py::test_a", "f")) == 2
