"""JAX's BERT is torch's: its parameters by name and shape and torch's outputs from torch's
weights are the port contract's (tests/ports.py, checked in tests/test_ports.py); here, what is
this port's own: the loading refuses what does not fit, the recipe draws BERT's inputs, and the
recipe trains through ``nnx.split``/``nnx.merge`` under ``jax.jit``, its dropout drawing new
masks every step, in float32 and in bf16.

``pytest_dlperf.models.bert.jax`` writes BERT as a Flax NNX module (Flax ships none); these tests
are what makes its throughput comparable with torch's. They run under JAX's interpreter
(``scripts/setup-jax``, or ``DLPERF_TEST_JAX_PYTHON``) and skip without it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from port_references import TINY
from snippets import run_snippet

OWN = """
import json
import numpy as np
from pytest_dlperf.core.workload import BuildContext
from pytest_dlperf.models import BERT_BASE
from pytest_dlperf.models.bert import BertShape
from pytest_dlperf.models.bert.jax import load_torch_weights, model, recipe, torch_named_shapes
bert = model(BertShape(**shape))
# Arrays of torch's names and shapes: what the loading checks (their values, torch's outputs
# from torch's, are the port contract's).
rng = np.random.default_rng(0)
arrays = {name: rng.standard_normal(size).astype("float32")
          for name, size in torch_named_shapes(bert).items()}
refused = []
for broken in ({k: v for k, v in arrays.items() if k != "cls.predictions.bias"},
               {**arrays, "bert.embeddings.position_ids": np.arange(40)},
               {**arrays, "cls.seq_relationship.weight": arrays["cls.seq_relationship.weight"].T},
               {**arrays, "cls.predictions.decoder.weight":
                 arrays["bert.embeddings.word_embeddings.weight"] + 1}):
    try:
        load_torch_weights(bert, broken)
    except ValueError as exc:
        refused.append(str(exc))
ctx = BuildContext(framework="jax", device_type="cpu", device="cpu",
                   batch_size=BERT_BASE.batch_for("cpu", "fp32"),
                   sizes=BERT_BASE.sizes_for("cpu", "fp32"), precision="fp32",
                   amp_dtype="float32", compiled=True, seed=0, rank=0, world_size=1,
                   local_rank=0)
# The inputs are drawn from the vocabularies only: TINY with BERT-base's draws BERT-base's.
parts = recipe(ctx, BertShape(**{**shape, "vocab_size": 30522}))
first, second = parts.targets(), parts.targets()
print(json.dumps({
    "refused": refused,
    "inputs": [[str(a.dtype), list(a.shape)] for a in parts.inputs],
    "positions": np.asarray(parts.inputs[3]).tolist(),
    "targets": [[str(a.dtype), list(a.shape), int(a.min()), int(a.max())] for a in first],
    "fresh": any(bool((a != b).any()) for a, b in zip(first, second))}))
"""


@pytest.fixture(scope="module")
def own(jax_python: str) -> dict[str, Any]:
    """What this module checks of the port, from one JAX process: the loading's refusals of
    TINY's arrays broken four ways, and the built-in CPU case's recipe's inputs."""
    out = run_snippet(jax_python, f"shape = {dataclasses.asdict(TINY)!r}\n{OWN}")
    assert isinstance(out, dict)
    return out


def test_the_loading_refuses_what_does_not_fit(own: dict[str, Any]) -> None:
    """A missing array, an extra one, a transposed one and an untied decoder are refused,
    each naming what (the loading of a ``state_dict``'s tied entries, the decoder's the
    embeddings', is the port contract's: its outputs are torch's)."""
    missing, extra, shape, untied = own["refused"]
    assert "cls.predictions.bias" in missing and "bert.embeddings.position_ids" in extra
    assert "cls.seq_relationship.weight" in shape
    assert "cls.predictions.decoder.weight" in untied  # not the embeddings: an untied decoder


def test_the_recipe_draws_berts_inputs(own: dict[str, Any]) -> None:
    """The CPU case's batch 2 of 32 tokens, 5 masked positions each, distinct and in order;
    labels in the vocabularies, drawn afresh every call."""
    assert own["inputs"] == [["int32", [2, 32]]] * 3 + [["int32", [2, 5]]]
    for row in own["positions"]:  # distinct and in order, as BERT's data pipeline writes them
        assert row == sorted(set(row)) and len(row) == 5 and 0 <= row[0] and row[-1] < 32
    (mlm_dtype, mlm_shape, mlm_min, mlm_max), (nsp_dtype, nsp_shape, nsp_min, nsp_max) = \
        own["targets"]
    assert (mlm_dtype, mlm_shape, nsp_dtype, nsp_shape) == ("int32", [2, 5], "int32", [2])
    assert 0 <= mlm_min and mlm_max < 30522 and 0 <= nsp_min and nsp_max <= 1
    assert own["fresh"]  # labels drawn afresh every call


