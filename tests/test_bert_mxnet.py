"""MXNet's BERT is torch's: the same parameters under the same names, the same outputs from
torch's weights (eager and hybridized), and the recipe trains eager, hybridized and under AMP.

``pytest_dlperf.models.bert.mxnet`` writes BERT from Gluon blocks (GluonNLP's is not used);
these tests are what makes its throughput comparable with torch's. They run under MXNet's
interpreter (``scripts/setup-mxnet``, or ``DLPERF_TEST_MXNET_PYTHON``) and skip without it.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from port_references import TINY, bert_shapes, tiny_reference
from snippets import run_snippet

from pytest_dlperf.frameworks.mxnet import amp_unavailable

VOCAB = 30522


def test_bert_base_has_torchs_parameters_by_name_with_the_decoder_tied(
        mxnet_python: str) -> None:
    """BERT-base's parameters by name and shape, built only (its only forward and backward
    passes are on 8 tokens): the tie is checked through gradients, eager and hybridized."""
    pytest.importorskip("transformers")
    from pytest_dlperf.models.bert import PARAMETERS

    out = run_snippet(mxnet_python, """
import json
import mxnet as mx
from mxnet import autograd
from pytest_dlperf.models.bert.mxnet import bert_pretraining, torch_named_shapes
mx.random.seed(0)
model = bert_pretraining()
shapes = torch_named_shapes(model)
params = model.collect_params()
lookup = model.bert.embeddings.word_embeddings
embeddings = lookup.weight
# Tied: the padding row (id 0, not looked up here) gets a gradient only through the masked-LM
# decoder, so a non-zero one says the decoder uses it; eager, then hybridized (a symbol).
ids = mx.nd.random.randint(1, 30522, (1, 8), dtype="int32")
batch = (ids, mx.nd.zeros_like(ids), mx.nd.ones((1, 8)), mx.nd.array([[1, 5]], dtype="int32"))
decoder_grad = []
for hybridized in (False, True):
    if hybridized:
        model.hybridize(static_alloc=True, static_shape=True)
    with autograd.record(train_mode=False):
        mlm, nsp = model(*batch)
        total = mlm.sum() + nsp.sum()
    total.backward()
    decoder_grad.append(float(embeddings.grad()[0].abs().max().asscalar()))
# The lookup itself sends the padding row nothing, as torch's padding_idx (ids 0 and 7 here).
with autograd.record(train_mode=False):
    looked_up = lookup(mx.nd.array([[0, 7, 0]], dtype="int32")).sum()
looked_up.backward()
lookup_grad = embeddings.grad()
print(json.dumps({"shapes": shapes, "names": list(params),
                  "padding_row": float(embeddings.data()[0].abs().max().asscalar()),
                  "decoder_grad": decoder_grad,
                  "lookup_grad": [float(lookup_grad[i].abs().max().asscalar()) for i in (0, 7)],
                  "embeddings": sum(p is embeddings for p in params.values()),
                  "arrays": sum(p.data() is embeddings.data() for p in params.values())}))
""")
    assert isinstance(out, dict)
    shapes = {name: tuple(shape) for name, shape in out["shapes"].items()}
    assert shapes == bert_shapes()
    assert list(shapes) == list(bert_shapes())  # and in torch's order
    assert out["names"] == list(shapes)  # Gluon's own parameter names are torch's, all trained
    assert sum(math.prod(shape) for shape in shapes.values()) == PARAMETERS
    assert out["embeddings"] == 1 and out["arrays"] == 1  # the decoder holds no copy
    assert out["padding_row"] == 0.0  # as transformers initializes its padding_idx row
    assert all(grad > 0 for grad in out["decoder_grad"]), out["decoder_grad"]
    padding, looked_up = out["lookup_grad"]
    assert padding == 0.0 and looked_up > 0


def test_torchs_weights_give_torchs_outputs(mxnet_python: str) -> None:
    """Eval mode (outside ``autograd.record``: no dropout) on torch's batch, whose attention
    mask has zeros, eager and hybridized. Tolerances sit below what each mismatch costs,
    measured with TINY on MXNet 1.9.1's CPU kernels (2026-11-26): tanh-approximated GELU
    everywhere moves the masked-LM logits by 2.6e-6, LayerNorm epsilon 1e-5 by 5.2e-4, an
    ignored mask by 7.2e-4; a faithful model is within 1.0e-7 both ways (next-sentence logits
    3.7e-9, loss 1.9e-6). Tanh GELU in the encoder only moves the logits by 1.2e-7, which they
    cannot tell from rounding, so the GELU kind is also checked directly: 7.2e-7 from float64's
    erf GELU, the tanh kind 4.7e-4."""
    pytest.importorskip("transformers")
    reference = tiny_reference()
    out = run_snippet(mxnet_python, f"""
import json, math
import numpy as np
import mxnet as mx
from pytest_dlperf.models.bert import BertShape
from pytest_dlperf.models.bert.mxnet import (bert_pretraining, load_torch_weights,
                                             pretraining_loss)
ref = np.load({str(reference)!r})
model = bert_pretraining(BertShape(**{dataclasses.asdict(TINY)!r}))
load_torch_weights(model, {{k.removeprefix("param/"): ref[k] for k in ref.files
                           if k.startswith("param/")}})
