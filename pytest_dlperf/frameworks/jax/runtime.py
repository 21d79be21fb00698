"""What a JAX rank runs on, apart from what it trains (``JaxRuntime``): XLA's thread budget, the
job's distributed runtime (rank 0's process hosting the coordinator; on CPU, gloo's collectives
announcing this node's address), the device checked, the ranks' devices as a mesh, the wait for
what a step returned, and JAX's part of the environment a result records. One object per rank,
made before the recipe is built; ``jax.JaxTrainer`` holds it and trains on it.

Runs inside a worker rank, under JAX's own interpreter.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

from ...core.spec import RankSpec
from .. import DeviceUnavailable, DistEnv, _roles
from . import shardmap
from .tp import TP


def prepare_environ(environ: MutableMapping[str, str], threads: int) -> None:
    """What XLA reads at start: one rank's thread budget (XLA's CPU thread pool takes every
    core, whatever OMP_NUM_THREADS says: with two ranks on two cores, four threads)."""
    if threads == 1:
        flags = environ.get("XLA_FLAGS", "")
        environ["XLA_FLAGS"] = " ".join(filter(None, [
            flags, "--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1"]))


def gloo_at(address: str) -> None:
    """JAX's CPU client with gloo's collectives announcing ``address`` (this node's, as the
    first node sees it): gloo announces its hostname's address otherwise, 127.0.0.1 inside a
    node's network namespace, and the other nodes' connections to it were refused. JAX offers
    no setting for it; its CPU backend factory is registered again, as JAX registers it, with
    the collectives made at the address (``make_gloo_tcp_collectives(hostname=...)``). Before
    the first backend is made."""
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    def make() -> Any:
        return xla_bridge.make_cpu_client(collectives=_jax.make_gloo_tcp_collectives(
            distributed_client=distributed.global_state.client, hostname=address))

    xla_bridge.register_backend_factory("cpu", make, priority=0, fail_quietly=False)


class JaxRuntime:
    """A JAX rank's threads, distributed runtime, device, mesh, waits and environment."""

    def __init__(self, spec: RankSpec, dist: DistEnv) -> None:
        """JAX imported with this rank's thread budget, in the job's distributed runtime when
        there are several ranks (rank 0's process hosting the coordinator)."""
        self.cuda = spec.device_type == "cuda"
        self.threads = spec.threads
        prepare_environ(os.environ, self.threads)
        import jax

        if dist.world_size > 1:
            port = _roles.spare_port(os.environ, "JAX's coordinator")
            host = _roles.ipv4(os.environ.get("MASTER_ADDR", "127.0.0.1"), "JAX's coordinator")
            if not self.cuda:
                gloo_at(_roles.own_address(host, int(port)))
            jax.distributed.initialize(
                coordinator_address=f"{host}:{port}", num_processes=dist.world_size,
                process_id=dist.rank,
                local_device_ids=[dist.local_rank] if self.cuda else None)
        if self.cuda and not any(d.platform == "gpu" for d in jax.local_devices()):
            raise DeviceUnavailable(
                f"the case runs on CUDA (NVML found GPUs) but JAX {jax.__version__} has no "
                "GPU here (the jax wheel is CPU only): install jax[cuda12] in its "
                "interpreter, or run with --dlperf-device cpu")
        self.jax = jax

    def mesh(self, tp: int) -> Any:
        """The ranks' devices on one axis, ``data``; under tensor parallelism (``tp`` ranks a
        replica) two, ``data`` x ``tp``, the ranks of one replica side by side
        (``core.parallel``'s order)."""
        from jax.sharding import Mesh

        devices = sorted(self.jax.devices(), key=lambda d: (d.process_index, d.id))
        if not tp:
            return Mesh(devices, (shardmap.AXIS,))
        import numpy as np

        grid = np.array(devices, dtype=object).reshape(len(devices) // tp, tp)
        return Mesh(grid, (shardmap.AXIS, TP))

    def wait(self, values: Any) -> None:
        """Blocks until ``values`` (what a step returned) exist."""
        self.jax.block_until_ready(values)

    def environment(self) -> dict[str, Any]:
        """JAX's version, threads and devices; on CUDA, the device's kind."""
        jax = self.jax
        device = jax.local_devices()[0]
        env: dict[str, Any] = {
            "framework": "jax",
            "framework_version": jax.__version__,
            "threads": self.threads,
            "devices": jax.device_count(),
        }
        if self.cuda:
            env["device_name"] = getattr(device, "device_kind", str(device))
        return env
