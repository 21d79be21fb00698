"""Paddle's BERT trains through the adapter, eager and under ``paddle.jit.to_static``.

Paddle has no BERT of its own, so ``pytest_dlperf.models.bert.paddle`` writes one. That it is
torch's (the same parameters under the same names, the decoder tied, the same outputs from
torch's weights) is the port contract's, tests/ports.py's row, checked by tests/test_ports.py.
Paddle runs in a subprocess (importing it beside TensorFlow, as the rest of the suite does,
crashes the process), and Paddle is not imported here: the module skips when it is not
installed.
"""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest

if importlib.util.find_spec("paddle") is None:
    pytest.skip("PaddlePaddle is not installed (pip install 'pytest-dlperf[paddle]')",
                allow_module_level=True)

from snippets import run_snippet  # noqa: E402

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
