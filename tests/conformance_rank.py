"""One process of a conformance check (tests/test_conformance.py), run under a framework's own
interpreter, which has no pytest: ``python tests/conformance_rank.py '<job as JSON>'``. It does
what the job names through the adapter, as a rank would, and prints one JSON line last.

Jobs: ``average`` (one step of plain SGD on data of the rank's own), ``optimizers`` (the steps
of each optimizer a workload may name, and the adapter's dynamic loss scale), ``window`` (the
meter's window against a wall clock) and ``adamw`` (the adapter's own AdamW on given weights
and gradients). What differs by framework here is only how its weights are read and its AdamW
called; what is expected of them is said in the test's table."""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any


def weights(framework: str, trainer: Any) -> list[list[float]]:
    """Every parameter whole (gathered from the ranks where it is sharded), flattened, the
    weight before the bias."""
    import numpy as np

    if framework == "tensorflow":
        arrays = [w.numpy() for w in trainer.model.trainable_weights]
    elif framework == "jax":
        import jax
        from jax.experimental import multihost_utils

        arrays = [np.asarray(multihost_utils.process_allgather(p, tiled=True)
                             if jax.process_count() > 1 else p) for p in trainer.params]
    elif framework == "mindspore":
        arrays = [p.asnumpy() for p in trainer.params]
    elif framework == "mxnet":
        arrays = [p.data().asnumpy() for p in trainer.params]
    elif framework == "torch":
        arrays = [p.detach().numpy() for p in trainer.params]
    else:  # OneFlow, Paddle
        arrays = [p.numpy() for p in trainer.params]
    return [a.ravel().tolist() for a in sorted(arrays, key=lambda a: -a.ndim)]


