"""A case's phases on the pytest side: its figures from the launches' diagnostic steps, and
the scaling model held against a multi-device case's efficiency, with the bandwidth it assumes
found in one place (the link measured between local nodes; else ``--dlperf-link``; else the
NIC's rate; else the gradients all-reduced alone)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.phases import Phases
from ..core.protocol import Result
from ..launch import Cluster
from ..verdict import scaling as model_of
from ..verdict.scaling import ScalingModel


def of(result: Result) -> Phases | None:
    return result.phases.figures() if result.phases is not None else None


@dataclass(frozen=True)
class Scaled:
    model: ScalingModel
    warning: str | None


def scaling(cluster: Cluster, one_device: Phases | None, result: Result,
            speedup: float | None, one_threads: int = 1) -> Scaled | None:
    """The model for this multi-device case (None: a single device, no 1n1d phases, or a
    layout whose communication is not separated) and its warning where the measured
    efficiency is far below it."""
    many = of(result)
    devices = cluster.world_size
    if devices < 2 or one_device is None or many is None:
        return None
    bandwidth, source = bandwidth_of(cluster, many, devices)
    efficiency = speedup / devices if speedup is not None else None
    model = model_of.predict(one_device, many, devices, bandwidth, source, efficiency,
                             compute_scale(cluster, one_threads))
    if model is None:
        return None
    return Scaled(model, model_of.out_of_line(model, one_device, many))


def compute_scale(cluster: Cluster, one_threads: int) -> float:
    """A rank's compute over one device's: on a CPU, the 1n1d run's threads over a rank's (the
    harness gives each of N local ranks its share of the cores); 1 on GPUs."""
    if cluster.device_type != "cpu":
        return 1.0
    return max(1.0, one_threads / max(1, cluster.topology.threads_per_worker))


def bandwidth_of(cluster: Cluster, many: Phases, devices: int) -> tuple[float | None, str]:
    """The bit rate the model assumes between the ranks, and where it came from."""
    topology = cluster.topology
    if topology.nodes > 1:
        network = cluster.launcher.network(topology) or {}
        if network.get("measured_bps"):
            return float(network["measured_bps"]), "the link between the nodes, measured"
        link = getattr(cluster.launcher, "link", None)
        rate = getattr(link, "rate_bps", None)
        if rate:
            return float(rate), "--dlperf-link"
        nic = nic_bps()
        if nic:
            return nic, "the NIC's rate (/sys/class/net)"
    if many.communication_s and many.gradient_bytes:
        moved = 2 * (devices - 1) / devices * many.gradient_bytes * 8
        return moved / many.communication_s, "the gradients all-reduced alone"
    return None, ""


def nic_bps(root: Path = Path("/sys/class/net")) -> float | None:
    """The fastest up, physical network interface's rate (Mbit/s in sysfs), in bit/s."""
    rates = []
    try:
        interfaces = list(root.iterdir())
    except OSError:
        return None
    for interface in interfaces:
        if interface.name == "lo" or not (interface / "device").exists():
            continue
        try:
            if (interface / "operstate").read_text().strip() != "up":
                continue
            speed = int((interface / "speed").read_text().strip())
        except (OSError, ValueError):
            continue
        if speed > 0:
            rates.append(speed * 1e6)
    return max(rates) if rates else None
