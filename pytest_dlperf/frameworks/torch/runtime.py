"""What a torch rank runs on, apart from what it trains (``TorchRuntime``): its threads, its device
(a CUDA rank's GPU checked and selected), its process group and a sharded layout's device mesh,
the seed, the wait for the device at a timing boundary, the device's memory peaks, torch's part of
the environment a result records, and the group closed at the end. One object per rank, made
before the recipe is built; ``torch.TorchTrainer`` holds it and trains on it.

Runs inside a worker rank; torch is handed in, imported by the trainer.
"""

from __future__ import annotations

from typing import Any

from ...core.parallel import Layout
from ...core.spec import RankSpec
from .. import DeviceUnavailable, DistEnv
from . import parallel


class TorchRuntime:
    """A torch rank's threads, device, process group, seed, synchronization, memory peaks and
    environment."""

    def __init__(self, torch: Any, spec: RankSpec, dist: DistEnv) -> None:
        self.torch = torch
        self.dist = dist
        self.cuda = spec.device_type == "cuda"
        torch.set_num_threads(spec.threads)
        if self.cuda:
            if dist.local_rank >= torch.cuda.device_count():
                raise DeviceUnavailable(
                    f"the case runs on CUDA (NVML found GPUs) but torch {torch.__version__} "
                    f"(CUDA build: {torch.version.cuda or 'none'}) sees "
                    f"{torch.cuda.device_count()} GPU(s) and this rank has local rank "
                    f"{dist.local_rank}; install a CUDA build of torch or run with "
                    "--dlperf-device cpu")
            torch.cuda.set_device(dist.local_rank)
            self.device = torch.device("cuda", dist.local_rank)
            torch.backends.cudnn.benchmark = True
        else:
            self.device = torch.device("cpu")

    @property
    def backend(self) -> str:
        return "nccl" if self.cuda else "gloo"

    def join(self, layout: Layout, spec: RankSpec) -> Any:
        """The process group, and the seed; returns the layout's device mesh (None under plain
        data parallelism). Data parallel: a group of every rank where there are several, each
        rank seeded by its own rank (DDP broadcasts rank 0's weights). Sharded: a group of one
        rank too (FSDP's code names one on one device), seeded by the replica, so that the
        recipe's synthetic batch is its replica's (the batch DDP's rank of that index would
        train on); rank 0's weights are then given to every rank before sharding
        (``parallel.same_weights``)."""
        torch, dist = self.torch, self.dist
        if layout.is_data_parallel:
            if dist.world_size > 1:
                torch.distributed.init_process_group(backend=self.backend)
            torch.manual_seed(spec.seed + dist.rank)
            return None
        if dist.world_size > 1:
            torch.distributed.init_process_group(backend=self.backend)
        else:
            torch.distributed.init_process_group(
                backend=self.backend, store=torch.distributed.HashStore(), rank=0, world_size=1)
        mesh = parallel.device_mesh(layout, spec.device_type)
        torch.manual_seed(spec.seed + layout.data_rank(dist.rank))
        return mesh

    def synchronize(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def reset_peak_memory(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def peak_memory(self) -> dict[str, int]:
        """The caching allocator's peaks since the last reset: what tensors held, and what it
        reserved from the driver for them."""
        if not self.cuda:
            return {}
        cuda = self.torch.cuda
        return {"allocated_peak_bytes": int(cuda.max_memory_allocated(self.device)),
                "reserved_peak_bytes": int(cuda.max_memory_reserved(self.device))}

    def environment(self) -> dict[str, Any]:
        """torch's version, threads and the ranks its process group joined; on CUDA, the
        device, its libraries and what changes its kernels (cuDNN's autotuning, TF32)."""
        torch = self.torch
        env: dict[str, Any] = {
            "framework": "torch",
            "framework_version": torch.__version__,
            "threads": torch.get_num_threads(),
            # The ranks the process group really joined: what data parallelism spans.
            "data_parallel_ranks": (torch.distributed.get_world_size()
                                    if torch.distributed.is_initialized() else 1),
        }
        if self.cuda:
            env.update(
                cudnn_benchmark=torch.backends.cudnn.benchmark,
                fused_optimizer=True,
                device_name=torch.cuda.get_device_name(self.device),
                cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(),
                nccl=".".join(map(str, torch.cuda.nccl.version())),
                # TF32 in matrix products or convolutions (cuDNN's is on by default): an fp32
                # case's MFU is then taken against the TF32 peak (pytest_dlperf.rank.flops).
                tf32=bool(torch.backends.cuda.matmul.allow_tf32
                          or torch.backends.cudnn.allow_tf32),
            )
        return env

    def close(self) -> None:
        if self.torch.distributed.is_initialized():
            self.torch.distributed.destroy_process_group()
