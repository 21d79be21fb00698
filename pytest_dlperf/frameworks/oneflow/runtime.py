"""What a OneFlow rank runs on, apart from what it trains (``OneFlowRuntime``): the variables
OneFlow reads at import, adjusted to the launch, its threads, its device (a CUDA rank's GPU
checked), the model's seed, the wait for OneFlow's virtual machine and the device, and OneFlow's
part of the environment a result records. One object per rank, made before the recipe is built;
``oneflow.OneFlowTrainer`` holds it and trains on it.

Runs inside a worker rank, under OneFlow's own interpreter.
"""

from __future__ import annotations

import os
from typing import Any

from ...core.spec import RankSpec
from .. import DeviceUnavailable, DistEnv


def prepare_environ(environ: Any) -> None:
    """What OneFlow reads at import, adjusted to the launch (so: before importing oneflow).

    - its control plane on the launcher's spare port (torchrun's agent store holds MASTER_PORT);
    - local nodes all have this host's address, and OneFlow groups ranks into nodes by the
      address its master sees, so there it is one node whose processes need distinct local
      ranks (two processes of one host with LOCAL_RANK 0 abort at start-up: "Machine 1 lost",
      seen here). Its inter-node transport is then not what runs; on a real cluster it is.
    """
    port = environ.get("DLPERF_FRAMEWORK_PORT")
    if port:
        environ["MASTER_PORT"] = port
    if environ.get("DLPERF_NODES_SHARE_HOST") == "1":
        environ["LOCAL_RANK"] = environ.get("RANK", "0")


class OneFlowRuntime:
    """A OneFlow rank's import-time variables, threads, device, seed, synchronization and
    environment."""

    def __init__(self, spec: RankSpec, dist: DistEnv) -> None:
        prepare_environ(os.environ)
        import oneflow as flow

        self.flow = flow
        self.cuda = spec.device_type == "cuda"
        self.threads = spec.threads
        if self.threads < (os.cpu_count() or 1):  # OneFlow warns about a count of every core
            flow.set_num_threads(self.threads)
        self.local_rank = int(os.environ.get("LOCAL_RANK", dist.local_rank))
        if self.cuda and self.local_rank >= flow.cuda.device_count():
            raise DeviceUnavailable(
                f"the case runs on CUDA (NVML found GPUs) but OneFlow {flow.__version__} sees "
                f"{flow.cuda.device_count()} GPU(s) and this rank has local rank "
                f"{self.local_rank} (its CUDA 11 build needs a driver that runs CUDA 11 and the "
                "CUDA 11 libraries scripts/setup-oneflow installs); or run with "
                "--dlperf-device cpu")
        self.device = flow.device("cuda", self.local_rank) if self.cuda else flow.device("cpu")
        # One seed for the model on every rank (nn.Graph's broadcast parameters are taken as
        # equal, not copied); the trainer seeds the data drawn afterwards per replica.
        flow.manual_seed(spec.seed)

    def synchronize(self) -> None:
        # Waits until OneFlow's virtual machine has run every queued instruction (eager ops and
        # graph launches alike); oneflow.cuda.synchronize calls it too, before the CUDA sync.
        self.flow._oneflow_internal.eager.Sync()
        if self.cuda:
            self.flow.cuda.synchronize(self.device)

    def environment(self) -> dict[str, Any]:
        """OneFlow's version, threads and the ranks of its world; on CUDA, the device, its
        CUDA and TF32."""
        flow = self.flow
        env: dict[str, Any] = {
            "framework": "oneflow",
            "framework_version": flow.__version__,
            "threads": self.threads,
            "data_parallel_ranks": flow.env.get_world_size(),
        }
        if self.cuda:
            import oneflow.sysconfig

            # OneFlow's CUDA matrix products use TF32 unless this variable turns it off.
            tf32 = os.environ.get("ONEFLOW_EP_CUDA_ENABLE_TF32_EXECUTION", "1")
            env.update(device_name=flow.cuda.get_device_name(self.device),
                       cuda=oneflow.sysconfig.get_cuda_version(),
                       tf32=tf32.lower() not in ("0", "false", "off"))
        return env

    def close(self) -> None:
        pass  # OneFlow tears its control plane down at interpreter exit
