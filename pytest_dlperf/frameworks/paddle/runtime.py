"""What a Paddle rank runs on, apart from what it trains (``PaddleRuntime``): Paddle's variables
from the launcher's (``paddle.prepare_environ``, before Paddle is imported), its threads, its
device (a CUDA rank's GPU checked, the default place set), its process group, the model's seed,
the wait for the device at a timing boundary, the allocator's peaks, and Paddle's part of the
environment a result records. One object per rank, made before the recipe is built;
``paddle.PaddleTrainer`` holds it and trains on it.

Runs inside a worker rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping
from typing import Any

from ...core.spec import RankSpec
from .. import DeviceUnavailable, DistEnv


class PaddleRuntime:
    """A Paddle rank's environment, threads, device, process group, seed, synchronization,
    memory peaks and environment record."""

    def __init__(self, spec: RankSpec, dist: DistEnv,
                 prepare: Callable[[MutableMapping[str, str], DistEnv, bool], None]) -> None:
        self.cuda = spec.device_type == "cuda"
        prepare(os.environ, dist, self.cuda)
        import paddle

        self.paddle = paddle
        self.threads = spec.threads
        paddle.base.core.set_num_threads(self.threads)
        if self.cuda:
            count = paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0
            if dist.local_rank >= count:
                raise DeviceUnavailable(
                    f"the case runs on CUDA (NVML found GPUs) but Paddle {paddle.__version__} "
                    f"sees {count} GPU(s) and this rank has local rank {dist.local_rank}; "
                    "install paddlepaddle-gpu or run with --dlperf-device cpu")
            self.device = f"gpu:{dist.local_rank}"
        else:
            self.device = "cpu"
        # The recipe makes its tensors on the current device, Paddle's default place.
        paddle.set_device(self.device)
        if dist.world_size > 1:
            paddle.distributed.init_parallel_env()
        # One seed for the model on every rank (DataParallel broadcasts rank 0's anyway); the
        # trainer seeds the data drawn afterwards per replica.
        paddle.seed(spec.seed)

    def synchronize(self) -> None:
        # On CPU, Paddle's kernels have run when the op returns (paddle.device.synchronize
        # raises TypeError there); tests/test_conformance_measured.py checks a window against a
        # wall clock.
        if self.cuda:
            self.paddle.device.synchronize(self.device)

    def reset_peak_memory(self) -> None:
        if self.cuda:
            cuda = self.paddle.device.cuda
            cuda.reset_max_memory_allocated(self.device)
            cuda.reset_max_memory_reserved(self.device)

    def peak_memory(self) -> dict[str, int]:
        """Paddle's allocator peaks on this rank's GPU since the last reset."""
        if not self.cuda:
            return {}
        cuda = self.paddle.device.cuda
        return {"allocated_peak_bytes": int(cuda.max_memory_allocated(self.device)),
                "reserved_peak_bytes": int(cuda.max_memory_reserved(self.device))}

    def environment(self) -> dict[str, Any]:
        """Paddle's version, threads and the ranks its process group joined (get_world_size
        alone falls back to PADDLE_TRAINERS_NUM, which the adapter set itself); on CUDA, the
        device, its libraries and what changes its kernels."""
        paddle = self.paddle
        env: dict[str, Any] = {
            "framework": "paddle",
            "framework_version": paddle.__version__,
            "threads": self.threads,
            "data_parallel_ranks": (paddle.distributed.get_world_size()
                                    if paddle.distributed.is_initialized() else 1),
        }
        if self.cuda:
            core = paddle.base.core
            env.update(device_name=paddle.device.cuda.get_device_name(self.device),
                       cuda=paddle.version.cuda(), cudnn=paddle.version.cudnn(),
                       nccl=str(paddle.version.nccl()),
                       cudnn_exhaustive_search=os.environ.get("FLAGS_cudnn_exhaustive_search"),
                       # Paddle's TF32 switches for cuBLAS and cuDNN (both on by default): an
                       # fp32 case's MFU is then taken against the TF32 peak.
                       tf32=bool(core.get_cublas_switch() or core.get_cudnn_switch()))
        return env

    def close(self) -> None:
        pass  # Paddle's gloo and NCCL groups are torn down at interpreter exit
