"""OneFlow's BERT is torch's: the same parameters under the same names, the same outputs from
torch's weights, and the recipe trains eager and as an nn.Graph.

OneFlow has no BERT of its own, so ``pytest_dlperf.models.bert_oneflow`` writes one; these tests
are what makes its throughput comparable with torch's. They run under OneFlow's interpreter
(``scripts/setup-oneflow``, or ``DLPERF_TEST_ONEFLOW_PYTHON``) and skip without it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest

from bert_reference import TINY, write_reference
from snippets import oneflow_interpreter, run_snippet

VOCAB = 30522


@pytest.fixture(scope="module")
def oneflow_python() -> str:
    path = oneflow_interpreter()
    if not os.access(path, os.X_OK):
        pytest.skip(f"no OneFlow interpreter at {path}: run scripts/setup-oneflow")
    return str(path)


def test_bert_base_has_torchs_parameters_by_name_with_the_decoder_tied(
        oneflow_python: str) -> None:
    pytest.importorskip("transformers")
    from pytest_dlperf.models.bert import PARAMETERS, torch_named_shapes

    out = run_snippet(oneflow_python, """
import json
import oneflow as flow
from pytest_dlperf.models.bert_oneflow import bert_pretraining
model = bert_pretraining()
shapes = {n: list(p.shape) for n, p in model.named_parameters()}
# Tied: the padding row (id 0, not looked up here, and no lookup gradient anyway) gets a
# gradient only through the masked-LM decoder, so a non-zero one says the decoder uses it.
embeddings = model.bert.embeddings.word_embeddings.weight
ids = flow.randint(1, 30522, (1, 8))
mlm, nsp = model(ids, flow.zeros_like(ids), flow.ones_like(ids), flow.tensor([[1, 5]]))
(mlm.sum() + nsp.sum()).backward()
print(json.dumps({"shapes": shapes, "padding_row": float(embeddings[0].abs().max()),
                  "padding_row_grad": float(embeddings.grad[0].abs().max())}))
""")
    assert isinstance(out, dict)
    shapes = {name: tuple(shape) for name, shape in out["shapes"].items()}
    assert shapes == torch_named_shapes()
    assert list(shapes) == list(torch_named_shapes())  # and in torch's order
    assert sum(math.prod(shape) for shape in shapes.values()) == PARAMETERS
    assert out["padding_row"] == 0.0  # as transformers initializes its padding_idx row
    assert out["padding_row_grad"] > 0


def test_torchs_weights_give_torchs_outputs(oneflow_python: str, tmp_path: Path) -> None:
    """Eval mode on torch's batch, whose attention mask has zeros. Tolerances sit below what
    each mismatch costs, measured with TINY: tanh-approximated GELU moves the masked-LM logits
    by 2.6e-6, LayerNorm eps 1e-5 by 5e-4, an ignored mask by 7e-4; a faithful model is within
    1.2e-7 here. The GELU kind is also checked directly, where the two kinds differ by 4.7e-4."""
    pytest.importorskip("transformers")
    reference = write_reference(tmp_path / "ref.npz")
    out = run_snippet(oneflow_python, f"""
import json, math
import numpy as np
import oneflow as flow
from pytest_dlperf.models.bert import BertShape
from pytest_dlperf.models.bert_oneflow import bert_pretraining, pretraining_loss
ref = np.load({str(reference)!r})
model = bert_pretraining(BertShape(**{dataclasses.asdict(TINY)!r})).eval()
model.load_state_dict({{n: flow.tensor(ref["param/" + n]) for n, _ in model.named_parameters()}})
batch = [flow.tensor(ref[k])
         for k in ("input_ids", "token_type_ids", "attention_mask", "masked_positions")]
intermediate = model.bert.encoder.layer[0].intermediate
# Pre-activations of about N(0, 2.3): where exact and tanh GELU differ (by up to 4.7e-4).
x = flow.randn(64, intermediate.dense.in_features) * 20
with flow.no_grad():
    mlm, nsp = model(*batch)
    loss = pretraining_loss((mlm, nsp), (flow.tensor(ref["mlm_labels"]),
                                         flow.tensor(ref["nsp_labels"])))
    pre, post = intermediate.dense(x).numpy(), intermediate(x).numpy()
erf_gelu = pre * 0.5 * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))
print(json.dumps({{"mlm_logits": float(np.abs(mlm.numpy() - ref["mlm_logits"]).max()),
                  "nsp_logits": float(np.abs(nsp.numpy() - ref["nsp_logits"]).max()),
                  "loss": float(abs(loss.numpy() - ref["loss"])),
                  "gelu": float(np.abs(post - erf_gelu).max())}}))
""")
    assert isinstance(out, dict)
    assert out["mlm_logits"] < 1e-6 and out["nsp_logits"] < 1e-6, out
    assert out["loss"] < 1e-5, out
    assert out["gelu"] < 1e-5, out


RECIPE = """
import json, math
import oneflow as flow
from pytest_dlperf.models.bert_oneflow import recipe
from pytest_dlperf.workload import BuildContext
flow.manual_seed(0)
ctx = BuildContext("oneflow", "cpu", "cpu", 2, {"seq_length": 16, "max_predictions_per_seq": 3},
                   "fp32", "float32", COMPILED, 0, 0, 1, 0)
parts = recipe(ctx)
model = parts.model.train()
"""


def test_the_recipe_trains_eager(oneflow_python: str) -> None:
    out = run_snippet(oneflow_python, RECIPE.replace("COMPILED", "False") + """
opt = flow.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01)
losses = []
for _ in range(2):
    opt.zero_grad()
    loss = parts.loss(model(*parts.inputs), parts.targets())
    loss.backward()
    flow.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses.append(float(loss.numpy()))
print(json.dumps(losses))
""")
    assert isinstance(out, list)
    assert all(math.isfinite(loss) for loss in out)
    # An untrained model is near uniform over both heads' classes. Later steps wander by
    # several units on fresh labels over 6 masked tokens (torch's model does the same).
    assert abs(out[0] - (math.log(VOCAB) + math.log(2))) < 1.0


def test_the_recipe_trains_as_a_data_parallel_graph(oneflow_python: str) -> None:
    """As the adapter's compiled mode: global tensors, parameters broadcast and the batch split
    on dim 0 (here over one rank), the loss and the optimizer inside the graph."""
    out = run_snippet(oneflow_python, RECIPE.replace("COMPILED", "True") + """
placement = flow.placement("cpu", ranks=[0])
model = model.to_global(placement=placement, sbp=flow.sbp.broadcast)
opt = flow.optim.AdamW([{"params": model.parameters(), "clip_grad_max_norm": 1.0,
                         "clip_grad_norm_type": 2.0}], lr=1e-4, eps=1e-6, weight_decay=0.01)


def split(tensors):
    return tuple(t.to_global(placement=placement, sbp=flow.sbp.split(0)) for t in tensors)


class TrainGraph(flow.nn.Graph):
    def __init__(self):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, inputs, targets):
        loss = parts.loss(self.model(*inputs), targets)
        loss.backward()
        return loss


loss = TrainGraph()(split(parts.inputs), split(parts.targets()))
print(json.dumps(float(loss.to_local().numpy())))
""")
    assert isinstance(out, float)
    assert abs(out - (math.log(VOCAB) + math.log(2))) < 1.0
