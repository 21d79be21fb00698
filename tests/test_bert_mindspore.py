"""MindSpore's BERT is torch's: the same parameters under the same names, the same outputs from
torch's weights (in PyNative and compiled in GRAPH mode), and the recipe trains in both modes.

MindSpore has no BERT that installs beside 2.10, so ``pytest_dlperf.models.bert.mindspore``
writes one; these tests are what makes its throughput comparable with torch's. They run under
MindSpore's interpreter (``scripts/setup-mindspore``, or ``DLPERF_TEST_MINDSPORE_PYTHON``) and
skip without it.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from port_references import TINY, bert_shapes, tiny_reference
from snippets import in_a_file, run_snippet

VOCAB = 30522


def test_bert_base_has_torchs_parameters_by_name_with_the_decoder_tied(
        mindspore_python: str) -> None:
    pytest.importorskip("transformers")
    from pytest_dlperf.models.bert import PARAMETERS

    out = run_snippet(mindspore_python, """
import json
import mindspore as ms
from mindspore import ops
from pytest_dlperf.models.bert.mindspore import bert_pretraining, torch_named_shapes
ms.set_seed(0)
model = bert_pretraining()
shapes = torch_named_shapes(model)
embeddings = model.bert.embeddings.word_embeddings.weight
# Tied: the padding row (id 0, not looked up here) gets a gradient only through the masked-LM
# decoder, so a non-zero one says the decoder uses it.
ids = ops.randint(1, 30522, (1, 8), dtype=ms.int64)
def heads(ids):
    mlm, nsp = model(ids, ops.zeros_like(ids), ops.ones_like(ids),
                     ms.Tensor([[1, 5]], ms.int64))
    return mlm.sum() + nsp.sum()
decoder_grad = ms.grad(heads, None, [embeddings])(ids)[0]
# The lookup itself sends the padding row nothing, as torch's padding_idx (ids 0 and 7 here).
lookup = model.bert.embeddings.word_embeddings
ids = ms.Tensor([[0, 7, 0]], ms.int64)
lookup_grad = ms.grad(lambda ids: lookup(ids).sum(), None, [embeddings])(ids)[0]
print(json.dumps({"shapes": shapes, "names": [p.name for p in model.trainable_params()],
                  "padding_row": float(embeddings[0].abs().max()),
                  "padding_row_grad": float(decoder_grad[0].abs().max()),
                  "lookup_grad": [float(lookup_grad[i].abs().max()) for i in (0, 7)],
                  "embeddings": sum(p is embeddings for p in model.trainable_params())}))
""")
    assert isinstance(out, dict)
    shapes = {name: tuple(shape) for name, shape in out["shapes"].items()}
    assert shapes == bert_shapes()
    assert list(shapes) == list(bert_shapes())  # and in torch's order
    assert out["names"] == list(shapes)  # MindSpore's own parameter names are torch's
    assert sum(math.prod(shape) for shape in shapes.values()) == PARAMETERS
    assert out["embeddings"] == 1  # the decoder holds no copy
    assert out["padding_row"] == 0.0  # as transformers initializes its padding_idx row
    assert out["padding_row_grad"] > 0
    padding, looked_up = out["lookup_grad"]
    assert padding == 0.0 and looked_up > 0


def test_torchs_weights_give_torchs_outputs(mindspore_python: str, tmp_path: Path) -> None:
    """Eval mode on torch's batch, whose attention mask has zeros, in PyNative and compiled
    whole in GRAPH mode. Tolerances sit below what each mismatch costs, measured with TINY on
    MindSpore 2.10.0's CPU kernels (2026-11-26): tanh-approximated GELU everywhere moves the
    masked-LM logits by 2.7e-6, LayerNorm epsilon 1e-5 by 5.2e-4, an ignored mask by 7.2e-4; a
    faithful model is within 8.9e-8 in both modes (next-sentence logits 7.5e-9, loss 1.4e-6).
    Tanh GELU in the encoder only moves the logits by 1.3e-7, which they cannot tell from
    rounding, so the GELU kind is also checked directly: 4.3e-7 from float64's erf GELU, the
    tanh kind 4.7e-4."""
    pytest.importorskip("transformers")
    reference = tiny_reference()
    out = run_snippet(mindspore_python, in_a_file(f"""
import json, math
import numpy as np
import mindspore as ms
from mindspore import ops
from pytest_dlperf.models.bert import BertShape
from pytest_dlperf.models.bert.mindspore import (bert_pretraining, load_torch_weights,
                                                 pretraining_loss)
ref = np.load({str(reference)!r})
model = bert_pretraining(BertShape(**{dataclasses.asdict(TINY)!r}))
model.set_train(False)
load_torch_weights(model, {{k.removeprefix("param/"): ref[k] for k in ref.files
                           if k.startswith("param/")}})
