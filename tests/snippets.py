"""Running a piece of code inside a framework's own interpreter, as a rank would: shared by the
tests that check what a framework does (OneFlow's asynchrony, CUDA synchronization)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# The same steps timed twice by the meter, with the trainer's synchronize and with a no-op one,
# each window against a wall clock read after a blocking fetch of the last step's loss: the
# check that a framework's windows are honest (OneFlow's, Paddle's, CUDA's). Code before it
# defines ``trainer`` and ``STEPS``; it prints {"synchronized": [window_s, outside_s],
# "not synchronized": [...]}.
WINDOW_AGAINST_A_CLOCK = """
import json, time
from pytest_dlperf.core.protocol import Protocol
from pytest_dlperf.rank.timing import measure
out = {}
for label, sync in (("synchronized", trainer.synchronize), ("not synchronized", lambda: None)):
    trainer.synchronize()
    began = time.perf_counter()
    window = measure(Protocol(0, STEPS, 1), trainer.step, sync).windows[0].elapsed_s
    trainer.loss()  # blocks until the last step's loss exists
    out[label] = [window, time.perf_counter() - began]
print(json.dumps(out))
"""


def run_snippet(python: str, code: str, timeout: float = 300, **env: str) -> object:
    """Run ``code`` under ``python`` (a framework's interpreter) with this checkout importable
    and one thread per op pool; it prints one JSON line last, which is returned."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                "GLOG_minloglevel": "2", "TF_CPP_MIN_LOG_LEVEL": "2", **env}
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=full_env,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, ended(done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def ended(code: int, stdout: str, stderr: str) -> str:
    """Why a snippet's process failed: its exit status (a negative one is the signal that
    killed it, which leaves no traceback) and the ends of what it printed."""
    how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
    return f"{how}; stdout: {stdout[-1000:]!r}; stderr: {stderr[-3000:]!r}"


def run_together(python: str, codes: list[str], env: dict[str, str],
                 timeout: float = 300) -> list[object]:
    """Each of ``codes`` under ``python`` in a process of its own, all at once (the ranks of one
    job, which wait for each other), with ``env`` as their whole environment and this
    checkout as their folder; each prints one JSON line last, returned in order."""
    ranks = [subprocess.Popen([python, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                              stdin=subprocess.DEVNULL)
             for code in codes]
    out = []
    for proc in ranks:
        stdout, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, ended(proc.returncode, stdout, stderr)
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def in_a_file(code: str, folder: Path) -> str:
    """A snippet that runs ``code`` from a file in ``folder``, there: GRAPH mode reads the
    source of what it compiles (``python -c`` has none), and a failed compile writes
    ``rank_0/om/analyze_fail.ir`` into the working folder."""
    (folder / "snippet.py").write_text(code)
    return (f"import os, runpy; os.chdir({str(folder)!r}); "
            "runpy.run_path('snippet.py', run_name='__main__')")


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback now, below the kernel's ephemeral range (the
    plugin's own choice: a port of that range may be a connection's by the time it is bound)."""
    from pytest_dlperf.core.ports import free_loopback_ports

    return free_loopback_ports(count)


def torchrun_runs(script: str, out: Path, runs: dict[str, tuple[object, int, dict]],
                  timeout: float = 400) -> list[dict]:
    """One torchrun job of two processes running ``tests/<script>`` over ``runs`` (name:
    (layout, world, options)), each a fresh world of its own on a port of its own
    (``layouts_torch_rank.run_each``), their results saved in ``out``; returns the runs as the
    job was given them."""
    import sys

    master, *ports = free_ports(len(runs) + 1)
    given = [{"name": name, "layout": layout, "world": world, "first": 0, "options": options,
              "port": port} for (name, (layout, world, options)), port in zip(runs.items(), ports)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(master),
         str(REPO / "tests" / script), str(out), json.dumps(given)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout,
        stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return given


# OneFlow 0.9's control plane lost mid-job: a rank's barrier could not reach the other rank's
# gRPC server (rpc_client.cpp: "Check failed: ... grpc::StatusCode::OK (14 vs. 0)", UNAVAILABLE),
# and the rank aborts. Seen once in CI's first pass (2026-12-07, the layouts job 2 s into its
# first layout, nothing else wrong); each rank's control port is one OneFlow found free and
# bound later (oneflow/framework/env_util.py, _FindFreePort), which a neighbour's socket can
# take between the two. Not what a test of a layout checks: such a job runs once more.
ONEFLOW_CONTROL_LOST = ("rpc_client.cpp", "grpc::StatusCode::OK (14 vs. 0)")


def oneflow_job(python: str, args: list[str], what: str, timeout: float = 300,
                env: dict[str, str] | None = None) -> None:
    """One job of two OneFlow ranks (OneFlow's own launcher, under ``python``) running ``args``;
    on a timeout the whole job is killed and ``what``'s test fails, as it does where the job
    fails (the head and the tail of what it printed). A job whose control plane was lost
    (``ONEFLOW_CONTROL_LOST``) runs once more, saying so."""
    import signal
    import sys

    import pytest  # here: ranks under other interpreters import this module without pytest

    for attempt in (1, 2):
        (port,) = free_ports(1)
        # A session of its own: on a timeout the whole group goes (the launcher and both
        # ranks), not the launcher alone, which left the ranks running.
        job = subprocess.Popen(
            [python, "-m", "oneflow.distributed.launch", "--nproc_per_node", "2",
             "--master_port", str(port), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env or {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
                        "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"},
            cwd=REPO, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _, err = job.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            _, err = job.communicate()
            pytest.fail(f"the {what} OneFlow job ran past {timeout:.0f} s (killed with its "
                        f"ranks): {err[-3000:]}")
        if job.returncode == 0:
            return
        shown = err if len(err) <= 6000 else f"{err[:2000]}\n[...]\n{err[-4000:]}"
        if attempt == 1 and all(mark in err for mark in ONEFLOW_CONTROL_LOST):
            print(f"the {what} OneFlow job lost its control plane (run again):\n{shown}",
                  file=sys.stderr)
            continue
        pytest.fail(f"the {what} OneFlow job failed (exit {job.returncode}):\n{shown}")


def oneflow_launch_runs(python: str, script: str, out: Path,
                        runs: dict[str, tuple[object, str, dict]], what: str,
                        timeout: float = 300) -> None:
    """``tests/<script>`` in a ``oneflow_job`` over ``runs`` (name: (layout, compiler,
    options)), their results saved in ``out``."""
    given = [{"name": name, "layout": layout, "compiler": compiler, "options": options}
             for name, (layout, compiler, options) in runs.items()]
    oneflow_job(python, [str(REPO / "tests" / script), str(out), json.dumps(given)], what,
                timeout)


def oneflow_interpreter() -> Path:
    """OneFlow's worker interpreter: DLPERF_TEST_ONEFLOW_PYTHON, else scripts/setup-oneflow's."""
    return Path(os.environ.get("DLPERF_TEST_ONEFLOW_PYTHON")
                or REPO / ".venv-oneflow" / "bin" / "dlperf-python")


def mindspore_interpreter() -> Path:
    """MindSpore's worker interpreter: DLPERF_TEST_MINDSPORE_PYTHON, else
    scripts/setup-mindspore's."""
    return Path(os.environ.get("DLPERF_TEST_MINDSPORE_PYTHON")
                or REPO / ".venv-mindspore" / "bin" / "python")


def mxnet_interpreter() -> Path:
    """MXNet's worker interpreter: DLPERF_TEST_MXNET_PYTHON, else scripts/setup-mxnet's."""
    return Path(os.environ.get("DLPERF_TEST_MXNET_PYTHON")
                or REPO / ".venv-mxnet" / "bin" / "python")


def jax_interpreter() -> Path:
    """JAX's worker interpreter: DLPERF_TEST_JAX_PYTHON, else scripts/setup-jax's."""
    return Path(os.environ.get("DLPERF_TEST_JAX_PYTHON")
                or REPO / ".venv-jax" / "bin" / "python")


def still_running_after(find: Callable[[], list[int]], seconds: float) -> list[int]:
    """What ``find`` lists once it lists nothing or ``seconds`` have passed: processes a rank
    started beside it (a scheduler, a server) leave by themselves once the workers have gone, or
    when their tether to rank 0 fires, a grace period after rank 0 has gone; a check made the
    moment the ranks exit races them (CI saw MindSpore's scheduler still up 10 s after)."""
    deadline = time.monotonic() + seconds
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
