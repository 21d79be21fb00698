"""Faults with real processes: a hanging worker, a node that never joins, a diverging loss,
Ctrl-C during a case, a rank killed by a signal. Every one ends with the case's whole process
tree gone."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from pytest_dlperf.core.protocol import Protocol
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.core.topology import Topology
from pytest_dlperf.launch import LaunchError, local, processes
from pytest_dlperf.models import RESNET50

# Not alone (scripts/test runs these two at a time): the bounds below are several times what a
# fault takes here, and what the case left is looked for among this test's processes only.

pytest.importorskip("torchvision")

def workers_under(path: Path) -> list[psutil.Process]:
    """Every process of a case run below ``path`` (agents and workers name its files)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "pytest_dlperf.rank.worker" in cmdline and str(path) in cmdline:
            found.append(proc)
    return found


def left_by_the_case(path: Path) -> list[psutil.Process]:
    """Every process the case run below ``path`` may have left, whatever its command: one whose
    command line, working folder or environment names the test's folder (its ranks' and agents'
    files, scratch and adapters are there). Only this test's: beside another test (scripts/test
    runs two at a time) every worker of the machine is not this case's."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid == os.getpid():
            continue
        try:
            named = " ".join(proc.info["cmdline"] or [])
            named += " " + proc.cwd() + " " + " ".join(proc.environ().values())
        except (psutil.Error, OSError):
            continue  # gone, or a kernel thread
        if str(path) in named:
            found.append(proc)
    return found


def assert_stuck_case_times_out_cleanly(pytester: pytest.Pytester, adapter: str, timeout_s: int,
                                        within_s: float) -> None:
    """A 1n2d case of ``adapter`` whose ranks never finish fails at ``--dlperf-timeout``
    naming both ranks, and leaves no worker, agent or zombie behind."""
    pytester.makepyfile(test_stuck=f"""
        def test_stuck(throughput_meter):
            throughput_meter.measure("{adapter}")
    """)
    started = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--devices-per-node", "2",
                                           "--dlperf-timeout", str(timeout_s),
                                           timeout=within_s + 60)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*timeout on 1n2d: timed out after {timeout_s} s; stuck ranks: "
                                 "[[]0, 1[]]*"])
    assert time.monotonic() - started < within_s
    assert left_by_the_case(pytester.path) == []  # its workers among them
    assert not [p for p in psutil.Process().children(recursive=True)
                if p.status() == psutil.STATUS_ZOMBIE]


@pytest.mark.usefixtures("subprocess_env")
def test_a_hanging_worker_fails_after_the_timeout_naming_the_ranks(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
        hanging_adapter: Callable[[Path], str]) -> None:
    monkeypatch.setenv("TMPDIR", str(pytester.mkdir("tmp")))
    hanging_adapter(pytester.path)
    # a user's own adapter module
    assert_stuck_case_times_out_cleanly(pytester, "fault_adapters.hanging", 6, within_s=60)


def test_a_node_that_never_joins_times_out_and_frees_its_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two local nodes on loopback, but the second 'node' is a process that never starts an
    agent (nodes as hosts of their own: test_fabric.py)."""
    real_command, ports, calls = local.agent_command, [], []

    def second_node_never_joins(*args: Any) -> list[str]:
        calls.append(args)
        if len(calls) == 2:
            return [sys.executable, "-c", "import time; time.sleep(3600)"]
        return real_command(*args)

    real_port = local.free_loopback_port
    monkeypatch.setattr(local, "agent_command", second_node_never_joins)
    monkeypatch.setattr(local, "free_loopback_port", lambda: ports.append(real_port()) or ports[-1])
    spec = spec_for("torch", RESNET50, protocol=Protocol(1, 2, 1), device_type="cpu").to_json()
    started = time.monotonic()
    with pytest.raises(LaunchError) as info:
        local.LocalLauncher(node_hosts=False).run(spec, Topology(2, 1, "cpu", "cpu"), tmp_path,
                                                  timeout_s=8)
    assert time.monotonic() - started < 30
    assert info.value.kind == "timeout" and info.value.missing_ranks == [0, 1]
    assert psutil.Process().children(recursive=True) == []  # agents, workers, sleeper: all gone
    listening = [c for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == ports[0]]
    assert listening == []  # the rendezvous port is released


