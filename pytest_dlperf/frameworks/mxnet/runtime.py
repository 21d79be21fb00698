"""What an MXNet rank runs on, apart from what it trains (``MXNetRuntime``): the key-value
store's job (MXNet's variables from the launcher's, rank 0 starting the scheduler and the server),
MXNet imported on this rank's device, the store the gradients cross, the wait for MXNet's engine,
and MXNet's part of the environment a result records. One object per rank, made before the recipe
is built; ``mxnet.MXNetTrainer`` holds it and trains on it.

Runs inside a worker rank, under MXNet's own interpreter.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ...core.spec import RankSpec
from ...core.strategies import Part
from .. import DeviceUnavailable, DistEnv


@dataclass(frozen=True, kw_only=True)
class MXNetPart(Part):
    """What an MXNet strategy's ``apply`` is given (a registered kind's: pfc): a ``Part``
    (``module``: the recipe's model, its parameters initialized on ``context``), MXNet itself
    (``mx``), its rank in the world, and the store (None on one rank).

    What a strategy leaves for the trainer: ``held``, the parameters this rank owns (neither
    broadcast from rank 0 nor summed through the store: each rank its own rows); ``notes``, by
    kind, what it sharded and where (the results' ``sharded_modules``)."""

    mx: Any
    rank: int
    context: Any
    store: Any
    held: list[Any] = field(default_factory=list)


class MXNetRuntime:
    """An MXNet rank's store job, device, store, synchronization and environment. Threads:
    OMP_NUM_THREADS, set by the launcher before MXNet starts its pools."""

    def __init__(self, spec: RankSpec, dist: DistEnv,
                 prepare: Callable[[MutableMapping[str, str], DistEnv], None],
                 start_roles: Callable[[MutableMapping[str, str]],
                                       list[subprocess.Popen[bytes]]]) -> None:
        self.world_size = dist.world_size
        self.cuda = spec.device_type == "cuda"
        self.threads = spec.threads
        self.roles: list[subprocess.Popen[bytes]] = []
        if dist.world_size > 1:
            prepare(os.environ, dist)
            if dist.rank == 0:
                self.roles = start_roles(os.environ)
        import mxnet as mx

        if self.cuda and mx.context.num_gpus() == 0:
            raise DeviceUnavailable(
                f"the case runs on CUDA (NVML found GPUs) but MXNet {mx.__version__} has no "
                "GPU here (the mxnet wheel is CPU only): install mxnet-cu112 (or another CUDA "
                "build) in its interpreter, or run with --dlperf-device cpu")
        self.mx = mx
        self.context = mx.gpu(dist.local_rank) if self.cuda else mx.cpu()
        self.kvstore: Any = None

    def store(self) -> Any:
        """The store the gradients are summed through (None on one rank): made once, when the
        trainer asks, after its model is built."""
        if self.kvstore is None and self.world_size > 1:
            self.kvstore = self.mx.kv.create("dist_sync_device" if self.cuda else "dist_sync")
        return self.kvstore

    def synchronize(self) -> None:
        """Waits for everything MXNet's engine has queued, on every device."""
        self.mx.nd.waitall()

    def environment(self) -> dict[str, Any]:
        """MXNet's version, threads, the store's workers and kind; on CUDA, the device."""
        kvstore = self.kvstore
        env: dict[str, Any] = {
            "framework": "mxnet",
            "framework_version": self.mx.__version__,
            "threads": self.threads,
            "data_parallel_ranks": kvstore.num_workers if kvstore else 1,
            "kvstore": kvstore.type if kvstore else None,
        }
        if self.cuda:
            env["device_name"] = f"GPU {self.context.device_id}"
        return env

    def close(self) -> None:
        # The store's roles exit once every worker has finalized (at interpreter exit, in
        # MXNet's own finalizer, which waits for the others at a barrier): waiting for them
        # here would wait for this very worker's finalizing.
        self.mx.nd.waitall()
