"""JAX's BERT is torch's: the same parameters under the same names, initialized as
transformers', the same outputs from torch's weights (eager and under ``jax.jit``), and the
recipe trains through ``nnx.split``/``nnx.merge`` under ``jax.jit``, its dropout drawing new
masks every step, in float32 and in bf16.

``pytest_dlperf.models.bert.jax`` writes BERT as a Flax NNX module (Flax ships none); these tests
are what makes its throughput comparable with torch's. They run under JAX's interpreter
(``scripts/setup-jax``, or ``DLPERF_TEST_JAX_PYTHON``) and skip without it.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from port_references import TINY, bert_shapes, tiny_reference
from snippets import run_snippet

STD = 0.02  # BertConfig's initializer_range


BERT_BASE_BUILT = """
import json
import numpy as np
import jax, jax.numpy as jnp
from flax import nnx
from pytest_dlperf.core.workload import BuildContext
from pytest_dlperf.models import BERT_BASE
from pytest_dlperf.models.bert.jax import named_parameters, recipe, torch_named_shapes
ctx = BuildContext(framework="jax", device_type="cpu", device="cpu",
                   batch_size=BERT_BASE.batch_for("cpu", "fp32"),
                   sizes=BERT_BASE.sizes_for("cpu", "fp32"), precision="fp32",
                   amp_dtype="float32", compiled=True, seed=0, rank=0, world_size=1,
                   local_rank=0)
parts = recipe(ctx)
model = parts.model
params = jax.tree.leaves(nnx.state(model, nnx.Param))
named = {name: np.asarray(value) for name, value in named_parameters(model).items()}
init = {name: [float(a.mean()), float(a.std()), float(np.abs(a).max()), float(a.min())]
        for name, a in named.items()}
# torch's padding_idx: the lookup sends the padding row (id 0) no gradient, id 7 one.
model.eval()
embeddings = model.bert.embeddings
ids = jnp.array([[0, 7, 0]], jnp.int32)
weights = jax.random.normal(jax.random.key(1), (1, 3, 768))  # a sum of LayerNorm's outputs is flat
grads = nnx.grad(lambda e: (e(ids, jnp.zeros_like(ids)) * weights).sum())(embeddings)
lookup = grads["word_embeddings"]["embedding"][...]
first, second = parts.targets(), parts.targets()
print(json.dumps({
    "shapes": torch_named_shapes(model), "arrays": len(params),
    "elements": sum(int(p.size) for p in params), "init": init,
    "padding_row": float(np.abs(named["bert.embeddings.word_embeddings.weight"][0]).max()),
    "lookup_grad": [float(jnp.abs(lookup[i]).max()) for i in (0, 7)],
    "inputs": [[str(a.dtype), list(a.shape)] for a in parts.inputs],
    "positions": np.asarray(parts.inputs[3]).tolist(),
    "targets": [[str(a.dtype), list(a.shape), int(a.min()), int(a.max())] for a in first],
    "fresh": any(bool((a != b).any()) for a, b in zip(first, second))}))
"""


def test_bert_base_has_torchs_parameters_by_name_initialized_as_transformers(
        jax_python: str) -> None:
    """BERT-base from the built-in CPU case's recipe, built only (a forward and backward of
    BERT-base takes ~15 s eagerly here): its parameters by name, order and shape, one array
    for the tied decoder, transformers' initialization, torch's padding_idx, and the inputs."""
    pytest.importorskip("transformers")
    from pytest_dlperf.models.bert import PARAMETERS

    out = run_snippet(jax_python, BERT_BASE_BUILT)
    assert isinstance(out, dict)
    shapes = {name: tuple(shape) for name, shape in out["shapes"].items()}
    torchs = bert_shapes()  # torch's BERT-base, built once a process: 5 s of CPU
    assert shapes == torchs
    assert list(shapes) == list(torchs)  # and in torch's order
    assert sum(math.prod(shape) for shape in shapes.values()) == PARAMETERS
    # The model holds exactly these arrays: the decoder has none of its own (tied).
    assert out["arrays"] == len(shapes) and out["elements"] == PARAMETERS
    for name, (mean, std, largest, smallest) in out["init"].items():
        if name.endswith("LayerNorm.weight"):
            assert mean == smallest == 1.0, name
        elif name.endswith("bias"):
            assert largest == 0.0, name
        else:  # N(0, 0.02), not truncated: BERT-base's smallest matrix has 1,536 values
            assert abs(mean) < 0.003 and abs(std - STD) < 0.05 * STD, (name, mean, std)
            assert largest > 3 * STD, (name, largest)
    assert out["padding_row"] == 0.0  # as transformers initializes its padding_idx row
    padding, looked_up = out["lookup_grad"]
    assert padding == 0.0 and looked_up > 0
    assert out["inputs"] == [["int32", [2, 32]]] * 3 + [["int32", [2, 5]]]
    for row in out["positions"]:  # distinct and in order, as BERT's data pipeline writes them
        assert row == sorted(set(row)) and len(row) == 5 and 0 <= row[0] and row[-1] < 32
    (mlm_dtype, mlm_shape, mlm_min, mlm_max), (nsp_dtype, nsp_shape, nsp_min, nsp_max) = \
        out["targets"]
    assert (mlm_dtype, mlm_shape, nsp_dtype, nsp_shape) == ("int32", [2, 5], "int32", [2])
    assert 0 <= mlm_min and mlm_max < 30522 and 0 <= nsp_min and nsp_max <= 1
    assert out["fresh"]  # labels drawn afresh every call


FROM_TORCH = """
import json, math
import numpy as np
import jax, jax.numpy as jnp
from flax import nnx
from pytest_dlperf.models.bert import BertShape
from pytest_dlperf.models.bert.jax import load_torch_weights, model, pretraining_loss
ref = np.load(reference)
bert = model(BertShape(**shape))
arrays = {k.removeprefix("param/"): ref[k] for k in ref.files if k.startswith("param/")}
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
load_torch_weights(bert, {**arrays,  # a state_dict names the tied tensors twice
                          "cls.predictions.decoder.weight":
                              arrays["bert.embeddings.word_embeddings.weight"],
                          "cls.predictions.decoder.bias": arrays["cls.predictions.bias"]})
