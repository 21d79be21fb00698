"""Local mode: N torchrun elastic agents on this host, rendezvousing over c10d on loopback.

Each agent is a real ``torch.distributed.run`` process (the machinery behind ``torchrun``), so one
host exercises the same rendezvous path a cluster uses across nodes. The agents start in their
own sessions and the whole process tree is reaped afterwards, whatever happened.

The ranks of a one-node case (1n1d, 1n8d) have no nodes to rendezvous across: they start without
an agent, with the variables an agent would give them, and rank 0 hosts the store the others
join (torch's own env:// rendezvous; TensorFlow's address exchange goes through it too). An
agent's own ``import torch`` and start-up and wind-down were 2-3 s of every launch on a 2-core
host (docs/multinode.md); the ranks train and are timed the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.topology import Topology
from . import netns
from .base import Launcher
from .processes import (agent_command, free_loopback_port, new_run_id, one_node_environment,
                        prepare, rank_command, rank_variables, run_processes, worker_environment)


class LocalLauncher(Launcher):
    """Every node's agent on this host, rendezvousing on loopback (one node: its ranks, without
    agents); inside a private network namespace where the host allows one (see ``netns``)."""

    name = "local"
    all_nodes_here = True

    @property
    def isolation(self) -> str | None:
        return "network-namespace" if netns.available() else "none"

    def run(self, spec: dict[str, Any], topology: Topology, run_dir: Path,
            timeout_s: float) -> list[dict[str, Any]]:
        spec_path, out_dir, tmp_dir = prepare(spec, run_dir)
        ranks_here = topology.nodes == 1  # the ranks themselves, no agents
        if ranks_here:
            commands = [rank_command(spec.get("python"), spec_path, out_dir, rank_variables(rank))
                        for rank in range(topology.world_size)]
        else:
            port = free_loopback_port()
            run_id = new_run_id()
            commands = [agent_command(topology, f"127.0.0.1:{port}", run_id, spec_path, out_dir,
                                      timeout_s) for _ in range(topology.nodes)]
        if self.isolation == "network-namespace":
            kind = "rank" if ranks_here else "agent"
            logs = [run_dir / f"{kind}-{i}.log" for i in range(len(commands))]
            commands = [netns.wrap(commands, logs, run_dir / "netns-plan.json")]
        # Every local node has this host's address.
        # (An agent reads the ranks' interpreter from the environment; rank_command names it.)
        env = worker_environment(topology, tmp_dir, None if ranks_here else spec.get("python"),
                                 free_loopback_port(), nodes_share_host=topology.nodes > 1)
        if ranks_here:
            env = one_node_environment(env, topology)
        return run_processes(commands, env, run_dir, out_dir, topology.world_size, timeout_s,
                             ranks_themselves=ranks_here)
