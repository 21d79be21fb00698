"""Paddle's BERT is torch's: the same parameters under the same names, the same outputs from
torch's weights, and the recipe trains eager and under ``paddle.jit.to_static``.

Paddle has no BERT of its own, so ``pytest_dlperf.models.bert.paddle`` writes one; these tests
are what makes its throughput comparable with torch's. Paddle runs in a subprocess in each
(importing it beside TensorFlow, as the rest of the suite does, crashes the process), and
Paddle is not imported here: the module skips when it is not installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys

import pytest

if importlib.util.find_spec("paddle") is None:
    pytest.skip("PaddlePaddle is not installed (pip install 'pytest-dlperf[paddle]')",
                allow_module_level=True)

from port_references import TINY, bert_shapes, tiny_reference  # noqa: E402
from snippets import run_snippet  # noqa: E402

VOCAB = 30522


def test_bert_base_has_torchs_parameters_by_name_with_the_decoder_tied() -> None:
    pytest.importorskip("transformers")
    from pytest_dlperf.models.bert import PARAMETERS

    out = run_snippet(sys.executable, """
import json
import paddle
from pytest_dlperf.models.bert.paddle import bert_pretraining, torch_named_shapes
paddle.seed(0)
model = bert_pretraining()
shapes = torch_named_shapes(model)
# Tied: the padding row (id 0, not looked up here, and no lookup gradient anyway) gets a
# gradient only through the masked-LM decoder, so a non-zero one says the decoder uses it.
embeddings = model.bert.embeddings.word_embeddings.weight
ids = paddle.randint(1, 30522, [1, 8])
mlm, nsp = model(ids, paddle.zeros_like(ids), paddle.ones_like(ids), paddle.to_tensor([[1, 5]]))
(mlm.sum() + nsp.sum()).backward()
print(json.dumps({"shapes": shapes, "padding_row": float(embeddings[0].abs().max()),
                  "padding_row_grad": float(embeddings.grad[0].abs().max()),
                  "embeddings": sum(p is embeddings for p in model.parameters())}))
""")
    assert isinstance(out, dict)
    shapes = {name: tuple(shape) for name, shape in out["shapes"].items()}
    assert shapes == bert_shapes()  # torch's layout: Linear weights [out, in]
    assert list(shapes) == list(bert_shapes())  # and in torch's order
    assert sum(math.prod(shape) for shape in shapes.values()) == PARAMETERS
    assert out["embeddings"] == 1  # the decoder holds no copy
    assert out["padding_row"] == 0.0  # as transformers initializes its padding_idx row
    assert out["padding_row_grad"] > 0


def test_torchs_weights_give_torchs_outputs() -> None:
    """Eval mode on torch's batch, whose attention mask has zeros. Tolerances sit below what
    each mismatch costs, measured with TINY on Paddle 3.3.1's CPU kernels: tanh-approximated
    GELU everywhere moves the masked-LM logits by 2.7e-6, LayerNorm eps 1e-5 by 5.2e-4, an
    ignored mask by 7.2e-4; a faithful model is within 9e-8 (next-sentence logits 4e-9, loss
    4.8e-7). Tanh GELU in the encoder only moves them by 1.0e-7, which the logits cannot tell
    from rounding, so the GELU kind is also checked directly: 4.2e-7 from float64's erf GELU,
    the tanh kind 4.7e-4."""
    pytest.importorskip("transformers")
    reference = tiny_reference()
    out = run_snippet(sys.executable, f"""
import json, math
import numpy as np
import paddle
from pytest_dlperf.models.bert import BertShape
from pytest_dlperf.models.bert.paddle import bert_pretraining, load_torch_weights
from pytest_dlperf.models.bert.paddle import pretraining_loss
ref = np.load({str(reference)!r})
model = bert_pretraining(BertShape(**{dataclasses.asdict(TINY)!r}))
model.eval()
load_torch_weights(model, {{k.removeprefix("param/"): ref[k] for k in ref.files
                            if k.startswith("param/")}})
batch = [paddle.to_tensor(ref[k])
         for k in ("input_ids", "token_type_ids", "attention_mask", "masked_positions")]
intermediate = model.bert.encoder.layer[0].intermediate
# Pre-activations of about N(0, 2.3): where exact and tanh GELU differ (by up to 4.7e-4).
paddle.seed(0)
x = paddle.randn([64, {TINY.hidden_size}]) * 20
with paddle.no_grad():
    mlm, nsp = model(*batch)
    loss = pretraining_loss((mlm, nsp), (paddle.to_tensor(ref["mlm_labels"]),
                                         paddle.to_tensor(ref["nsp_labels"])))
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


TRAIN = """
import json
from pytest_dlperf.frameworks import DistEnv, load
from pytest_dlperf.models import BERT_BASE
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.core.recipes import load_recipe
losses = {}
for mode in ("eager", "compiled"):
    spec = spec_for("paddle", BERT_BASE, protocol=QUICK, device_type="cpu", compiler=mode,
                    sizes={"seq_length": 16, "max_predictions_per_seq": 3})
    trainer = load("paddle").build_trainer(spec, DistEnv(0, 1, 0, 1, 0),
                                           load_recipe(spec.recipe))
    losses[mode] = []
    for _ in range(2):
        trainer.step()
        losses[mode].append(trainer.loss())
    if mode == "compiled":  # to_static built one static program and ran it
        losses["programs"] = len(trainer.model.forward.program_cache)
print(json.dumps(losses))
"""


def test_the_recipe_trains_through_the_adapter_eager_and_under_to_static() -> None:
    """BERT-base through the real adapter (AdamW with the global-norm clip and the decay
    exclusions), two steps eager and two with ``to_static(full_graph=True)``: the model's
    forward traced whole, no fallback to eager."""
    out = run_snippet(sys.executable, TRAIN)
    assert isinstance(out, dict) and sorted(out) == ["compiled", "eager", "programs"]
    assert out.pop("programs") == 1  # no fallback to eager (full_graph=True)
    for losses in out.values():
        assert all(math.isfinite(loss) for loss in losses)
        # An untrained model is near uniform over both heads' classes. Later steps wander by
        # several units on fresh labels over 6 masked tokens (torch's model does the same).
        assert abs(losses[0] - (math.log(VOCAB) + math.log(2))) < 1.0
    # The same seed, so the same weights, batch and dropout masks (the static program draws
    # from Paddle's generator too): the graph computes the eager model's loss.
    assert out["compiled"][0] == pytest.approx(out["eager"][0], rel=1e-5)
