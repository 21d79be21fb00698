"""The port job's GPT port (tests/port_job.py): the CPU sizes built (names, shapes), then
torch's weights (tests/port_references.py's reference) under the framework's interpreter: no
pytest, the framework imported inside its function only.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from port_ranks import approx


def gpt_jax(spec: dict[str, Any]) -> dict[str, Any]:
    """The CPU sizes built: torch's names and shapes. Then torch's weights loaded by name, the
    forward compiled with ``nnx.jit``, on two sequences of 64; errors relative to the largest
    logit (27), the loss's (the adapter's default, against torch's recipe's) to the loss.
    Measured on XLA's CPU kernels (jax 0.12, 2026-11-27): a faithful model is 7.6e-7 from
    torch's logits (its loss equal); exact GELU moves them by 2.6e-4, Flax's LayerNorm epsilon
    (1e-6) by 1.6e-5, no causal mask by 0.86. Flax's one-pass variance moves them by 8.2e-7
    only, which they cannot tell from rounding here (the activations' means are small beside
    their spread)."""
    import jax.numpy as jnp
    from flax import nnx

    from pytest_dlperf.frameworks.jax import cross_entropy
    from pytest_dlperf.models import gpt
    from pytest_dlperf.models.gpt.jax import load_torch_weights, model, torch_named_shapes

    shape = gpt.GPTShape.of(gpt.CPU_SIZES)
    out: dict[str, Any] = {"shapes": torch_named_shapes(model(shape, seed=0)), "probes": {}}
    ref = np.load(spec["reference"])
    gpt2 = model(shape, seed=1)
    load_torch_weights(gpt2, {k[len("param/"):]: ref[k] for k in ref.files
                              if k.startswith("param/")})
    logits = np.asarray(nnx.jit(lambda m, tokens: m(tokens))(
        gpt2, jnp.asarray(ref["tokens"], jnp.int32)))
    scale = float(np.abs(ref["logits"]).max())
    loss = float(cross_entropy(jnp.asarray(logits), jnp.asarray(ref["targets"], jnp.int32)))
    out["outputs"] = {"jit": {"logits": float(np.abs(logits - ref["logits"]).max()) / scale,
                              "loss": abs(loss - float(ref["loss"])) / float(ref["loss"])}}
    out["once"] = {"scale": scale}
    return out


# -- two ranks train what one process trains (tests/port_ranks.py, tests/test_ports_ranks.py) --

# JAX: tensor parallelism (``frameworks/jax/tp.py``): the GPT recipe's plan as shardings over a
# ``tp`` mesh axis and a step XLA partitions. Two steps of the CPU GPT through the real trainer,
# SGD with a clip that binds (AdamW's normalized update would hide a wrongly scaled gradient, as
# torch's layouts test notes), every parameter gathered whole on every rank after; real JAX
# processes in its distributed runtime, under JAX's own interpreter.
JAX_STEP = """
import dataclasses, json
import numpy as np
from pytest_dlperf import SGD
from pytest_dlperf.core.parallel import parse_layout
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.recipes import load_recipe
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.frameworks import DistEnv, load
from pytest_dlperf.models import gpt
workload = dataclasses.replace(gpt.WORKLOAD, optimizer=SGD(lr_per_256=64.0, momentum=0.9,
                                                           clip_norm=0.05))
spec = spec_for("jax", workload, protocol=QUICK, device_type="cpu", compiler="compiled",
                world_size=WORLD, layout=parse_layout(LAYOUT).resolve(WORLD) if LAYOUT else None)
trainer = load("jax").build_trainer(spec, DistEnv(RANK, WORLD, RANK, WORLD, 0),
                                    load_recipe(spec.recipe))
from jax.experimental import multihost_utils
def weights():
    return [np.asarray(multihost_utils.process_allgather(p, tiled=True)) for p in trainer.params]
before = weights()
losses = []
for _ in range(2):
    trainer.step()
    losses.append(trainer.loss())