batch = [ms.Tensor(ref[k])
         for k in ("input_ids", "token_type_ids", "attention_mask", "masked_positions")]
labels = (ms.Tensor(ref["mlm_labels"]), ms.Tensor(ref["nsp_labels"]))
def forward(input_ids, token_type_ids, attention_mask, positions, mlm_labels, nsp_labels):
    mlm, nsp = model(input_ids, token_type_ids, attention_mask, positions)
    return mlm, nsp, pretraining_loss((mlm, nsp), (mlm_labels, nsp_labels))
out = {{}}
for mode, run in (("pynative", forward), ("graph", ms.jit(forward))):
    mlm, nsp, loss = run(*batch, *labels)
    out[mode] = {{"mlm_logits": float(np.abs(mlm.asnumpy() - ref["mlm_logits"]).max()),
                 "nsp_logits": float(np.abs(nsp.asnumpy() - ref["nsp_logits"]).max()),
                 "loss": float(abs(loss.asnumpy() - ref["loss"]))}}
intermediate = model.bert.encoder.layer[0].intermediate
# Pre-activations of about N(0, 2.3): where exact and tanh GELU differ (by up to 4.7e-4).
x = ops.randn(64, {TINY.hidden_size}, seed=0) * 20
pre, post = intermediate.dense(x).asnumpy(), intermediate(x).asnumpy()
erf_gelu = pre * 0.5 * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))
out["gelu"] = float(np.abs(post - erf_gelu).max())
print(json.dumps(out))
""", tmp_path))
    assert isinstance(out, dict)
    for mode in ("pynative", "graph"):
        assert out[mode]["mlm_logits"] < 1e-6 and out[mode]["nsp_logits"] < 1e-6, out
        assert out[mode]["loss"] < 1e-5, out
    assert out["gelu"] < 1e-5, out


TRAIN = """
import json
import mindspore as ms
from mindspore import nn
from pytest_dlperf.core.workload import BuildContext
from pytest_dlperf.models import BERT_BASE
from pytest_dlperf.models.bert.mindspore import recipe
ms.set_seed(0)
ctx = BuildContext(framework="mindspore", device_type="cpu", device="cpu",
                   batch_size=BERT_BASE.batch_for("cpu", "fp32"),
                   sizes=BERT_BASE.sizes_for("cpu", "fp32"), precision="fp32",
                   amp_dtype="float32", compiled=True, seed=0, rank=0, world_size=1,
                   local_rank=0)
parts = recipe(ctx)
model = parts.model
adamw = BERT_BASE.optimizer
# MindSpore's AdamWeightDecay: decoupled decay, no bias correction, no clipping (the adapter's
# AdamW is the workload's; here the point is the model's loss, not the optimizer).
opt = nn.AdamWeightDecay(model.trainable_params(), learning_rate=adamw.lr, eps=adamw.eps,
                         weight_decay=adamw.weight_decay)
def forward(input_ids, token_type_ids, attention_mask, positions, mlm, nsp):
    return parts.loss(model(input_ids, token_type_ids, attention_mask, positions), (mlm, nsp))
grad = ms.value_and_grad(forward, None, opt.parameters)
def step(*tensors):  # tensors as arguments: a tuple of new ones recompiles every call
    loss, grads = grad(*tensors)
    opt(grads)
    return loss
losses = {}
# A PyNative step of BERT-base takes ~5 s here, a compiled one ~2 s after ~9 s of compiling.
for mode, run, steps in (("pynative", step, 1), ("graph", ms.jit(step), 2)):
    losses[mode] = [float(run(*parts.inputs, *parts.targets()).asnumpy())
                    for _ in range(steps)]
print(json.dumps({**losses, "training": model.training}))
"""


def test_the_recipe_trains_in_pynative_and_in_graph_mode(mindspore_python: str,
                                                         tmp_path: Path) -> None:
    """BERT-base from the built-in CPU case's recipe (sequence 32, 5 masked positions, batch
    2): a step in PyNative, then two of the same model and optimizer compiled whole with
    ``mindspore.jit``, fresh labels every step."""
    out = run_snippet(mindspore_python, in_a_file(TRAIN, tmp_path))
    assert isinstance(out, dict)
    assert out.pop("training") is True
    uniform = math.log(VOCAB) + math.log(2)  # an untrained model's loss over both heads
    assert abs(out["pynative"][0] - uniform) < 1.0, out
    for losses in out.values():
        assert all(math.isfinite(loss) for loss in losses), out
        # Later steps wander by several units on fresh labels over 10 masked tokens (torch's
        # model does the same) but do not run away.
        assert max(losses) < 2 * uniform, out
