"""The cluster a case runs on: hardware detection, nodes x devices, and the baseline fingerprint.

Detection reads three sources, each a small function so one test fixture can replace them all:
NVIDIA devices through pynvml, the CPU model from /proc/cpuinfo, and the usable core count.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .allocator import DYNAMIC


@dataclass(frozen=True)
class Hardware:
    """What this host has: GPU names (empty without NVIDIA devices) and their total memory in
    bytes, the driver, CPU model, usable cores."""

    gpus: tuple[str, ...]
    cpu_model: str
    cpu_count: int
    gpu_driver: str | None = None
    gpu_memory: tuple[int, ...] = ()
    # The CPU computes bf16 itself (AVX512-BF16 or AMX); without, CPU AMP is emulated
    cpu_bf16: bool = False

    @property
    def device_type(self) -> str:
        return "cuda" if self.gpus else "cpu"


@dataclass(frozen=True)
class NvmlDevices:
    names: tuple[str, ...] = ()
    memory: tuple[int, ...] = ()  # total bytes, per device
    driver: str | None = None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvml_devices() -> NvmlDevices:
    try:
        import pynvml
    except ImportError:
        return NvmlDevices()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver or no device: a CPU host
        return NvmlDevices()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                   for i in range(pynvml.nvmlDeviceGetCount())]
        return NvmlDevices(
            names=tuple(_text(pynvml.nvmlDeviceGetName(h)) for h in handles),
            memory=tuple(int(pynvml.nvmlDeviceGetMemoryInfo(h).total) for h in handles),
            driver=_text(pynvml.nvmlSystemGetDriverVersion()))
    finally:
        pynvml.nvmlShutdown()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def _cpu_bf16() -> bool:
    """Whether the CPU has bf16 instructions (Linux's flags: avx512_bf16, amx_bf16)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return bool({"avx512_bf16", "amx_bf16"} & set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return False


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def detect_hardware() -> Hardware:
    nvml = _nvml_devices()
    return Hardware(gpus=nvml.names, cpu_model=_cpu_model(), cpu_count=_cpu_count(),
                    gpu_driver=nvml.driver, gpu_memory=nvml.memory, cpu_bf16=_cpu_bf16())


@dataclass(frozen=True)
class Topology:
    """Nodes x devices per node of one case, on one kind of device."""

    nodes: int
    devices_per_node: int
    device_type: str
    device_name: str
    # On CPU each simulated device is one process: cores are shared out so DDP does not
    # oversubscribe (2 workers x 2 threads on 2 cores ran 10x slower).
    threads_per_worker: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def backend(self) -> str:
        return "nccl" if self.device_type == "cuda" else "gloo"

    @property
    def id(self) -> str:
        return f"{self.nodes}n{self.devices_per_node}d"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(world_size=self.world_size, backend=self.backend, id=self.id)
        return data


def make_topology(hardware: Hardware, nodes: int, devices_per_node: int, device_type: str,
                  *, all_nodes_here: bool = True) -> Topology:
    """``all_nodes_here``: local mode runs every node's workers on this host, so they share
    its cores; on a real cluster each node has its own."""
    name = (hardware.gpus[0] if hardware.gpus else "cuda") if device_type == "cuda" else hardware.cpu_model
    sharing = nodes * devices_per_node if all_nodes_here else devices_per_node
    return Topology(nodes=nodes, devices_per_node=devices_per_node, device_type=device_type,
                    device_name=name, threads_per_worker=max(1, hardware.cpu_count // sharing))


def python_minor(version: str | None) -> str:
    """``3.10.14`` -> ``3.10``; None: this interpreter's."""
    parts = (version or platform.python_version()).split(".")
    return ".".join(parts[:2])


def fingerprint(topology: Topology, *, framework: str, framework_version: str, precision: str,
                model: str, batch_size: int | str, sizes: Mapping[str, Any], protocol_slug: str,
                python: str | None = None, accelerator_stack: str | None = None,
                compiler: str = "eager", machine: str | None = None,
                link: str | None = None, allocator: str | None = None) -> dict[str, Any]:
    """Everything that must match for two throughput figures to be comparable: the workload's
    own sizes (ResNet-50's ``image_size``, a transformer's sequence length) sit beside the
    batch. ``python`` is the ranks' interpreter (major.minor). (``compiler`` appears only when
    it is not eager, so eager fingerprints stay what they always were.) ``machine`` names the
    host the figures belong to (``--dlperf-machine``): two hosts of one model are still two.
    ``link``: the network between local nodes that are hosts of their own (``--dlperf-link``,
    or "unshaped"). ``allocator``: the ranks' heap allocator (``core.allocator``'s label):
    glibc's thresholds alone moved a small model's step 1.5x."""
    fp: dict[str, Any] = {
        "device_type": topology.device_type,
        "device_model": topology.device_name,
        "nodes": topology.nodes,
        "devices_per_node": topology.devices_per_node,
        "framework": framework,
        "framework_version": framework_version,
        "precision": precision,
        "model": model,
        "batch_size": batch_size,
        **sizes,
        "protocol": protocol_slug,
        "python": python or python_minor(None),
    }
    if topology.device_type == "cpu":
        fp["threads_per_worker"] = topology.threads_per_worker
    if accelerator_stack:
        fp["accelerator_stack"] = accelerator_stack
    if compiler != "eager":
        fp["compiler"] = compiler
    if machine:
        fp["machine"] = machine
    if link:
        fp["link"] = link
    if allocator:
        fp["allocator"] = allocator
    return fp


def earlier_fingerprints(fp: dict[str, Any]) -> list[dict[str, Any]]:
    """The fingerprints older versions filed ``fp``'s figures under: without an allocator
    where the ranks run on glibc as it comes (before ``--dlperf-allocator`` they all did), and
    with pytest's Python (before the ranks' was recorded)."""
    fps = [fp]
    if fp.get("allocator") == DYNAMIC:
        fps.append({k: v for k, v in fp.items() if k != "allocator"})
    pytest_python = python_minor(None)
    fps += [{**f, "python": pytest_python} for f in fps if f.get("python") != pytest_python]
    return fps[1:]


def nearest_difference(fp: dict[str, Any], others: list[dict[str, Any]]
                       ) -> list[tuple[str, Any, Any]]:
    """Where the nearest of ``others`` (the fewest fields apart) differs from ``fp``: each
    field as (name, its value there, here), None where a side has none; empty where none of
    ``others`` differs from ``fp`` (or none is given)."""
    nearest: list[str] | None = None
    chosen: dict[str, Any] = {}
    for other in others:
        keys = sorted(k for k in set(fp) | set(other) if fp.get(k) != other.get(k))
        if keys and (nearest is None or len(keys) < len(nearest)):
            nearest, chosen = keys, other
    return [(key, chosen.get(key), fp.get(key)) for key in nearest or []]


def fingerprint_id(fp: dict[str, Any]) -> str:
    """A readable, unique file stem: the main facts, then a hash of all of them."""
    digest = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:10]
    device = re.sub(r"[^a-z0-9]+", "-", str(fp["device_model"]).lower()).strip("-")[:32]
    version = re.sub(r"[^A-Za-z0-9.]+", "-", str(fp["framework_version"]))
    return f"{device}__{fp['framework']}-{version}__{fp['protocol']}__{digest}"
