"""The TensorFlow adapter's BERT is torch's BertForPreTraining: same parameters under the same
names, and the same logits from the same weights."""

from __future__ import annotations

import math
from typing import Any

import pytest

# torch before TensorFlow: importing torch after TensorFlow segfaults with tensorflow-cpu 2.21 +
# torch 2.14 (see test_tensorflow.py). transformers too, down to BERT's modeling module: its
# top-level import is lazy, and loading BERT's modules after TensorFlow segfaults the same way.
torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.bert.modeling_bert")
pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install "
                                         "'pytest-dlperf[tensorflow]')")

from port_references import TINY, bert_shapes, tiny_reference  # noqa: E402

from pytest_dlperf.core.workload import BuildContext  # noqa: E402
from pytest_dlperf.models import bert  # noqa: E402
from pytest_dlperf.models.bert import tensorflow as bert_keras  # noqa: E402

SMALL = BuildContext(
    framework="tensorflow", device_type="cpu", device="cpu", batch_size=2,
    sizes={"seq_length": 16, "max_predictions_per_seq": 3}, precision="amp",
    amp_dtype="bfloat16", compiled=False, seed=0, rank=0, world_size=1, local_rank=0)


@pytest.fixture(scope="module")
def bf16_parts() -> Any:
    """The recipe's BERT-base, built once, under mixed bfloat16 as an AMP case on CPU builds it
    (its variables are float32 whatever the policy, so the count and names tests use it too)."""
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(0)
        return bert_keras.recipe(SMALL)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_same_trainable_parameter_count_as_torch_the_tied_decoder_once(bf16_parts: Any) -> None:
    import numpy as np

    model = bf16_parts.model
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    torchs = sum(math.prod(shape) for shape in bert_shapes().values())  # tied: once
    assert trainable == torchs == bert.PARAMETERS
    word_embeddings = model.get_layer("bert.embeddings.word_embeddings").embeddings
    assert sum(w is word_embeddings for w in model.trainable_weights) == 1


def test_every_parameter_has_torchs_name_and_shape(bf16_parts: Any) -> None:
    torch_shapes = bert_shapes()
    keras_shapes = bert_keras.torch_named_shapes(bf16_parts.model)
    differ = {n: (keras_shapes.get(n), torch_shapes.get(n))
              for n in sorted(set(keras_shapes) | set(torch_shapes))
              if keras_shapes.get(n) != torch_shapes.get(n)}
    assert not differ, "name: (keras, torch) shapes differ:\n" + "\n".join(
        f"  {n}: {k} vs {t}" for n, (k, t) in differ.items())


def test_torchs_weights_give_torchs_logits_and_loss() -> None:
    import numpy as np

    ref = np.load(tiny_reference())
    assert 0 in ref["attention_mask"]  # the mask must matter
    model = bert_keras.bert_pretraining(TINY)
    params = {k.removeprefix("param/"): ref[k] for k in ref.files if k.startswith("param/")}
    bert_keras.load_torch_weights(model, params)
    inputs = tuple(ref[k].astype("int32") for k in
                   ("input_ids", "token_type_ids", "attention_mask", "masked_positions"))
    mlm, nsp = model(inputs, training=False)
    # fp32 on both sides: 1.2e-7 apart here. Tight on purpose: at TINY's N(0, 0.02) weights the
    # tanh GELU moves the logits by 2.7e-6 only, a wrong LayerNorm eps (1e-5) by 5e-4, an
    # ignored attention mask by 7e-4.
    np.testing.assert_allclose(mlm.numpy(), ref["mlm_logits"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(nsp.numpy(), ref["nsp_logits"], rtol=1e-6, atol=1e-6)
    loss = bert_keras.pretraining_loss(
        (mlm, nsp), (ref["mlm_labels"].astype("int32"), ref["nsp_labels"].astype("int32")))
    np.testing.assert_allclose(float(loss), float(ref["loss"]), rtol=1e-6, atol=1e-6)


def test_gelu_is_the_exact_erf_form_as_torchs() -> None:
    import numpy as np

    # Where the two GELUs differ most (|x| ~ 2: 5e-4), which small activations never reach.
    x = np.linspace(-6, 6, 1001, dtype="float32")
    expected = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    model = bert_keras.bert_pretraining(TINY)
    for name in ("bert.encoder.layer.1.intermediate.dense", "cls.predictions.transform.dense"):
        activation = model.get_layer(name).activation
        np.testing.assert_allclose(np.asarray(activation(x)), expected, atol=2e-6, err_msg=name)


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
