"""One pytest session's view of the cluster: settings, hardware, launcher, the topology ladder
and the scratch folder; everything the fixtures need that outlives a single case."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .baselines import BaselineStore
from .launch import Launcher, detect, get_launcher
from .report import CaseReport
from .settings import Settings
from .topology import Hardware, Topology, detect_hardware, make_topology


@dataclass
class SessionState:
    settings: Settings
    store: BaselineStore
    rootpath: Path
    reports: list[CaseReport] = field(default_factory=list)
    _hardware: Hardware | None = None
    _work_root: Path | None = None
    _launcher: Launcher | None = None

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            name = self.settings.launcher
            try:
                self._launcher = get_launcher(detect(dict(os.environ)) if name == "auto" else name,
                                              dict(os.environ))
            except LookupError as exc:
                raise pytest.UsageError(f"pytest-dlperf: {exc}") from None
        return self._launcher

    @property
    def hardware(self) -> Hardware:
        if self._hardware is None:  # lazily: only sessions that run cases pay for detection
            self._hardware = detect_hardware()
        return self._hardware

    @property
    def device_type(self) -> str:
        wanted = self.settings.device
        if wanted == "cuda" and not self.hardware.gpus:
            raise pytest.UsageError(
                "pytest-dlperf: --dlperf-device=cuda, but no NVIDIA GPU was found through NVML "
                "(pynvml); use --dlperf-device=cpu or run on a GPU host")
        return self.hardware.device_type if wanted == "auto" else wanted

    @property
    def compilers(self) -> tuple[str, ...]:
        """The compiler axis: as given, else eager on CPU and both on CUDA."""
        if self.settings.compilers is not None:
            return self.settings.compilers
        return ("eager", "compiled") if self.device_type == "cuda" else ("eager",)

    @property
    def devices_per_node(self) -> int:
        hw, wanted = self.hardware, self.settings.devices_per_node
        launched = self.launcher.launched_shape
        if launched is not None:  # external: the job was started with its own shape
            return launched[1]
        if self.device_type == "cuda":
            have, what = len(hw.gpus), "NVIDIA GPUs"
        else:  # one core at least per simulated device, or DDP oversubscribes the CPU
            have, what = hw.cpu_count, "usable CPU cores (one per simulated device)"
        allocation = self.launcher.allocation
        if self.device_type == "cuda" and allocation is not None and allocation.gpus_per_node:
            have, what = allocation.gpus_per_node, "GPUs per node in the Slurm allocation"
        if wanted is None:
            if self.device_type == "cuda":
                return have
            # Local nodes share this host's cores: keep every node's ranks within them (one per
            # node at least). 8 single-thread ranks on 2 cores ran many times slower.
            sharing = self.settings.nodes if self.launcher.all_nodes_here else 1
            return max(1, min(2, have // sharing))
        if wanted > have:
            raise pytest.UsageError(
                f"pytest-dlperf: --devices-per-node={wanted}, but this host has {have} {what}; "
                f"pass --devices-per-node {have} or less")
        return wanted

    def ladder(self, multinode: bool) -> list[Topology]:
        """DLPerf's ladder: 1 device, then a full node; multinode cases add 2, 4, ... nodes."""
        per_node = self.devices_per_node
        launched = self.launcher.launched_shape
        max_nodes = launched[0] if launched is not None else self.settings.nodes
        shapes = {(1, 1), (1, per_node)}
        if multinode:
            n = 2
            while n < max_nodes:
                shapes.add((n, per_node))
                n *= 2
            shapes.add((max_nodes, per_node))
        return [make_topology(self.hardware, n, d, self.device_type,
                              all_nodes_here=self.launcher.all_nodes_here)
                for n, d in sorted(shapes)]

    def check_nodes(self) -> None:
        allocation = self.launcher.allocation
        if allocation is not None and self.settings.nodes > allocation.nodes:
            raise pytest.UsageError(
                f"pytest-dlperf: --nodes={self.settings.nodes}, but Slurm allocation "
                f"{allocation.job_id} has {allocation.nodes} node(s) ({allocation.nodelist}); "
                f"pass --nodes {allocation.nodes} or less, or allocate more nodes")

    @property
    def is_reporter(self) -> bool:
        """Only rank 0 of an externally launched job writes results and tables."""
        return self._launcher is None or self._launcher.is_reporter

    @property
    def work_root(self) -> Path:
        """Per-session scratch for the cases' specs and results. Remote nodes must see it,
        so outside local mode it lives under the rootdir, not in this host's /tmp."""
        if self._work_root is None:
            parent = None
            if not self.launcher.all_nodes_here:
                parent = self.rootpath / ".pytest-dlperf"
                parent.mkdir(exist_ok=True)
            self._work_root = Path(tempfile.mkdtemp(prefix="pytest-dlperf-", dir=parent))
        return self._work_root

    def close(self) -> None:
        if self._work_root is not None:
            shutil.rmtree(self._work_root, ignore_errors=True)
