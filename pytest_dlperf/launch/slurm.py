"""Slurm mode: inside an allocation, one torchrun agent per node through ``srun``, with a c10d
rendezvous on the allocation's first node.

pytest runs once (on the batch host or a login node with ``salloc``); ``srun`` places one agent
on each of the first ``--nodes`` nodes and each agent starts ``--devices-per-node`` workers. The
case's folder must be on a filesystem every node sees: the plugin puts it under the rootdir.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.topology import Topology
from ..core.lifeline import tethered
from .base import Launcher
from .processes import agent_command, new_run_id, prepare, run_processes, worker_environment


@dataclass(frozen=True)
class SlurmAllocation:
    job_id: str
    nodelist: str
    nodes: int
    gpus_per_node: int | None

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> SlurmAllocation | None:
        job = environ.get("SLURM_JOB_ID")
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
        if not job or not nodelist:
            return None
        count = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")
        gpus = environ.get("SLURM_GPUS_ON_NODE")
        return cls(job_id=job, nodelist=nodelist,
                   nodes=int(count) if count else len(expand_nodelist(nodelist)),
                   gpus_per_node=int(gpus) if gpus and gpus.isdigit() else None)

    def hostnames(self) -> list[str]:
        """Slurm's own expansion (``scontrol show hostnames``), else the simple forms."""
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", self.nodelist],
                                 capture_output=True, text=True, timeout=30, check=True).stdout
            names = out.split()
        except (OSError, subprocess.SubprocessError):
            names = expand_nodelist(self.nodelist)
        return names


def expand_nodelist(nodelist: str) -> list[str]:
    """``gpu[01-03,07],login1`` -> gpu01 gpu02 gpu03 gpu07 login1 (one bracket per name)."""
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{number:0{len(low)}d}")
    return names


class SlurmLauncher(Launcher):
    name = "slurm"
    all_nodes_here = False

    def __init__(self, allocation: SlurmAllocation) -> None:
        self.allocation: SlurmAllocation = allocation

    def run(self, spec: dict[str, Any], topology: Topology, run_dir: Path,
            timeout_s: float) -> list[dict[str, Any]]:
        spec_path, out_dir, tmp_dir = prepare(spec, run_dir)
        hosts = self.allocation.hostnames()[: topology.nodes]
        # Ports of concurrent jobs on the first node must not collide: spread them out.
        port = 20000 + random.Random(os.getpid() ^ hash(run_dir)).randrange(20000)
        command = [
            "srun", f"--nodes={topology.nodes}", f"--ntasks={topology.nodes}",
            "--ntasks-per-node=1", f"--nodelist={','.join(hosts)}", "--kill-on-bad-exit=1",
            "--export=ALL",
            # On each node the agent tells its ranks its pid (they end with it); Slurm's step,
            # not a parent-death signal, ends the agent.
            *tethered(agent_command(topology, f"{hosts[0]}:{port}", new_run_id(), spec_path,
                                    out_dir, timeout_s, local_addr=None), parent=-1),
        ]
        # Slurm nodes are separate hosts, unless the allocation lists one host twice.
        env = worker_environment(topology, tmp_dir, spec.get("python"), port + 1,
                                 nodes_share_host=len(set(hosts)) < len(hosts))
        # If pytest dies, srun gets SIGTERM: its own handling signals the step's tasks on every
        # node and ends the step (SIGKILL would leave the remote tasks to Slurm's timeouts).
        return run_processes([command], env, run_dir, out_dir, topology.world_size, timeout_s,
                             death_signal=signal.SIGTERM)