@pytest.mark.usefixtures("subprocess_env")
def test_a_diverging_loss_fails_as_diverged_not_fast(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nan="""
        from dataclasses import replace

        from pytest_dlperf import SGD
        from pytest_dlperf.models import RESNET50

        EXPLODING = replace(RESNET50, optimizer=SGD(lr_per_256=1e12, momentum=0.9))

        def test_nan(throughput_meter):
            throughput_meter.measure("torch", EXPLODING)
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--devices-per-node", "1",
                                           "--dlperf-warmup-steps", "2", "--dlperf-steps", "2",
                                           "--dlperf-repeats", "3", timeout=120)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_nan diverged on 1n1d: 1 of 1 ranks failed (diverged)*",
                                 "*Diverged: rank 0: loss is nan after timed window*"])
    assert "pytest-dlperf: training throughput" not in result.stdout.str()  # no figure reported


def test_ctrl_c_stops_every_worker_and_writes_no_baseline(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(pytester.mkdir("tmp")))  # the case's files, spec included
    pytester.makepyfile(test_long="""
        def test_long(throughput_meter):
            throughput_meter.measure("torch")
    """)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--devices-per-node", "2",
         "--dlperf-steps", "100000", "--dlperf-update-baselines", "--dlperf-baselines", "bl"],
        cwd=pytester.path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        # As at a terminal. A shell's background job (some CI runners) inherits SIGINT ignored,
        # and CPython then installs no KeyboardInterrupt handler: Ctrl-C could not happen there.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 90
        while len(workers_under(pytester.path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(workers_under(pytester.path)) >= 2, "the case never started its workers"
        time.sleep(3)  # well inside the case
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)  # reads as it waits: no full-pipe stall
    finally:  # if the test itself fails, leave nothing behind for the tests after it
        if proc.poll() is None:
            processes.kill_tree([proc])
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert b"KeyboardInterrupt" in out
    assert workers_under(pytester.path) == []
    baselines = pytester.path / "bl"
    assert not baselines.exists() or list(baselines.rglob("*")) == []


LONELY_TF = """
# Rank 0 is told of a peer that never starts: MultiWorkerMirroredStrategy waits for it forever,
# and TensorFlow's wait ignores SIGTERM. Rank 1 just never gets going.
import socket, time

from pytest_dlperf.frameworks import tensorflow as tf_adapter

DISTRIBUTION = tf_adapter.DISTRIBUTION


RECIPE_FOR = "tensorflow"


def build_trainer(spec, dist, recipe):
    if dist.rank == 1:
        time.sleep(3600)
    with socket.socket() as sock:  # a port nobody will listen on
        sock.bind(("127.0.0.1", 0))
        absent = f"127.0.0.1:{sock.getsockname()[1]}"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        mine = f"127.0.0.1:{sock.getsockname()[1]}"
    return tf_adapter.build_trainer(spec.with_(workers=[mine, absent]), dist, recipe)
"""


@pytest.mark.usefixtures("subprocess_env")
def test_a_tensorflow_worker_waiting_for_a_peer_that_never_starts_is_killed(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("tensorflow") is None:  # looked up: the workers import it
        pytest.skip("TensorFlow is not installed")
    monkeypatch.setenv("TMPDIR", str(pytester.mkdir("tmp")))
    (pytester.path / "fault_adapters").mkdir()
    (pytester.path / "fault_adapters" / "__init__.py").write_text("")
    (pytester.path / "fault_adapters" / "lonely_tf.py").write_text(LONELY_TF)
    assert_stuck_case_times_out_cleanly(pytester, "fault_adapters.lonely_tf", 20, within_s=120)


CRASHING = """
import os
import signal

from pytest_dlperf import Parts, Workload


def build(ctx):
    import torch  # in the ranks only (pytest's own import of it: ~4 s a run)

    if ctx.rank == 1:  # a crash in a framework's own code: no traceback, no result
        os.kill(os.getpid(), signal.SIGSEGV)
    return Parts(model=torch.nn.Linear(8, 2), inputs=torch.randn(ctx.batch_size, 8),
                 targets=lambda: torch.randint(0, 2, (ctx.batch_size,)))


CRASH = Workload("crash", recipes={"torch": build}, batch_size={"cpu": 4})


def test_crash(cluster, throughput_meter):
    throughput_meter.measure("torch", CRASH)
"""


@pytest.mark.usefixtures("subprocess_env")
def test_a_rank_killed_by_a_signal_is_named_with_it_before_what_it_did_to_the_others(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_crash=CRASHING)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--devices-per-node", "2",
                                           "-k", "1n2d", "--dlperf-warmup-steps", "1",
                                           "--dlperf-steps", "2", "--dlperf-repeats", "1",
                                           timeout=180)
    result.assert_outcomes(failed=1)
    # Rank 0 may fail on its peer's closed connection or end without a result of its own,
    # depending on where the crash caught it; rank 1's end is named either way.
    result.stdout.fnmatch_lines(["*test_crash[[]1n2d[]] failed on 1n2d: *rank 1 ended (killed by "
                                 "SIGSEGV) without a result*"])
    assert left_by_the_case(pytester.path) == []  # its workers among them