ids = {{k: mx.nd.array(ref[k], dtype="int32")
       for k in ("input_ids", "token_type_ids", "masked_positions", "mlm_labels", "nsp_labels")}}
mask = mx.nd.array(ref["attention_mask"], dtype="float32")
out = {{}}
for mode in ("eager", "hybridized"):
    if mode == "hybridized":
        model.hybridize(static_alloc=True, static_shape=True)
    mlm, nsp = model(ids["input_ids"], ids["token_type_ids"], mask, ids["masked_positions"])
    loss = pretraining_loss((mlm, nsp), (ids["mlm_labels"], ids["nsp_labels"]))
    out[mode] = {{"mlm_logits": float(np.abs(mlm.asnumpy() - ref["mlm_logits"]).max()),
                 "nsp_logits": float(np.abs(nsp.asnumpy() - ref["nsp_logits"]).max()),
                 "loss": float(abs(loss.asscalar() - ref["loss"]))}}
intermediate = model.bert.encoder.layer[0].intermediate
# Pre-activations of about N(0, 2.3): where exact and tanh GELU differ (by up to 4.7e-4).
mx.random.seed(0)
x = mx.nd.random.normal(shape=(64, {TINY.hidden_size})) * 20
pre, post = intermediate.dense(x).asnumpy(), intermediate(x).asnumpy()
erf_gelu = pre * 0.5 * (1 + np.vectorize(math.erf)(pre.astype(np.float64) / math.sqrt(2)))
out["gelu"] = float(np.abs(post - erf_gelu).max())
print(json.dumps(out))
""")
    assert isinstance(out, dict)
    for mode in ("eager", "hybridized"):
        assert out[mode]["mlm_logits"] < 1e-6 and out[mode]["nsp_logits"] < 1e-6, out
        assert out[mode]["loss"] < 1e-5, out
    assert out["gelu"] < 1e-5, out


TRAIN = """
import json
import mxnet as mx
from mxnet import autograd, gluon
if precision == "amp":
    from mxnet.contrib import amp
    amp.init(target_dtype="bfloat16")  # before the model is built, as the adapter does
from pytest_dlperf.core.workload import BuildContext
from pytest_dlperf.models import BERT_BASE
from pytest_dlperf.models.bert.mxnet import recipe
mx.random.seed(0)
ctx = BuildContext(framework="mxnet", device_type="cpu", device="cpu",
                   batch_size=BERT_BASE.batch_for("cpu", precision),
                   sizes=BERT_BASE.sizes_for("cpu", precision), precision=precision,
                   amp_dtype="bfloat16" if precision == "amp" else "float32", compiled=True,
                   seed=0, rank=0, world_size=1, local_rank=0)
parts = recipe(ctx)
model = parts.model
adamw = BERT_BASE.optimizer
# Gluon's Adam (coupled decay, no clipping: the adapter's AdamW is the workload's; here the
# point is the model's loss, not the optimizer).
trainer = gluon.Trainer(model.collect_params(), "adam",
                        {"learning_rate": adamw.lr, "epsilon": adamw.eps})
def step():
    with autograd.record():
        outputs = model(*parts.inputs)
        loss = parts.loss(outputs, parts.targets())
    loss.backward()
    trainer.step(1)
    return outputs, loss
out = {"dtypes": [a.dtype.__name__ for a in parts.inputs]}
# A step of BERT-base takes ~1 s here, eager or hybridized.
for mode, steps in (("eager", 1), ("hybridized", 2)):
    if mode == "hybridized":
        model.hybridize(static_alloc=True, static_shape=True)
    out[mode] = []
    for _ in range(steps):
        outputs, loss = step()
        out[mode].append(float(loss.asscalar()))
out["logits"] = [str(o.dtype) for o in outputs]
print(json.dumps(out))
"""


@pytest.mark.parametrize("precision", ["fp32", pytest.param("amp", marks=pytest.mark.outside_ci(
    "7 s, beyond MXNet's CI share: fp32 stays"))])
def test_the_recipe_trains_eager_and_hybridized(mxnet_python: str, precision: str) -> None:
    """BERT-base from the built-in CPU case's recipe (sequence 32, 5 masked positions, batch
    2): a step eager, then two of the same model and trainer hybridized with static shapes and
    memory, fresh labels every step; in float32, and under bf16 AMP initialized first."""
    refused = precision == "amp" and amp_unavailable("cpu")
    if refused:
        pytest.skip(refused)
    out = run_snippet(mxnet_python, f"precision = {precision!r}\n{TRAIN}")
    assert isinstance(out, dict)
    assert out.pop("dtypes") == ["int32", "int32", "float32", "int32"]
    logits = out.pop("logits")
    # AMP runs the dense layers, the decoder included, in bf16 (MXNet names it by its storage).
    assert all(("bfloat16" in dtype) == (precision == "amp") for dtype in logits), logits
    uniform = math.log(VOCAB) + math.log(2)  # an untrained model's loss over both heads
    assert abs(out["eager"][0] - uniform) < 1.0, out
    for losses in out.values():
        assert all(math.isfinite(loss) for loss in losses), out
        # Later steps wander by several units on fresh labels over 10 masked tokens (torch's
        # model does the same) but do not run away.
        assert max(losses) < 2 * uniform, out
