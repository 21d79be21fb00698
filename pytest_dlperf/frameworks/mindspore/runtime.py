"""What a MindSpore rank runs on, apart from what it trains (``MindSporeRuntime``): MindSpore's
cluster (its variables from the launcher's, rank 0 starting the scheduler), MindSpore imported on
this rank's device with its share of the cores, in PyNative mode, the wait for its executor and
device, and MindSpore's part of the environment a result records. One object per rank, made
before the recipe is built; ``mindspore.MindSporeTrainer`` holds it and trains on it.

Runs inside a worker rank, under MindSpore's own interpreter.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, MutableMapping
from typing import Any

from ...core.spec import RankSpec
from .. import DeviceUnavailable, DistEnv


class MindSporeRuntime:
    """A MindSpore rank's cluster, device, threads, synchronization and environment."""

    def __init__(self, spec: RankSpec, dist: DistEnv,
                 prepare: Callable[[MutableMapping[str, str], DistEnv], None],
                 start_scheduler: Callable[[MutableMapping[str, str]],
                                           subprocess.Popen[bytes]]) -> None:
        self.world_size = dist.world_size
        self.cuda = spec.device_type == "cuda"
        self.threads = spec.threads
        self.scheduler: subprocess.Popen[bytes] | None = None
        # MindSpore logs every cluster and compile step at WARNING: errors only, unless asked.
        os.environ.setdefault("GLOG_v", "3")
        if dist.world_size > 1:
            prepare(os.environ, dist)
            if dist.rank == 0:
                self.scheduler = start_scheduler(os.environ)
        import mindspore as ms

        if self.cuda:
            if not ms.device_context.gpu.is_available():  # the PyPI wheel: CPU and Ascend
                raise DeviceUnavailable(
                    f"the case runs on CUDA (NVML found GPUs) but MindSpore {ms.__version__} "
                    "has no GPU backend here (the PyPI wheel is CPU and Ascend only): install "
                    "a GPU build of MindSpore or run with --dlperf-device cpu")
            ms.set_device("GPU", dist.local_rank)
        else:
            ms.set_device("CPU")
            # The CPU kernels' thread pool: 25 threads by default, whatever the cores. Set once
            # a process (MindSpore refuses a second setting: a second trainer keeps the first's).
            with contextlib.suppress(RuntimeError):
                ms.device_context.cpu.op_tuning.threads_num(self.threads)
        ms.set_context(mode=ms.PYNATIVE_MODE)
        if dist.world_size > 1:
            from mindspore.communication import init

            init()
        self.ms = ms

    def synchronize(self) -> None:
        """Waits for everything queued: PyNative's executor (eager operators and compiled
        steps alike are dispatched through it), then the device (GPU)."""
        from mindspore.common.api import _pynative_executor

        _pynative_executor.sync()
        if self.cuda:
            self.ms.runtime.synchronize()

    def environment(self) -> dict[str, Any]:
        """MindSpore's version, threads and ranks; on CUDA, the device."""
        env: dict[str, Any] = {
            "framework": "mindspore",
            "framework_version": self.ms.__version__,
            "threads": self.threads,
            "data_parallel_ranks": self.world_size,
        }
        if self.cuda:
            env["device_name"] = "GPU"
        return env

    def close(self) -> None:
        # Nothing to wait for: each worker unregisters from the scheduler as its interpreter
        # exits (MindSpore's own finalizer), and the scheduler then exits by itself. Waiting for
        # it here would wait for this very rank's unregistering.
        pass
