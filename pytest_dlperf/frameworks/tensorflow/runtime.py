"""What a TensorFlow rank runs on, apart from what it trains (``TensorFlowRuntime``): the
cluster TensorFlow's workers form (TF_CONFIG from the ranks' addresses), the devices it may see
(a CUDA rank's one GPU, memory grown on demand; none on a CPU case), its threads, the
mixed-precision policy the recipe's layers take, the distribution strategy, the seed, the wait
for the devices, the allocator's peak and TensorFlow's part of the environment a result records.
One object per rank, made before the recipe is built; ``tensorflow.TensorFlowTrainer`` holds it
and trains under its strategy.

Runs inside a worker rank; ``tensorflow`` is imported when the runtime is made.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ...core.spec import RankSpec
from .. import DeviceUnavailable, DistEnv, exchange


def tf_config(workers: list[str], rank: int) -> dict[str, Any]:
    """TF_CONFIG for MultiWorkerMirroredStrategy: every worker's address, and this one's index."""
    return {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": rank}}


_MULTI_WORKER_STARTED = False  # set once this process joined a MultiWorkerMirroredStrategy


def _own_address() -> str:
    """host:port where this rank's TensorFlow server will listen. The host is what the launcher
    says peers reach us at (loopback for local nodes), else this machine's name."""
    import socket

    from ...core.ports import free_loopback_ports

    host = os.environ.get("DLPERF_WORKER_HOST") or socket.gethostname()
    (port,) = free_loopback_ports(1, host)  # free now; TF binds it moments later
    return f"{host}:{port}"


def _use_gpu(tf: Any, local_rank: int) -> None:
    """Make this rank's GPU the only one TensorFlow uses, with memory grown on demand (TF
    otherwise maps nearly all of every visible GPU's memory at start-up, which hides the
    case's real footprint and starves anything beside it)."""
    gpus = tf.config.list_physical_devices("GPU")
    if local_rank >= len(gpus):
        build = tf.sysconfig.get_build_info()
        why = ("this TensorFlow build has no CUDA support (tensorflow-cpu?)"
               if not build.get("is_cuda_build") else
               "it found no usable GPU (its CUDA libraries missing or too old for the driver?)")
        raise DeviceUnavailable(
            f"the case runs on CUDA (NVML found GPUs) but TensorFlow {tf.__version__} sees "
            f"{len(gpus)} GPU(s) and this rank has local rank {local_rank}: {why}. Install "
            "the CUDA wheel (pip install 'tensorflow[and-cuda]'; scripts/setup does on a GPU "
            "host) or run with --dlperf-device cpu")
    try:  # only possible before TF's runtime starts (always true in a fresh worker)
        tf.config.set_visible_devices(gpus[local_rank], "GPU")
        tf.config.experimental.set_memory_growth(gpus[local_rank], True)
    except RuntimeError:
        pass


class TensorFlowRuntime:
    """A TensorFlow rank's cluster, devices, threads, precision policy, strategy, seed,
    synchronization, memory peak and environment."""

    def __init__(self, spec: RankSpec, dist: DistEnv) -> None:
        threads = self.threads = spec.threads
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.cuda = spec.device_type == "cuda"
        global _MULTI_WORKER_STARTED
        if dist.world_size > 1 and _MULTI_WORKER_STARTED:
            # TensorFlow configures its collectives once per process: a second multi-worker
            # case in the same process would hang. Only external mode (training inside pytest)
            # can get here; the other launchers start fresh ranks for every case.
            raise RuntimeError(
                "TensorFlow's MultiWorkerMirroredStrategy can be set up only once per process, "
                "and this rank already ran a multi-worker TensorFlow case; under "
                "--dlperf-launcher external select one TensorFlow case per pytest run (-k), or "
                "use the local or slurm launcher, which start new ranks for every case")
        if dist.world_size > 1:
            _MULTI_WORKER_STARTED = True
            workers = spec.workers or exchange(dist, "tf-workers", _own_address())
            if len(workers) != dist.world_size:
                raise ValueError(f"tensorflow needs one address per rank (world size "
                                 f"{dist.world_size}), got {workers!r}")
            os.environ["TF_CONFIG"] = json.dumps(tf_config(workers, dist.rank))
        if not self.cuda:
            os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
        import keras
        import tensorflow as tf

        self.tf, self.keras = tf, keras
        if self.cuda:
            _use_gpu(tf, dist.local_rank)
        try:  # only possible before TF's runtime starts (always true in a fresh worker)
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1 if threads == 1 else 2)
        except RuntimeError:
            pass
        precision = spec.precision
        # fp16 needs loss scaling (LossScaleOptimizer); bf16 keeps fp32's exponent range.
        policy = f"mixed_{precision.dtype}" if precision.enabled else "float32"
        keras.mixed_precision.set_global_policy(policy)
        if dist.world_size > 1:
            implementation = (tf.distribute.experimental.CommunicationImplementation.NCCL
                              if self.cuda else
                              tf.distribute.experimental.CommunicationImplementation.RING)
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy(
                communication_options=tf.distribute.experimental.CommunicationOptions(
                    implementation=implementation))
        else:
            self.strategy = tf.distribute.get_strategy()
        keras.utils.set_random_seed(spec.seed + dist.rank)

    def wait_for_devices(self) -> None:
        """Every local device's queued kernels done, where TensorFlow can say so: sync_devices
        refuses multi-worker contexts (the trainer then fetches the last step's all-reduced
        loss, which needs every step before it on every replica)."""
        sync = getattr(self.tf.test.experimental, "sync_devices", None)
        if sync is not None and self.strategy.num_replicas_in_sync == 1:
            sync()

    def reset_peak_memory(self) -> None:
        if self.cuda:
            self.tf.config.experimental.reset_memory_stats("GPU:0")

    def peak_memory(self) -> dict[str, int]:
        """TensorFlow's allocator peak on this rank's GPU (the only one it sees) since the
        last reset."""
        if not self.cuda:
            return {}
        info = self.tf.config.experimental.get_memory_info("GPU:0")
        return {"allocated_peak_bytes": int(info["peak"])}

    def environment(self) -> dict[str, Any]:
        """TensorFlow's and Keras's versions, threads and the replicas the strategy holds; on
        CUDA, its libraries and TF32."""
        tf = self.tf
        env: dict[str, Any] = {
            "framework": "tensorflow",
            "framework_version": tf.__version__,
            "keras": self.keras.__version__,
            "threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "replicas": self.strategy.num_replicas_in_sync,
            "data_parallel_ranks": self.strategy.num_replicas_in_sync,
        }
        if self.cuda:
            build = tf.sysconfig.get_build_info()
            env.update(cuda=build.get("cuda_version"), cudnn=build.get("cudnn_version"),
                       tf32=bool(tf.config.experimental.tensor_float_32_execution_enabled()))
        return env

    def close(self) -> None:
        pass
