"""What runs inside each Ray actor of the Ray launcher (``launch/ray/__init__.py``): one rank of one
launch, on the node Ray placed the actor on.

The actor starts the plugin's rank worker as a process of its own (``python -m
pytest_dlperf.rank.worker``, under the framework's interpreter where the case names one), in a
folder of its node's own, with the variables torchrun's agent would give the rank; it hands the
rank's result back as the return value of ``run`` (through Ray, not a shared folder), with how
the process ended and the tail of what it printed. ``stop`` (the actor takes two calls at once)
ends the rank's process tree; the rank is tied to the actor's process (``lifeline.tethered``),
so a killed actor (``ray.kill``, its raylet gone, the driver gone) takes its rank with it.

Plain Python, no Ray import: the launcher makes it an actor class (``ray.remote``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# Once the rank has written its result, how long its process gets to end by itself.
_WIND_DOWN_S = 5.0
# The tail of the rank's output handed back with its result.
_TAIL = 6000
# Each rank's folder on its node (its spec, result, output, TMPDIR), under the node's temp
# folder; marked with the actor's pid (``lifeline.claim``).
FOLDER_PREFIX = "dlperf-ray-"


class RankHost:
    """One rank of one launch, in a Ray actor."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.folder: Path | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def where(self) -> dict[str, Any]:
        """This node as its ranks see it: its Ray address, host name, the network interface
        that holds the address (gloo's and NCCL's socket interface), this actor's pid and
        GPUs."""
        import ray

        address = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return {"address": address, "host": socket.gethostname(), "pid": os.getpid(),
                "interface": interface_of(address), "gpus": [str(g) for g in ray.get_gpu_ids()],
                "node_id": ray.get_runtime_context().get_node_id()}

    def ports(self, count: int) -> list[int]:
        """``count`` TCP ports free on this node's address now (rank 0's store, the
        framework's own rendezvous)."""
        from pytest_dlperf.core.ports import free_loopback_ports

        return free_loopback_ports(count, host=self.where()["address"])

    def run(self, spec: dict[str, Any], variables: dict[str, str], rank: int,
            timeout_s: float) -> dict[str, Any]:
        """Run rank ``rank`` of ``spec`` with ``variables`` set; its result (None: it wrote
        none), exit status, out-of-memory kill (``--dlperf-memory-limit``) and output's tail."""
        from pytest_dlperf.core.allocator import Allocator
        from pytest_dlperf.core.lifeline import claim, sweep, tethered
        from pytest_dlperf.core.spec import rank_facing
        from pytest_dlperf.launch.processes import rank_command

        # what actors killed without their stop left here (their node's raylet gone, a pytest
        # SIGKILLed: Ray ends the actors, nothing ends their folders)
        sweep(Path(tempfile.gettempdir()), f"{FOLDER_PREFIX}*")
        folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}r{rank}-"))
        claim(folder)
        self.folder = folder
        out_dir, tmp_dir = folder / "results", folder / "tmp"
        out_dir.mkdir()
        tmp_dir.mkdir()
        spec_path = folder / "spec.json"
        spec_path.write_text(json.dumps(rank_facing(spec), sort_keys=True))
        log = folder / "rank.log"
        env = {**os.environ, **variables, "TMPDIR": str(tmp_dir)}
        chosen = Allocator.from_json(spec.get("allocator"))
        if chosen is not None:  # the heap the spec asks for, on this node's environment
            env = chosen.environment(env)
        command = rank_command(spec.get("python"), spec_path, out_dir)
        try:
            with self._lock:
                if self._stopped:
                    return {"rank": rank, "exit": None, "result": None, "stopped": True,
                            "log_tail": ""}
                with open(log, "wb") as out:
                    self.proc = subprocess.Popen(tethered(command), stdout=out,
                                                 stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, env=env,
                                                 start_new_session=True,
                                                 cwd=spec.get("cwd"))
            code = self._wait(out_dir / f"rank-{rank}.json", time.monotonic() + timeout_s)
            return {"rank": rank, "exit": code, "result": _read(out_dir / f"rank-{rank}.json"),
                    "oom": _oom(out_dir, rank), "log_tail": _tail(log),
                    "stopped": self._stopped}
        finally:
            self.stop()
            shutil.rmtree(folder, ignore_errors=True)

    def _wait(self, result: Path, deadline: float) -> int | None:
        """The rank's exit status (None: still running at ``deadline``, or after its result
        was written and its wind-down ran out)."""
        assert self.proc is not None
        written: float | None = None
        while True:
            code = self.proc.poll()
            if code is not None:
                return code
            now = time.monotonic()
            if written is None and result.exists():
                written = now
            if now > deadline or (written is not None and now - written > _WIND_DOWN_S):
                return None
            time.sleep(0.05)

    # -- the link between two nodes: one TCP stream, this actor receiving or sending ------

    def listen(self) -> int:
        """Start receiving one stream on this node's address; its port."""
        server = socket.socket()
        server.bind((self.where()["address"], 0))
        server.listen(1)
        self._probe: dict[str, float] = {}
        threading.Thread(target=self._receive, args=(server,), daemon=True).start()
        return int(server.getsockname()[1])

    def _receive(self, server: socket.socket) -> None:
        server.settimeout(30)
        try:
            conn, _ = server.accept()
        except OSError:
            self._probe["bps"] = 0.0
            return
        total, first = 0, None
        with conn:
            while chunk := conn.recv(1 << 20):
                first = first or time.perf_counter()
                total += len(chunk)
        self._probe["bps"] = total * 8 / max(time.perf_counter() - (first or 0.0), 1e-9)
        server.close()

    def received(self, timeout_s: float = 30.0) -> float:
        """Bit/s the stream carried, from its first byte to its end."""
        deadline = time.monotonic() + timeout_s
        while "bps" not in self._probe and time.monotonic() < deadline:
            time.sleep(0.02)
        return self._probe.get("bps", 0.0)

    def send(self, address: str, port: int, seconds: float) -> None:
        """Send to ``address``:``port`` for ``seconds``."""
        block = b"x" * (1 << 20)
        with socket.create_connection((address, port), timeout=10) as conn:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                conn.sendall(block)

    def stop(self) -> bool:
        """End the rank's process tree (SIGTERM, then SIGKILL); True once nothing runs."""
        from pytest_dlperf.launch.processes import kill_tree

        with self._lock:
            self._stopped = True
            proc = self.proc
        if proc is not None and proc.poll() is None:
            kill_tree([proc], first=signal.SIGTERM)
        elif proc is not None:
            kill_tree([proc], first=signal.SIGKILL)  # what the rank left running under it
        if self.folder is not None:  # the launcher kills the actor once this call returns
            shutil.rmtree(self.folder, ignore_errors=True)
        return True


def interface_of(address: str) -> str | None:
    """The name of the network interface that holds ``address`` here (None: none does)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            return name
    return None


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _oom(out_dir: Path, rank: int) -> str | None:
    """The out-of-memory kill of this rank in its memory cgroup, said as the launchers that
    read the run folder say it (``results``); its cgroup released."""
    from pytest_dlperf.launch.results import oom_killed

    return oom_killed(out_dir, rank + 1).get(rank)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - _TAIL))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""
