"""Local mode: N torchrun elastic agents on this host, one per node, rendezvousing over c10d.

Each agent is a real ``torch.distributed.run`` process (the machinery behind ``torchrun``), so one
host exercises the same rendezvous path a cluster uses across nodes. The agents start in their
own sessions and the whole process tree is reaped afterwards, whatever happened.

Where this process may build them, every node is a host of its own: a network namespace with
its own address on a private bridge, its link shaped by ``--dlperf-link``; its agent and its
ranks run inside it, so traffic between nodes crosses a network device and traffic within a
node does not. As root the fabric is the machine's (``fabric``: its namespaces last the
session); otherwise it is built inside each launch's user namespace (``userhosts``), where the
kernel lets one make veth pairs. Elsewhere the agents share one namespace and its loopback
(``netns``), and the results say so (``network``).

The ranks of a one-node case (1n1d, 1n8d) have no nodes to rendezvous across: they start without
an agent, with the variables an agent would give them, and rank 0 hosts the store the others
join (torch's own env:// rendezvous; TensorFlow's address exchange goes through it too). An
agent's own ``import torch`` and start-up and wind-down were 2-3 s of every launch on a 2-core
host (docs/multinode.md); the ranks train and are timed the same way.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path
from typing import Any

from ...core.link import Link, format_rate
from ...core.ports import free_loopback_port
from ...core.topology import Topology
from ..base import Launcher
from ..onehost import fabric, userhosts
from ..processes import (
    Processes,
    agent_command,
    new_run_id,
    on_side,
    one_node_environment,
    prepare,
    rank_command,
    rank_variables,
    worker_environment,
)
from ..protocol import LauncherProtocol, Rendezvous
from . import netns


class LocalLauncher(Launcher):
    """Every node's agent on this host, rendezvousing on loopback (one node: its ranks, without
    agents); inside a private network namespace where the host allows one (see ``netns``)."""

    name = "local"
    all_nodes_here = True

    def __init__(self, link: Link | None = None, node_hosts: bool | str | None = None) -> None:
        """``link``: each node's link (nodes as hosts only); ``node_hosts``: whether nodes are
        hosts of their own: None or True, wherever this process can make them (root's fabric
        first); ``"user"``, in a user namespace even as root; False, never."""
        self.link = link or Link()
        self._asked = node_hosts
        self._how: str | None = None
        self._fabric: fabric.Fabric | None = None
        self._measured: float | None = None
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            fabric.sweep()  # what a run killed too hard to clean up left, as for scratch

    @property
    def hosts_how(self) -> str:
        """How nodes are hosts: ``root`` (``fabric``), ``user`` (``userhosts``) or ``none``;
        asked of the machine (a bridge made and removed) when first needed, not at every
        session's start."""
        if self._how is None:
            if self._asked is False:
                self._how = "none"
            elif self._asked != "user" and fabric.available()[0]:
                self._how = "root"
            else:
                self._how = "user" if userhosts.available()[0] else "none"
        return self._how

    @property
    def node_hosts(self) -> bool:
        """Whether nodes are hosts of their own."""
        return self.hosts_how != "none"

    def why_no_node_hosts(self) -> str:
        return (f"as root: {fabric.available()[1] or 'possible'}; "
                f"in a user namespace: {userhosts.available()[1] or 'possible'}")

    @property
    def isolation(self) -> str | None:
        return "network-namespace" if self.node_hosts or netns.available() else "none"

    def link_fingerprint(self, topology: Topology) -> str | None:
        """What a multi-node case's fingerprint says of the network between its nodes (a
        baseline at 10 Gbit/s never judges a 1 Gbit/s run); None: one node, or loopback nodes
        (as fingerprints were before nodes became hosts)."""
        return str(self.link) if topology.nodes > 1 and self.node_hosts else None

    def network(self, topology: Topology) -> dict[str, Any] | None:
        """The nodes' network as the results record it: their addresses, the link as asked,
        and what it measured (once a session, node 0 to node 1, one TCP stream)."""
        if topology.nodes == 1:
            return None
        if not self.node_hosts:
            return {"nodes": "one network namespace (loopback)", "addresses": ["127.0.0.1"],
                    "link": "loopback"}
        facts: dict[str, Any] = {"nodes": "a network namespace per node, on a bridge",
                                 "addresses": self._addresses(topology.nodes),
                                 "link": str(self.link)}
        if self.hosts_how == "user":
            facts["nodes"] += ", inside a user namespace (not root)"
        try:
            if self._fabric is not None:
                measured = self._fabric.measure()
            else:
                if self._measured is None:
                    self._measured = userhosts.measure(self.link)
                measured = self._measured
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            return {**facts, "measured": None, "measure_error": str(exc)[:300]}
        return {**facts, "measured_bps": measured, "measured": format_rate(measured)}

    def _addresses(self, count: int) -> list[str]:
        if self.hosts_how == "user":
            return userhosts.addresses(count)
        return [host.address for host in self.hosts(count)]

    def hosts(self, count: int) -> list[fabric.Host]:
        if self._fabric is None:
            self._fabric = fabric.Fabric(self.link)
        return self._fabric.ensure(count)

    def close(self) -> None:
        if self._fabric is not None:
            self._fabric.close()
            self._fabric = None

    # -- one launch, phase by phase ------------------------------------------------------

    def rendezvous(self, topology: Topology, run_dir: Path) -> Rendezvous:
        """Node 0's address where nodes are hosts, at a port drawn at random (nothing but this
        run's own earlier processes ever listened in these namespaces; a port of theirs may
        still be in TIME_WAIT; below Linux's ephemeral ports, 32768 and up, that connections
        take); else loopback at a free port (one node: rank 0's store)."""
        if topology.nodes > 1 and self.node_hosts:
            return Rendezvous(self._addresses(topology.nodes)[0],
                              random.randrange(20000, 32768), new_run_id())
        return Rendezvous("127.0.0.1", free_loopback_port(), new_run_id())

    def start(self, spec: dict[str, Any], topology: Topology, run_dir: Path,
              meeting: Rendezvous, timeout_s: float) -> Processes:
        if topology.nodes > 1 and self.node_hosts:
            return self._start_on_hosts(spec, topology, run_dir, meeting, timeout_s)
        spec_path, out_dir, tmp_dir = prepare(spec, run_dir)
        ranks_here = topology.nodes == 1  # the ranks themselves, no agents
        # Every local node has this host's address.
        # (An agent reads the ranks' interpreter from the environment; rank_command names it.)
        env = worker_environment(topology, tmp_dir, None if ranks_here else spec.get("python"),
                                 free_loopback_port(), nodes_share_host=topology.nodes > 1,
                                 allocator=spec.get("allocator"))
        if ranks_here:
            env = one_node_environment(env, topology, meeting.port)
            commands = [rank_command(spec.get("python"), spec_path, out_dir, rank_variables(rank))
                        for rank in range(topology.world_size)]
        else:
            commands = [agent_command(topology, meeting.endpoint, meeting.run_id, spec_path,
                                      out_dir, timeout_s) for _ in range(topology.nodes)]
        commands = [on_side(command, spec, env) for command in commands]
        if netns.available():
            kind = "rank" if ranks_here else "agent"
            logs = [run_dir / f"{kind}-{i}.log" for i in range(len(commands))]
            commands = [netns.wrap(commands, logs, run_dir / "netns-plan.json")]
        return Processes(run_dir, out_dir, topology.world_size, timeout_s,
                         ranks_themselves=ranks_here).start(commands, env)

    def collect(self, launch: Processes, timeout_s: float) -> list[dict[str, Any]]:
        """The ranks' files in the run folder (the default result channel)."""
        return launch.collect()

    def stop(self, launch: Processes) -> None:
        launch.stop()

    def _start_on_hosts(self, spec: dict[str, Any], topology: Topology, run_dir: Path,
                        meeting: Rendezvous, timeout_s: float) -> Processes:
        """Each node's agent inside its own host, the rendezvous on node 0's address."""
        spec_path, out_dir, tmp_dir = prepare(spec, run_dir)
        addresses = self._addresses(topology.nodes)
        framework_port = random.choice([p for p in range(20000, 32768) if p != meeting.port])
        env = worker_environment(topology, tmp_dir, spec.get("python"), framework_port,
                                 nodes_share_host=False, worker_host=None,
                                 allocator=spec.get("allocator"))
        commands = []
        for address in addresses:
            # Gloo binds the address the host name resolves to unless told an interface: the
            # machine's name resolves to an address no node namespace has.
            here = [f"DLPERF_WORKER_HOST={address}", "GLOO_SOCKET_IFNAME=eth0",
                    "NCCL_SOCKET_IFNAME=eth0"]
            agent = agent_command(topology, meeting.endpoint, meeting.run_id, spec_path,
                                  out_dir, timeout_s, local_addr=address,
                                  is_host=address == meeting.host)
            commands.append(["env", *here, *on_side(agent, spec, env)])
        if self.hosts_how == "root":
            commands = [host.command(command)
                        for host, command in zip(self.hosts(topology.nodes), commands)]
        else:  # built inside the launch's own user namespace, a node per command
            logs = [run_dir / f"agent-{i}.log" for i in range(len(commands))]
            commands = [netns.wrap(commands, logs, run_dir / "netns-plan.json",
                                   hosts=str(self.link))]
        return Processes(run_dir, out_dir, topology.world_size, timeout_s).start(commands, env)


def make(environ: dict[str, str]) -> LocalLauncher:
    """``--dlperf-launcher local``: every node on this host."""
    return LocalLauncher()


# mypy checks the launcher against the protocol here.
_PROTOCOL: type[LauncherProtocol[Processes]] = LocalLauncher