after = weights()
shapes = sorted({(tuple(p.shape), tuple(p.addressable_data(0).shape)) for p in trainer.params})
env = trainer.environment()
trainer.close()
# ~3.5 MB each: through a pipe, a rank blocked on it held its peer's exit
np.savez(OUT + ".npz", *after)
np.savez(OUT + "-start.npz", *before)
print(json.dumps({"losses": losses, "shapes": shapes, "ranks": env["data_parallel_ranks"],
                  "parameters": env["parameters"]}))
"""


def jax_step(rank: int, world: int, layout: str | None, out: Any) -> str:
    return f"RANK, WORLD, LAYOUT, OUT = {rank}, {world}, {layout!r}, {str(out)!r}\n" + JAX_STEP


def jax_train(python: str | None, out: Any) -> dict[str, Any]:
    """tp2's two ranks at once, then one process."""
    import os

    from port_ranks import Run
    from snippets import REPO, free_ports, run_snippet, run_together

    assert python is not None
    ports = free_ports(2)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports[0]),
           "DLPERF_FRAMEWORK_PORT": str(ports[1])}
    ranks: list[Any] = run_together(
        python, [jax_step(rank, 2, "tp", out / f"tp2-{rank}") for rank in (0, 1)], env,
        timeout=600)
    alone: Any = run_snippet(python, jax_step(0, 1, None, out / "one"), timeout=600)

    def weights(path: Any) -> dict[str, Any]:
        with np.load(path) as saved:  # arr_0, arr_1, ...: the trainer's parameters in order
            return {name: saved[name] for name in saved.files}

    return {"tp2": Run([weights(out / f"tp2-{rank}.npz") for rank in (0, 1)],
                       weights(out / "one.npz"), weights(out / "one-start.npz"), ranks, alone)}


def jax_run(name: str, run: Any) -> None:
    """tp2 is one replica: both ranks train on the same tokens, one process's losses."""
    assert [rank["ranks"] for rank in run.ranks] == [1, 1]
    assert run.ranks[0]["parameters"] == run.whole["parameters"]
    assert run.ranks[0]["losses"] == approx(run.whole["losses"], 1e-6)



def jax_each_rank_holds_half_of_every_matrix_the_plan_names(runs: Any) -> None:
    # hidden 128, MLP 512, vocabulary 512: Q/K/V by columns, their output by rows, w1 by
    # columns, w2 by rows, the embedding by rows; the norms and positions whole.
    halves = {tuple(map(tuple, pair)) for pair in runs["tp2"].ranks[0]["shapes"]}
    assert {((128, 128), (128, 64)), ((128, 128), (64, 128)), ((128, 512), (128, 256)),
            ((512, 128), (256, 128)), ((512,), (256,)), ((128,), (64,)),
            ((128,), (128,)), ((64, 128), (64, 128))} == halves


# torch: the recipe's tensor-parallel plan (DTensor's parallelize_module over a ``tp`` mesh) on
# two gloo ranks, for each architecture, against the same model unsharded on the same tokens:
# two SGD steps, every parameter gathered whole (``full_tensor``) after. Two processes started
# together (a world of two, one thread each), not torch.multiprocessing.spawn: its spawn context
# leaves multiprocessing's resource tracker running beside the pytest process that called it,
# which a later test of that process's children finds (test_faults.py's, CI's first pass).
TORCH_ARCHS = ("gpt2", "llama")
TORCH_LR = 0.5  # SGD: a plain step moves what a wrongly scaled gradient would move wrongly