def listening(port: str) -> bool:
    """Whether something listens on this loopback port (the stores bind every address)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", int(port)))
        except OSError:
            return True
        return False


def average(job: dict[str, Any]) -> dict[str, Any]:
    """One step of plain SGD on the data of rank ``rank`` of ``world``; with ``data_ranks``
    (one process, world 1), one such step from the same start on each of those ranks' data
    in turn, a trainer built afresh for each: what each rank's data alone gives, for one
    interpreter's start (a framework's import: ~6 s of one core for TensorFlow here), not one
    a rank."""
    if "data_ranks" in job:
        one = {key: value for key, value in job.items() if key != "data_ranks"}
        return {"alone": [average({**one, "rank": rank}) for rank in job["data_ranks"]]}
    from dataclasses import replace

    from pytest_dlperf import SGD, Workload
    from pytest_dlperf.core.parallel import Layout
    from pytest_dlperf.core.protocol import QUICK
    from pytest_dlperf.core.recipes import load_recipe
    from pytest_dlperf.core.spec import spec_for
    from pytest_dlperf.frameworks import DistEnv, load

    framework, rank, world = job["framework"], job["rank"], job["world"]
    workload = Workload("linear", recipes={framework: f"optimizer_recipes:{framework}_random"},
                        batch_size={"cpu": 4}, sizes={"data_rank": rank},
                        optimizer=SGD(lr_per_256=0.1 * 256 / 4, momentum=0.0))
    layout = Layout(fsdp=world, named=("fsdp",)) if job["layout"] == "fsdp" else Layout(dp=world)
    spec = spec_for(framework, workload, protocol=QUICK, device_type="cpu",
                    compiler=job["compiler"], world_size=world, layout=layout)
    # The same rate alone and together, whatever the global batch.
    spec = spec.with_(optimizer=replace(spec.optimizer, lr=0.1), workers=job.get("workers"))
    dist = DistEnv(rank, world, rank, world, 0) if world > 1 else DistEnv(0, 1, 0, 1, 0)
    trainer = load(framework).build_trainer(spec, dist, load_recipe(spec.recipe))
    ports = {name: listening(os.environ[name]) for name in job.get("ports", ())}
    shards = ([list(p.addressable_data(0).shape) for p in trainer.params]
              if framework == "jax" else None)
    before = weights(framework, trainer)
    trainer.step()
    trainer.synchronize()
    after = weights(framework, trainer)
    environment = trainer.environment()
    trainer.close()
    return {"before": before, "after": after, "environment": environment, "ports": ports,
            "shards": shards and sorted(shards)}


def optimizers(job: dict[str, Any]) -> dict[str, Any]:
    """Weights before and after the steps of each optimizer (optimizer_recipes' linear layer):
    a clipped SGD step on a huge loss, an AdamW step and two steps of SGD with momentum on a
    loss with no gradient (only decay acts)."""
    from pytest_dlperf import SGD, AdamW, Workload
    from pytest_dlperf.core.protocol import QUICK
    from pytest_dlperf.core.recipes import load_recipe
    from pytest_dlperf.core.spec import spec_for
    from pytest_dlperf.frameworks import DistEnv, load

    framework = job["framework"]
    runs = {"sgd-clip": (SGD(lr_per_256=0.5 * 256 / 4, momentum=0.0, clip_norm=0.01), "big", 1),
            "adamw-decay": (AdamW(lr=0.1, weight_decay=0.5), "zero", 1),
            "sgd-momentum-decay": (SGD(lr_per_256=0.1 * 256 / 4, momentum=0.9, weight_decay=0.5),
                                   "zero", 2)}
    found, kept = {}, []
    for name, (optimizer, loss, steps) in runs.items():
        workload = Workload("linear", recipes={framework: f"optimizer_recipes:{framework}"},
                            batch_size={"cpu": 4}, sizes={"loss": loss}, optimizer=optimizer)
        spec = spec_for(framework, workload, protocol=QUICK, device_type="cpu",
                        compiler=job["compiler"])
        trainer = load(framework).build_trainer(spec, DistEnv(0, 1, 0, 1, 0),
                                                load_recipe(spec.recipe))
        before = weights(framework, trainer)
        for _ in range(steps):
            trainer.step()
        trainer.synchronize()
        found[name] = {"before": before, "after": weights(framework, trainer)}
        # Every trainer kept alive: with the earlier ones freed, OneFlow's third nn.Graph
        # refused its own model.weight ("must be a variable created in nn.Graph:
        # TrainGraph_2") once unrelated imports had changed what was allocated where (one
        # trainer a process, as a rank has, never meets it).
        kept.append(trainer)
    found["loss-scale"] = loss_scale(framework, job["compiler"])
    return found


def loss_scale(framework: str, compiler: str) -> dict[str, Any]:
    """The dynamic loss scale the adapter builds for fp16 (CUDA's AMP; built here on CPU), read
    back through the framework's own object: its start, growth and back-off factors and growth
    interval (None where the framework fixes one and shows it nowhere); ``{"skip": why}`` where
    there is nothing to read. Read after the optimizers' steps: MXNet's ``amp.init`` patches
    operators."""
    if framework == "torch":
        import torch

        from pytest_dlperf.frameworks.torch.scaling import loss_scaler

        scaler = loss_scaler(torch, torch.device("cpu"), enabled=True, sharded=False)
        return {"initial": scaler.get_scale(), "growth": scaler.get_growth_factor(),
                "backoff": scaler.get_backoff_factor(),
                "interval": scaler.get_growth_interval()}
    if framework == "paddle":
        import paddle

        from pytest_dlperf.frameworks.paddle import loss_scaler

        scaler = loss_scaler(paddle)
        if not scaler.is_enable():
            return {"skip": "Paddle's GradScaler turns itself off on a CPU and keeps none of "
                            "its settings to read back"}
        return {"initial": scaler.get_init_loss_scaling(), "growth": scaler.get_incr_ratio(),
                "backoff": scaler.get_decr_ratio(), "interval": scaler.get_incr_every_n_steps()}
    if framework == "oneflow":
        import oneflow

        from pytest_dlperf.frameworks.oneflow.update import EagerLossScaler, graph_loss_scaler

        if compiler == "eager":  # the policy run by hand (tests/test_loss_scale: as torch's)
            return {"initial": EagerLossScaler(oneflow).scale, "growth": None, "backoff": None,
                    "interval": None}
        graph = graph_loss_scaler(oneflow)
        return {"initial": graph._init_scale, "growth": graph._growth_factor,
                "backoff": graph._backoff_factor, "interval": graph._growth_interval}
    if framework == "mindspore":
        import mindspore

        from pytest_dlperf.frameworks.mindspore import loss_scaler

        scaler = loss_scaler(mindspore)
        # (it backs off by dividing by the same factor: nothing of its own to read)
        return {"initial": float(scaler.scale_value.asnumpy()), "growth": scaler.scale_factor,
                "backoff": None, "interval": scaler.scale_window}
    if framework == "tensorflow":
        import keras

        from pytest_dlperf.frameworks.tensorflow import loss_scale_optimizer

        optimizer = loss_scale_optimizer(keras, keras.optimizers.SGD())
        return {"initial": optimizer.initial_scale, "growth": None, "backoff": None,
                "interval": optimizer.dynamic_growth_steps}
    if framework == "mxnet":
        import mxnet
        from mxnet.contrib import amp

        from pytest_dlperf.frameworks.mxnet import init_loss_scaling

        amp.init(target_dtype="bfloat16")
        net = mxnet.gluon.nn.Dense(2)
        net.initialize()
        scaler = init_loss_scaling(mxnet.gluon.Trainer(net.collect_params(), "sgd"))
        return {"initial": scaler.loss_scale, "growth": None, "backoff": None,
                "interval": scaler._scale_seq_len}
    return {"skip": f"the {framework} adapter scales no loss (its fp16 AMP is refused)"}


def window(job: dict[str, Any]) -> None:
    from snippets import WINDOW_AGAINST_A_CLOCK

    from pytest_dlperf.core.protocol import QUICK
    from pytest_dlperf.core.spec import spec_for
    from pytest_dlperf.frameworks import DistEnv
    from pytest_dlperf.models import RESNET50
    from pytest_dlperf.rank.worker import build

    spec = spec_for(job["framework"], RESNET50, protocol=QUICK, device_type="cpu",
                    compiler=job["compiler"], sizes={"image_size": 32})
    trainer = build(spec, DistEnv(0, 1, 0, 1, 0))
    for _ in range(job["warmup"]):
        trainer.step()
    exec(WINDOW_AGAINST_A_CLOCK, {"trainer": trainer, "STEPS": job["steps"]})  # prints


def adamw(job: dict[str, Any]) -> list[Any]:
    """Three steps of the adapter's AdamW (MindSpore's and MXNet's are the adapter's own)."""
    import numpy as np

    start, grads, decays = job["start"], job["grads"], job["decays"]
    lr, betas, eps = job["lr"], tuple(job["betas"]), job["eps"]
    if job["framework"] == "mxnet":
        import mxnet as mx

        from pytest_dlperf.frameworks.mxnet.adamw import adamw as mxnet_adamw

        opt = mxnet_adamw(mx)(learning_rate=lr, betas=betas, epsilon=eps, wd=1.0)
        found = [mx.nd.array(np.array(w, np.float32)) for w in start]
        states = [opt.create_state(i, w) for i, w in enumerate(found)]
        opt.set_wd_mult(dict(enumerate(decays)))
        opt.idx2name = {i: str(i) for i in range(len(found))}
        for per_step in grads:
            for i, (w, g) in enumerate(zip(found, per_step)):
                opt.update(i, w, mx.nd.array(np.array(g, np.float32)), states[i])
        return [w.asnumpy().tolist() for w in found]
    import mindspore as ms

    from pytest_dlperf.frameworks.mindspore.adamw import adamw as mindspore_adamw

    ms.set_context(mode=ms.PYNATIVE_MODE)
    params = [ms.Parameter(ms.Tensor(np.array(w, np.float32)), name=f"p{i}")
              for i, w in enumerate(start)]
    opt = mindspore_adamw(ms)(params, decays, lr, betas, eps, job["clip"])

    def whole(grads: Any) -> Any:  # a compiled training step calls the optimizer in its graph
        return opt(grads)

    step = ms.jit(whole) if job["compiler"] == "compiled" else opt
    for per_step in grads:
        step(tuple(ms.Tensor(np.array(g, np.float32)) for g in per_step))
    return [p.asnumpy().tolist() for p in params]


if __name__ == "__main__":
    JOB = json.loads(sys.argv[1])
    FOUND = {"average": average, "optimizers": optimizers, "window": window,
             "adamw": adamw}[JOB["job"]](JOB)
    if FOUND is not None:
        print(json.dumps(FOUND), flush=True)
    if JOB["framework"] == "mindspore":
        # MindSpore 2.10's teardown can crash after the work is done: a rank of two killed by
        # signal 11 after its result line and its trainer's close (CI rehearsal, 2026-12-06).
        # The plugin's launches take a rank's result file, its last act, as the rank's end
        # (launch/processes.wait_all): what the interpreter does after is not the case's.
        sys.stderr.flush()
        os._exit(0)
