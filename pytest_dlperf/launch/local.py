"""Local mode: N torchrun elastic agents on this host, rendezvousing over c10d on loopback.

Each agent is a real ``torch.distributed.run`` process (the machinery behind ``torchrun``), so one
host exercises the same rendezvous path a cluster uses. The agents start in their own sessions
and the whole process tree is reaped afterwards, whatever happened.

A case of one rank (1n1d) has nothing to rendezvous with: its rank starts alone, with the
variables an agent would give it, and no agent. The agent's own ``import torch`` and start-up are
2-3 s of every such launch on a 2-core host (README "Launch modes"); the rank trains and is timed
the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..topology import Topology
from . import Launcher, netns
from .processes import (agent_command, free_loopback_port, new_run_id, prepare, rank_command,
                        run_processes, single_rank_environment, worker_environment)


class LocalLauncher(Launcher):
    """Every node's agent on this host, rendezvousing on loopback; inside a private network
    namespace where the host allows one (see ``netns``)."""

    name = "local"
    all_nodes_here = True

    @property
    def isolation(self) -> str | None:
        return "network-namespace" if netns.available() else "none"

    def run(self, spec: dict[str, Any], topology: Topology, run_dir: Path,
            timeout_s: float) -> list[dict[str, Any]]:
        spec_path, out_dir, tmp_dir = prepare(spec, run_dir)
        alone = topology.world_size == 1  # the rank itself, no agent
        if alone:
            commands = [rank_command(spec.get("python"), spec_path, out_dir)]
        else:
            # One node hosts the store itself and may let the OS pick the port.
            port = 0 if topology.nodes == 1 else free_loopback_port()
            run_id = new_run_id()
            commands = [agent_command(topology, f"127.0.0.1:{port}", run_id, spec_path, out_dir,
                                      timeout_s) for _ in range(topology.nodes)]
        if self.isolation == "network-namespace":
            logs = [run_dir / f"agent-{i}.log" for i in range(topology.nodes)]
            commands = [netns.wrap(commands, logs, run_dir / "netns-plan.json")]
        # Every local node has this host's address.
        # (An agent reads the ranks' interpreter from the environment; rank_command names it.)
        env = worker_environment(topology, tmp_dir, None if alone else spec.get("python"),
                                 free_loopback_port(), nodes_share_host=topology.nodes > 1)
        if alone:
            env = single_rank_environment(env)
        return run_processes(commands, env, run_dir, out_dir, topology.world_size, timeout_s,
                             rank_itself=alone)
