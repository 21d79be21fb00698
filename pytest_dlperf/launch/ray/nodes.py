"""The Ray cluster's nodes as the Ray launcher sees them (``launch/ray/__init__.py``): which are alive
and what each holds, the bundles a topology asks of them, and why a cluster cannot hold a
topology, said with what it has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.topology import Topology


@dataclass(frozen=True)
class RayNode:
    node_id: str
    address: str
    name: str  # ray start --node-name, else its address
    host: str  # the host name the node's raylet runs on
    cpus: float
    gpus: float

    def __str__(self) -> str:
        name = self.name if self.name == self.address else f"{self.name} ({self.address})"
        gpus = f", {self.gpus:g} GPU" if self.gpus else ""
        return f"{name}: {self.cpus:g} CPU{gpus}"


def alive_nodes() -> list[RayNode]:
    """The cluster's alive nodes that offer CPUs (a head started with ``--num-cpus 0`` holds
    no rank), as the connected driver sees them."""
    import ray

    nodes = []
    for info in ray.nodes():  # type: ignore[no-untyped-call]
        resources: dict[str, Any] = info.get("Resources", {})
        if not info.get("Alive") or not resources.get("CPU"):
            continue
        address = str(info.get("NodeManagerAddress", "?"))
        nodes.append(RayNode(str(info.get("NodeID")), address,
                             str(info.get("NodeName") or address),
                             str(info.get("NodeManagerHostname", "")),
                             float(resources.get("CPU", 0)), float(resources.get("GPU", 0))))
    return sorted(nodes, key=lambda n: (n.name, n.address))


def bundles_for(topology: Topology) -> list[dict[str, float]]:
    """One bundle per node: the CPUs (the case's threads a rank) and, on CUDA, the GPUs of
    that node's ranks together."""
    per_node = topology.devices_per_node
    bundle = {"CPU": float(topology.threads_per_worker * per_node)}
    if topology.device_type == "cuda":
        bundle["GPU"] = float(per_node)
    return [dict(bundle) for _ in range(topology.nodes)]


def fit_message(nodes: list[RayNode], count: int, per_node: int, device_type: str,
                address: str, threads: int = 1) -> str | None:
    """Why ``nodes`` cannot hold ``count`` nodes of ``per_node`` ranks (each ``threads``
    CPUs, and a GPU on CUDA), naming what the cluster has; None where they can."""
    cpus = threads * per_node
    gpus = per_node if device_type == "cuda" else 0
    fitting = [n for n in nodes if n.cpus >= cpus and n.gpus >= gpus]
    if len(fitting) >= count:
        return None
    need = f"{cpus} CPU" + (f" and {gpus} GPU" if gpus else "")
    has = "; ".join(map(str, nodes)) or "no alive node with CPUs"
    return (f"--nodes={count} with --devices-per-node={per_node} needs {count} Ray node(s) of "
            f"{need} each, but the Ray cluster at {address} has {len(fitting)} such alive "
            f"node(s) ({has}); pass --nodes {len(fitting)} or fewer (or fewer devices per "
            "node), or add nodes to the cluster")
