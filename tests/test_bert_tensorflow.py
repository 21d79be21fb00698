"""The TensorFlow adapter's BERT is torch's BertForPreTraining: same parameters under the same
names, and the same logits from the same weights (the port contract's, tests/ports.py, checked in
tests/test_ports.py); here, that the recipe trains under mixed bfloat16."""

from __future__ import annotations

import math
from typing import Any

import pytest

# torch before TensorFlow: importing torch after TensorFlow segfaults with tensorflow-cpu 2.21 +
# torch 2.14 (see test_tensorflow.py). transformers too, down to BERT's modeling module: its
# top-level import is lazy, and loading BERT's modules after TensorFlow segfaults the same way.
pytest.importorskip("torch")
pytest.importorskip("transformers.models.bert.modeling_bert")
pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install "
                                         "'pytest-dlperf[tensorflow]')")

from pytest_dlperf.core.workload import BuildContext  # noqa: E402
from pytest_dlperf.models import bert  # noqa: E402
from pytest_dlperf.models.bert import tensorflow as bert_keras  # noqa: E402

SMALL = BuildContext(
    framework="tensorflow", device_type="cpu", device="cpu", batch_size=2,
    sizes={"seq_length": 16, "max_predictions_per_seq": 3}, precision="amp",
    amp_dtype="bfloat16", compiled=False, seed=0, rank=0, world_size=1, local_rank=0)


@pytest.fixture(scope="module")
def bf16_parts() -> Any:
    """The recipe's BERT-base under mixed bfloat16, as an AMP case on CPU builds it."""
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(0)
        return bert_keras.recipe(SMALL)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_recipe_trains_in_mixed_bfloat16_with_a_float32_loss_at_chance(
        bf16_parts: Any) -> None:
    import tensorflow as tf

    # As the adapter holds them: inputs as resident variables, labels drawn per step.
    inputs = tf.nest.map_structure(lambda t: tf.Variable(t, trainable=False), bf16_parts.inputs)
    ids, _, _, positions = bf16_parts.inputs
    assert ids.shape == (2, 16) and positions.shape == (2, 3)
    assert all(len(set(row)) == 3 and list(row) == sorted(row) for row in positions.numpy())
    outputs = bf16_parts.model(inputs, training=True)
    assert [o.dtype for o in outputs] == [tf.float32, tf.float32]
    assert [tuple(o.shape) for o in outputs] == [(2, 3, bert.BERT_BASE.vocab_size), (2, 2)]
    loss = bf16_parts.loss(outputs, bf16_parts.targets())
    assert loss.dtype == tf.float32 and math.isfinite(float(loss))
    assert float(loss) == pytest.approx(math.log(bert.BERT_BASE.vocab_size) + math.log(2), abs=1.0)
