"""External mode: pytest itself was started on every rank (``torchrun ... -m pytest``, or srun
with RANK/WORLD_SIZE/MASTER_ADDR set). Each rank trains in-process; the ranks swap their JSON
results through a c10d TCPStore (torchrun's agent store when there is one), so every rank
aggregates the same figures; only rank 0 judges and reports, and the others take its outcome.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..core import allocator
from ..core.topology import Topology
from ..frameworks import DistEnv
from .base import Launcher, LaunchError
from .protocol import LauncherProtocol, Rendezvous
from .results import checked

REQUIRED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launched_externally(environ: dict[str, str]) -> bool:
    return all(key in environ for key in REQUIRED)


class ExternalLauncher(Launcher):
    name = "external"
    all_nodes_here = False
    # Extra repeats would need every rank to take the same decision from a baseline file that
    # only rank 0 is sure to see: external cases keep the protocol's repeats.
    can_add_repeats = False

    def __init__(self, environ: dict[str, str]) -> None:
        self.dist = DistEnv.from_environ(environ)
        self.host, self.port = environ["MASTER_ADDR"], int(environ["MASTER_PORT"])
        # torchrun's agent already serves a store on MASTER_PORT; otherwise rank 0 serves one
        # beside the port the framework's own process group will take.
        self.agent_store = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        self._store: Any = None
        self._calls = 0

    @property
    def nodes(self) -> int:
        return max(1, self.dist.world_size // self.dist.local_world_size)

    @property
    def launched_shape(self) -> tuple[int, int]:
        return self.nodes, self.dist.local_world_size

    @property
    def is_reporter(self) -> bool:
        return self.dist.rank == 0

    def can_run(self, topology: Topology) -> bool:
        return (topology.nodes, topology.devices_per_node) == (self.nodes,
                                                                self.dist.local_world_size)

    def store(self, timeout_s: float) -> Any:
        if self._store is None:
            import torch.distributed as dist

            port = self.port if self.agent_store else self.port + 1
            self._store = dist.TCPStore(  # type: ignore[attr-defined]
                self.host, port, self.dist.world_size,
                is_master=not self.agent_store and self.dist.rank == 0,
                timeout=timedelta(seconds=timeout_s))
        return self._store

    # -- one launch, phase by phase: this process is one of the ranks ----------------------

    def rendezvous(self, topology: Topology, run_dir: Path) -> Rendezvous:
        """The job's store (torchrun's agent's, or rank 0's beside MASTER_PORT); the launch's id
        is the case's number, the same on every rank (each runs the same cases in order)."""
        self._calls += 1
        port = self.port if self.agent_store else self.port + 1
        return Rendezvous(self.host, port, f"dlperf/case{self._calls}")

    def start(self, spec: dict[str, Any], topology: Topology, run_dir: Path,
              meeting: Rendezvous, timeout_s: float) -> str:
        """Train this rank in pytest's own process, and hand its result (or its error) to the
        store under the launch's id; the other ranks do the same in theirs."""
        from ..rank.worker import failure, rank_result

        if spec.get("python"):
            raise LaunchError(
                f"{spec['framework']} is set to run under {spec['python']} (--dlperf-python), "
                "but external mode trains inside each rank's pytest process "
                f"({sys.executable}); run this case with the local or slurm launcher, whose "
                "agents start ranks under that interpreter")
        os.environ["OMP_NUM_THREADS"] = str(spec["threads"])
        try:
            chosen = allocator.Allocator.from_json(spec.get("allocator"))
            if chosen is not None:  # this process started before the plugin chose
                allocator.apply_in_process(chosen)
        except Exception as exc:
            mine = failure(spec, self.dist, exc)
        else:
            mine = rank_result(spec, self.dist)
        self.store(timeout_s).set(f"{meeting.run_id}/rank{self.dist.rank}", json.dumps(mine))
        return meeting.run_id

    def collect(self, launch: str, timeout_s: float) -> list[dict[str, Any]]:
        """Every rank's result from the store, once all are there (or the timeout)."""
        store = self.store(timeout_s)
        keys = [f"{launch}/rank{r}" for r in range(self.dist.world_size)]
        try:
            store.wait(keys, timedelta(seconds=timeout_s))
        except Exception as exc:  # c10d raises its own timeout types
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise LaunchError(f"timed out after {timeout_s:g} s waiting for ranks {missing}: "
                              f"{exc}", missing_ranks=missing, kind="timeout") from None
        return checked({r: json.loads(store.get(k)) for r, k in enumerate(keys)},
                       self.dist.world_size, timeout_s)

    def share_outcome(self, outcome: dict[str, str], timeout_s: float) -> dict[str, str]:
        """Rank 0 publishes its outcome for the current case; the other ranks receive it."""
        store, key = self.store(timeout_s), f"dlperf/case{self._calls}/outcome"
        if self.is_reporter:
            store.set(key, json.dumps(outcome))
            return outcome
        store.wait([key], timedelta(seconds=timeout_s))
        return dict(json.loads(store.get(key)))


def make(environ: dict[str, str]) -> ExternalLauncher:
    """``--dlperf-launcher external``: pytest itself is one rank of a launched job."""
    if not launched_externally(environ):
        raise LookupError("--dlperf-launcher=external, but pytest was not started as a rank "
                          f"of a launched job (needs {', '.join(REQUIRED)}); start it with "
                          "torchrun ... -m pytest")
    return ExternalLauncher(environ)


# mypy checks the launcher against the protocol here.
_PROTOCOL: type[LauncherProtocol[str]] = ExternalLauncher