bert.eval()
inputs = tuple(jnp.asarray(ref[k], jnp.int32) for k in
               ("input_ids", "token_type_ids", "attention_mask", "masked_positions"))
labels = (jnp.asarray(ref["mlm_labels"], jnp.int32), jnp.asarray(ref["nsp_labels"], jnp.int32))
graphdef, params, rest = nnx.split(bert, nnx.Param, ...)
jitted = jax.jit(lambda params, rest: nnx.merge(graphdef, params, rest, copy=True)(*inputs))
out = {"refused": refused}
for mode, (mlm, nsp) in (("eager", bert(*inputs)), ("jit", jitted(params, rest))):
    loss = pretraining_loss((mlm, nsp), labels)
    out[mode] = {
        "mlm_logits": float(np.abs(mlm - ref["mlm_logits"]).max()
                            / np.abs(ref["mlm_logits"]).max()),
        "nsp_logits": float(np.abs(nsp - ref["nsp_logits"]).max()
                            / np.abs(ref["nsp_logits"]).max()),
        "loss": float(abs(loss - ref["loss"]) / ref["loss"])}
intermediate = bert.bert.encoder.layer[0].intermediate
# Pre-activations of about N(0, 2.3): where exact and tanh GELU differ (by up to 4.7e-4).
x = jax.random.normal(jax.random.key(0), (64, shape["hidden_size"])) * 20
pre, post = np.asarray(intermediate.dense(x)), np.asarray(intermediate(x))
x64 = pre.astype(np.float64)
cdf = 0.5 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2)))
out["gelu"] = float(np.abs(post - x64 * cdf).max())
# Its derivative (the model's own: JAX's fails under shard_map), against float64's.
grad = np.asarray(jax.vmap(jax.grad(intermediate.activation))(pre.reshape(-1)))
exact = cdf + x64 * np.exp(-0.5 * x64 * x64) / math.sqrt(2 * math.pi)
out["gelu_grad"] = float(np.abs(grad - exact.reshape(-1)).max())
print(json.dumps(out))
"""


def test_torchs_weights_give_torchs_outputs(jax_python: str) -> None:
    """Eval mode (no dropout) on torch's batch, whose attention mask has zeros, eager and
    through ``nnx.split``/``nnx.merge`` under ``jax.jit``. Tolerances sit below what each
    mismatch costs, measured with TINY on JAX 0.12's CPU kernels (2026-11-26), relative to the
    largest logit: LayerNorm epsilon 1e-5 moves the masked-LM logits by 1.5e-3, an ignored mask
    by 2.1e-3, tanh-approximated GELU everywhere by 7.8e-6; a faithful model is within 3.4e-7
    (next-sentence logits 2e-7, loss 1.8e-7). The GELU kind is also checked directly, as it is
    the closest call: 3.6e-7 from float64's erf GELU, the tanh kind 4.7e-4; and its derivative,
    the model's own, 1.2e-7. The loading refuses what does not fit, and takes a
    ``state_dict``'s tied entries."""
    pytest.importorskip("transformers")
    reference = tiny_reference()
    out = run_snippet(jax_python, f"reference = {str(reference)!r}\n"
                                  f"shape = {dataclasses.asdict(TINY)!r}\n{FROM_TORCH}")
    assert isinstance(out, dict)
    missing, extra, shape, untied = out["refused"]
    assert "cls.predictions.bias" in missing and "bert.embeddings.position_ids" in extra
    assert "cls.seq_relationship.weight" in shape
    assert "cls.predictions.decoder.weight" in untied  # not the embeddings: an untied decoder
    for mode in ("eager", "jit"):
        assert out[mode]["mlm_logits"] < 3e-6 and out[mode]["nsp_logits"] < 3e-6, out
        assert out[mode]["loss"] < 1e-5, out
    assert out["gelu"] < 1e-5 and out["gelu_grad"] < 1e-5, out


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


@pytest.mark.outside_ci("73 s of the first pass (11 more in bf16), beyond JAX's CI share: JAX's "
                        "BERT gives torch's outputs from torch's weights in CI (above), and "
                        "ResNet-50's recipe trains under jit with its non-parameter state (batch "
                        "norm's statistics) handed out and back in CI (test_resnet50_jax)")
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
