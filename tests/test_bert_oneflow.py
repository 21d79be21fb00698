"""OneFlow's BERT trains through the adapter, eager and as an nn.Graph.

OneFlow has no BERT of its own, so ``pytest_dlperf.models.bert.oneflow`` writes one. That it
is torch's (the same parameters under the same names, the decoder tied, the same outputs from
torch's weights) is the port contract's, tests/ports.py's row, checked by tests/test_ports.py.
These tests run under OneFlow's interpreter (``scripts/setup-oneflow``, or
``DLPERF_TEST_ONEFLOW_PYTHON``) and skip without it.
"""

from __future__ import annotations

import math

import pytest
from snippets import run_snippet

VOCAB = 30522


TRAIN = """
import json
from pytest_dlperf.frameworks import DistEnv, load
from pytest_dlperf.models import BERT_BASE
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.core.recipes import load_recipe
losses = {}
for mode in ("eager", "compiled"):
    spec = spec_for("oneflow", BERT_BASE, protocol=QUICK, device_type="cpu", compiler=mode,
                    sizes={"seq_length": 16, "max_predictions_per_seq": 3})
    trainer = load("oneflow").build_trainer(spec, DistEnv(0, 1, 0, 1, 0),
                                            load_recipe(spec.recipe))
    losses[mode] = []
    for _ in range(2):
        trainer.step()
        losses[mode].append(trainer.loss())
print(json.dumps(losses))
"""


@pytest.mark.outside_ci("36 s of the first pass, beyond OneFlow's CI share: the conformance suite "
                        "checks OneFlow's AdamW and clip against torch's in CI, its ResNet-50 "
                        "trains as an nn.Graph on two nodes (test_oneflow), and its BERT gives "
                        "torch's outputs from torch's weights (test_ports)")
def test_the_recipe_trains_through_the_adapter_eager_and_as_a_graph(oneflow_python: str) -> None:
    """BERT-base through the real adapter (AdamW, the clip, the decay exclusions; nn.Graph
    with the loss and the optimizer inside), two steps in each mode."""
    out = run_snippet(oneflow_python, TRAIN)
    assert isinstance(out, dict) and sorted(out) == ["compiled", "eager"]
    for losses in out.values():
        assert all(math.isfinite(loss) for loss in losses)
        # An untrained model is near uniform over both heads' classes. Later steps wander by
        # several units on fresh labels over 6 masked tokens (torch's model does the same).
        assert abs(losses[0] - (math.log(VOCAB) + math.log(2))) < 1.0