def torch_tp_rank(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks: each architecture's model sharded by its plan, and on rank 0 the
    same model unsharded, each two SGD steps on the same tokens."""
    import os
    from pathlib import Path

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from pytest_dlperf.core.parallel import Layout
    from pytest_dlperf.core.workload import BuildContext
    from pytest_dlperf.models import gpt
    from pytest_dlperf.models.gpt import torch as gpt_torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    layout = Layout(tp=2)
    for arch in TORCH_ARCHS:
        sizes = {**gpt.CPU_SIZES, "arch": arch, "num_kv_heads": 2 if arch == "llama" else 4}
        torch.manual_seed(rank)  # as the adapter seeds ranks: the weights must not follow
        parts = gpt_torch.recipe(BuildContext("torch", "cpu", "cpu", 2, sizes, "fp32", "float32",
                                              False, 0, rank, 2, rank, layout=layout))
        whole = gpt_torch.build(gpt.GPTShape.of(sizes))
        whole.load_state_dict(parts.model.state_dict())
        start = {n: p.detach().clone() for n, p in whole.named_parameters()}
        sharded = parallelize_module(parts.model, mesh["tp"], parts.plan("tp"))
        sgd = torch.optim.SGD(sharded.parameters(), lr=TORCH_LR)
        alone = torch.optim.SGD(whole.parameters(), lr=TORCH_LR)
        found: dict[str, Any] = {"losses": [], "tokens": parts.inputs.sum().item(), "want": []}
        for _ in range(2):
            targets = parts.targets().clone()
            sgd.zero_grad()
            loss = parts.loss(sharded(parts.inputs), targets)
            loss.backward()
            sgd.step()
            found["losses"].append(loss.item())
            if rank == 0:
                alone.zero_grad()
                want = parts.loss(whole(parts.inputs), targets)
                want.backward()
                alone.step()
                found["want"].append(want.item())
        params = {n: getattr(p, "full_tensor", lambda p=p: p)().detach().numpy()
                  for n, p in sharded.named_parameters()}
        if rank == 0:
            np.savez(Path(out, f"tp2-{arch}-reference.npz"),
                     **{n: p.detach().numpy() for n, p in whole.named_parameters()})
            np.savez(Path(out, f"tp2-{arch}-start.npz"), **{n: p.numpy() for n, p in start.items()})
        np.savez(Path(out, f"tp2-{arch}-{rank}.npz"), **params)
        Path(out, f"tp2-{arch}-{rank}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


def torch_train(python: str | None, out: Any) -> dict[str, Any]:
    import os
    import sys

    from port_ranks import Run
    from snippets import REPO, free_ports, run_together

    (port,) = free_ports(1)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run_together(sys.executable, [
        f"import json, sys; sys.path.insert(0, 'tests'); from port_gpt import torch_tp_rank; "
        f"torch_tp_rank({rank}, {port}, {str(out)!r}); print(json.dumps('done'))"
        for rank in (0, 1)], env)
    runs = {}
    for arch in TORCH_ARCHS:
        name = f"tp2-{arch}"
        ranks = [json.loads((out / f"{name}-{rank}.json").read_text()) for rank in (0, 1)]
        runs[name] = Run([dict(np.load(out / f"{name}-{rank}.npz")) for rank in (0, 1)],
                         dict(np.load(out / f"{name}-reference.npz")),
                         dict(np.load(out / f"{name}-start.npz")), ranks, ranks[0])
    return runs


def torch_run(name: str, run: Any) -> None:
    """tp2 is one replica: both ranks train on the same tokens, their loss one process's."""
    zero, one = run.ranks
    assert zero["tokens"] == one["tokens"]
    assert zero["losses"] == approx(one["losses"], 1e-6)
    assert zero["losses"] == approx(zero["want"], 1e-5)


def ranks_jobs() -> dict[str, Any]:
    """This model's ranks jobs by port id (tests/port_ranks.py's ``RanksJob``)."""
    from port_ranks import RanksJob

    return {"gpt-torch": RanksJob(torch_train, run_check=torch_run),
            "gpt-jax": RanksJob(jax_train, interpreter="jax_python", run_check=jax_run,
                                moved=1e-3,
                                checks=(jax_each_rank_holds_half_of_every_matrix_the_plan_names,))}