TRAIN = """
import json
import jax, jax.numpy as jnp, optax
from flax import nnx
from pytest_dlperf.core.workload import BuildContext
from pytest_dlperf.models import BERT_BASE
from pytest_dlperf.models.bert import BertShape
from pytest_dlperf.models.bert.jax import recipe
ctx = BuildContext(framework="jax", device_type="cpu", device="cpu",
                   batch_size=BERT_BASE.batch_for("cpu", precision),
                   sizes=BERT_BASE.sizes_for("cpu", precision), precision=precision,
                   amp_dtype="bfloat16" if precision == "amp" else "float32", compiled=True,
                   seed=0, rank=0, world_size=1, local_rank=0)
parts = recipe(ctx, BertShape(**shape))
model = parts.model
model.train()
graphdef, params, rest = nnx.split(model, nnx.Param, ...)
optimizer = optax.adamw(1e-3)
opt_state = optimizer.init(params)

def forward(graphdef, params, rest, inputs):
    # copy=True: merge otherwise reuses the state's Variables, made at jit's trace level,
    # and dropout's counters may not be written from the gradient's (TraceContextError).
    model = nnx.merge(graphdef, params, rest, copy=True)
    return model(*inputs), nnx.state(model, nnx.Not(nnx.Param))

def train(params, opt_state, rest, inputs, targets):  # on each device, as the adapter's
    def loss_fn(params, rest):
        outputs, rest = forward(graphdef, params, rest, inputs)
        return parts.loss(outputs, targets), (outputs, rest)
    (loss, (outputs, rest)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, rest,
            jax.lax.pmean(loss, "data"), outputs, grads)

# The adapter's step is a shard_map over the ranks' devices (here one), whose check of varying
# axes (check_vma) JAX's own derivatives may fail (erfc's did, in float32).
P = jax.sharding.PartitionSpec
step = jax.jit(jax.shard_map(train, mesh=jax.sharding.Mesh(jax.devices()[:1], ("data",)),
                             in_specs=(P(), P(), P(), P("data"), P("data")),
                             out_specs=(P(), P(), P(), P(), P("data"), P())))

losses = []
for _ in range(3):
    params, opt_state, rest, loss, outputs, grads = step(params, opt_state, rest,
                                                         parts.inputs, parts.targets())
    losses.append(float(loss))
# Dropout: two forwards of the same parameters, the state carried between them, in training
# mode, then in eval mode (``deterministic`` is static: a graph definition, a trace, of its own).
run = jax.jit(forward, static_argnums=0)
first, rest = run(graphdef, params, rest, parts.inputs)
second, rest = run(graphdef, params, rest, parts.inputs)
nnx.update(model, params, rest)
model.eval()
graphdef, params, rest = nnx.split(model, nnx.Param, ...)
evaluated = []
for _ in range(2):
    logits, rest = run(graphdef, params, rest, parts.inputs)
    evaluated.append(logits)
nnx.update(model, rest)
differ = lambda a, b: any(bool((x != y).any()) for x, y in zip(a, b))
word_grad = grads["bert"]["embeddings"]["word_embeddings"]["embedding"][...]
print(json.dumps({
    "losses": losses, "loss": str(loss.dtype),
    "logits": [str(o.dtype) for o in outputs],
    "params": sorted({str(p.dtype) for p in jax.tree.leaves(params)}),
    "grads": sorted({str(g.dtype) for g in jax.tree.leaves(grads)}),
    "train_masks_differ": differ(first, second), "eval_masks_differ": differ(*evaluated),
    "train_is_eval": not differ(second, evaluated[0]),
    "counters": sorted({int(c) for c in jax.tree.leaves(nnx.state(model, nnx.RngCount))}),
    "decoder_grad": float(jnp.abs(word_grad[0]).max())}))
"""


@pytest.mark.parametrize("precision", ["fp32", "amp"])
def test_the_recipe_trains_under_jit_with_dropout(jax_python: str, precision: str) -> None:
    """TINY from the recipe (the CPU case's sequence 32, 5 masked positions, batch 2): three
    AdamW steps as the adapter takes them (``jax.jit`` of a ``shard_map``, here over one device,
    over ``nnx.split``/``nnx.merge``), the model's non-parameter state (dropout's counters)
    handed out and back in; then the masks: new ones each training forward, none in eval. In
    float32, and in bf16 (parameters, gradients and loss float32)."""
    out = run_snippet(jax_python, f"precision = {precision!r}\n"
                                  f"shape = {dataclasses.asdict(TINY)!r}\n{TRAIN}")
    assert isinstance(out, dict)
    uniform = math.log(TINY.vocab_size) + math.log(2)  # an untrained model's loss, both heads
    assert all(math.isfinite(loss) for loss in out["losses"]), out
    assert abs(out["losses"][0] - uniform) < 0.5, out
    assert out["loss"] == "float32"
    compute = "bfloat16" if precision == "amp" else "float32"
    assert out["logits"] == [compute, compute], out
    assert out["params"] == ["float32"] and out["grads"] == ["float32"], out
    assert out["train_masks_differ"], "dropout drew the same masks twice: its counters not advanced"
    assert not out["eval_masks_differ"] and not out["train_is_eval"], out
    assert out["counters"] == [5], out  # 3 steps and 2 training forwards: none in eval
    # Tied: the padding row's lookups send it nothing (torch's padding_idx), so its gradient
    # comes through the masked-LM decoder alone.
    assert out["decoder_grad"] > 0, out
