"""The port job's BERT ports (tests/port_job.py): BERT-base built only (its parameters by torch's
names and shapes, the tied decoder, the padding row), then TINY from torch's weights
(tests/port_references.py), each under its framework's interpreter: Python 3.10 syntax
(OneFlow's), no pytest, the framework imported inside its function only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def bert_mxnet(spec: dict[str, Any]) -> dict[str, Any]:
    """BERT-base's parameters by name and shape, built only (its only forward and backward
    passes are on 8 tokens): the tie is checked through gradients, eager and hybridized.

    Then TINY from torch's weights, in eval mode (outside ``autograd.record``: no dropout) on
    torch's batch, whose attention mask has zeros, eager and hybridized. Tolerances sit below what each mismatch costs,
    measured with TINY on MXNet 1.9.1's CPU kernels (2026-11-26): tanh-approximated GELU
    everywhere moves the masked-LM logits by 2.6e-6, LayerNorm epsilon 1e-5 by 5.2e-4, an
    ignored mask by 7.2e-4; a faithful model is within 1.0e-7 both ways (next-sentence logits
    3.7e-9, loss 1.9e-6). Tanh GELU in the encoder only moves the logits by 1.2e-7, which they
    cannot tell from rounding, so the GELU kind is also checked directly: 7.2e-7 from float64's
    erf GELU, the tanh kind 4.7e-4."""
    import mxnet as mx
    from mxnet import autograd

    from pytest_dlperf.models.bert import BertShape
    from pytest_dlperf.models.bert.mxnet import (
        bert_pretraining,
        load_torch_weights,
        pretraining_loss,
        torch_named_shapes,
    )

    mx.random.seed(0)
    model = bert_pretraining()
    shapes = torch_named_shapes(model)
    params = model.collect_params()
    lookup = model.bert.embeddings.word_embeddings
    embeddings = lookup.weight
    # Tied: the padding row (id 0, not looked up here) gets a gradient only through the
    # masked-LM decoder, so a non-zero one says the decoder uses it; eager, then hybridized.
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
    # The lookup itself sends the padding row nothing, as torch's padding_idx (ids 0 and 7).
    with autograd.record(train_mode=False):
        looked_up = lookup(mx.nd.array([[0, 7, 0]], dtype="int32")).sum()
    looked_up.backward()
    lookup_grad = embeddings.grad()
    out: dict[str, Any] = {"shapes": shapes, "probes": {
        "names": list(params), "padding_row": float(embeddings.data()[0].abs().max().asscalar()),
        "decoder_grad": decoder_grad,
        "lookup_grad": [float(lookup_grad[i].abs().max().asscalar()) for i in (0, 7)],
        "embeddings": sum(p is embeddings for p in params.values()),
        "arrays": sum(p.data() is embeddings.data() for p in params.values())}}

    ref = np.load(spec["reference"])
    model = bert_pretraining(BertShape(**spec["shape"]))
    load_torch_weights(model, {k.removeprefix("param/"): ref[k] for k in ref.files
                               if k.startswith("param/")})
    ids = {k: mx.nd.array(ref[k], dtype="int32")
           for k in ("input_ids", "token_type_ids", "masked_positions", "mlm_labels",
                     "nsp_labels")}
    mask = mx.nd.array(ref["attention_mask"], dtype="float32")
    outputs: dict[str, Any] = {}
    for mode in ("eager", "hybridized"):
        if mode == "hybridized":
            model.hybridize(static_alloc=True, static_shape=True)
        mlm, nsp = model(ids["input_ids"], ids["token_type_ids"], mask, ids["masked_positions"])
        loss = pretraining_loss((mlm, nsp), (ids["mlm_labels"], ids["nsp_labels"]))
        outputs[mode] = {"mlm_logits": float(np.abs(mlm.asnumpy() - ref["mlm_logits"]).max()),
                         "nsp_logits": float(np.abs(nsp.asnumpy() - ref["nsp_logits"]).max()),
                         "loss": float(abs(loss.asscalar() - ref["loss"]))}
    intermediate = model.bert.encoder.layer[0].intermediate
    # Pre-activations of about N(0, 2.3): where exact and tanh GELU differ (by up to 4.7e-4).
    mx.random.seed(0)
    x = mx.nd.random.normal(shape=(64, spec["shape"]["hidden_size"])) * 20
    pre, post = intermediate.dense(x).asnumpy(), intermediate(x).asnumpy()
    erf_gelu = pre * 0.5 * (1 + np.vectorize(math.erf)(pre.astype(np.float64) / math.sqrt(2)))
    out["outputs"] = outputs
    out["once"] = {"gelu": float(np.abs(post - erf_gelu).max())}
    return out


def bert_mindspore(spec: dict[str, Any]) -> dict[str, Any]:
    """BERT-base built only, the tie checked through a gradient. Then TINY from torch's
    weights: Eval mode on torch's batch, whose attention mask has zeros, in PyNative and compiled
    whole in GRAPH mode. Tolerances sit below what each mismatch costs, measured with TINY on
    MindSpore 2.10.0's CPU kernels (2026-11-26): tanh-approximated GELU everywhere moves the
    masked-LM logits by 2.7e-6, LayerNorm epsilon 1e-5 by 5.2e-4, an ignored mask by 7.2e-4; a
    faithful model is within 8.9e-8 in both modes (next-sentence logits 7.5e-9, loss 1.4e-6).
    Tanh GELU in the encoder only moves the logits by 1.3e-7, which they cannot tell from
    rounding, so the GELU kind is also checked directly: 4.3e-7 from float64's erf GELU, the
    tanh kind 4.7e-4."""
    import mindspore as ms
    from mindspore import ops

    from pytest_dlperf.models.bert import BertShape
    from pytest_dlperf.models.bert.mindspore import (
        bert_pretraining,
        load_torch_weights,
        pretraining_loss,
        torch_named_shapes,
    )

    ms.set_seed(0)
    model = bert_pretraining()
    shapes = torch_named_shapes(model)
    embeddings = model.bert.embeddings.word_embeddings.weight
    # Tied: the padding row (id 0, not looked up here) gets a gradient only through the
    # masked-LM decoder, so a non-zero one says the decoder uses it.
    ids = ops.randint(1, 30522, (1, 8), dtype=ms.int64)

    def heads(ids: Any) -> Any:
        mlm, nsp = model(ids, ops.zeros_like(ids), ops.ones_like(ids),
                         ms.Tensor([[1, 5]], ms.int64))
        return mlm.sum() + nsp.sum()

    decoder_grad = ms.grad(heads, None, [embeddings])(ids)[0]
    # The lookup itself sends the padding row nothing, as torch's padding_idx (ids 0 and 7).
    lookup = model.bert.embeddings.word_embeddings
    ids = ms.Tensor([[0, 7, 0]], ms.int64)
    lookup_grad = ms.grad(lambda ids: lookup(ids).sum(), None, [embeddings])(ids)[0]
    out: dict[str, Any] = {"shapes": shapes, "probes": {
        "names": [p.name for p in model.trainable_params()],
        "padding_row": float(embeddings[0].abs().max()),
        "decoder_grad": [float(decoder_grad[0].abs().max())],
        "lookup_grad": [float(lookup_grad[i].abs().max()) for i in (0, 7)],
        "embeddings": sum(p is embeddings for p in model.trainable_params())}}

    ref = np.load(spec["reference"])
    model = bert_pretraining(BertShape(**spec["shape"]))
    model.set_train(False)
    load_torch_weights(model, {k.removeprefix("param/"): ref[k] for k in ref.files
                               if k.startswith("param/")})
    batch = [ms.Tensor(ref[k])
             for k in ("input_ids", "token_type_ids", "attention_mask", "masked_positions")]
    labels = (ms.Tensor(ref["mlm_labels"]), ms.Tensor(ref["nsp_labels"]))

    def forward(input_ids: Any, token_type_ids: Any, attention_mask: Any, positions: Any,
                mlm_labels: Any, nsp_labels: Any) -> Any:
        mlm, nsp = model(input_ids, token_type_ids, attention_mask, positions)
        return mlm, nsp, pretraining_loss((mlm, nsp), (mlm_labels, nsp_labels))

    outputs = {}
    for mode, run in (("pynative", forward), ("graph", ms.jit(forward))):
        mlm, nsp, loss = run(*batch, *labels)
        outputs[mode] = {"mlm_logits": float(np.abs(mlm.asnumpy() - ref["mlm_logits"]).max()),
                         "nsp_logits": float(np.abs(nsp.asnumpy() - ref["nsp_logits"]).max()),
                         "loss": float(abs(loss.asnumpy() - ref["loss"]))}
    intermediate = model.bert.encoder.layer[0].intermediate
    # Pre-activations of about N(0, 2.3): where exact and tanh GELU differ (by up to 4.7e-4).
    x = ops.randn(64, spec["shape"]["hidden_size"], seed=0) * 20
    pre, post = intermediate.dense(x).asnumpy(), intermediate(x).asnumpy()
    erf_gelu = pre * 0.5 * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))
    out["outputs"] = outputs
    out["once"] = {"gelu": float(np.abs(post - erf_gelu).max())}
    return out


def bert_oneflow(spec: dict[str, Any]) -> dict[str, Any]:
    """BERT-base built only, the tie checked through a gradient: the padding row (id 0, not
    looked up here, and no lookup gradient anyway) gets one only through the masked-LM
    decoder. Then TINY from torch's weights, in eval mode on torch's batch, whose attention
    mask has zeros. Tolerances sit below what each mismatch costs, measured with TINY:
    tanh-approximated GELU moves the masked-LM logits by 2.6e-6, LayerNorm eps 1e-5 by 5e-4,
    an ignored mask by 7e-4; a faithful model is within 1.2e-7 here. The GELU kind is also
    checked directly, where the two kinds differ by 4.7e-4."""
    import oneflow as flow

    from pytest_dlperf.models.bert import BertShape
    from pytest_dlperf.models.bert.oneflow import bert_pretraining, pretraining_loss

    model = bert_pretraining()
    shapes = {n: list(p.shape) for n, p in model.named_parameters()}
    embeddings = model.bert.embeddings.word_embeddings.weight
    ids = flow.randint(1, 30522, (1, 8))
    mlm, nsp = model(ids, flow.zeros_like(ids), flow.ones_like(ids), flow.tensor([[1, 5]]))
    (mlm.sum() + nsp.sum()).backward()
    out: dict[str, Any] = {"shapes": shapes, "probes": {
        "padding_row": float(embeddings[0].abs().max()),
        "decoder_grad": [float(embeddings.grad[0].abs().max())]}}
    del model, embeddings, mlm, nsp

    ref = np.load(spec["reference"])
    model = bert_pretraining(BertShape(**spec["shape"])).eval()
    model.load_state_dict({n: flow.tensor(ref["param/" + n]) for n, _ in model.named_parameters()})
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
    out["outputs"] = {"eager": {"mlm_logits": float(np.abs(mlm.numpy() - ref["mlm_logits"]).max()),
                                "nsp_logits": float(np.abs(nsp.numpy() - ref["nsp_logits"]).max()),
                                "loss": float(abs(loss.numpy() - ref["loss"]))}}
    out["once"] = {"gelu": float(np.abs(post - erf_gelu).max())}
    return out


def bert_paddle(spec: dict[str, Any]) -> dict[str, Any]:
    """BERT-base built only, the tie checked through a gradient: the padding row (id 0, not
    looked up here, and no lookup gradient anyway) gets one only through the masked-LM
    decoder. Then TINY from torch's weights, in eval mode on torch's batch, whose attention
    mask has zeros. Tolerances sit below what each mismatch costs, measured with TINY on
    Paddle 3.3.1's CPU kernels: tanh-approximated GELU everywhere moves the masked-LM logits
    by 2.7e-6, LayerNorm eps 1e-5 by 5.2e-4, an ignored mask by 7.2e-4; a faithful model is
    within 9e-8 (next-sentence logits 4e-9, loss 4.8e-7). Tanh GELU in the encoder only moves
    them by 1.0e-7, which the logits cannot tell from rounding, so the GELU kind is also
    checked directly: 4.2e-7 from float64's erf GELU, the tanh kind 4.7e-4."""
    import paddle

    from pytest_dlperf.models.bert import BertShape
    from pytest_dlperf.models.bert.paddle import (
        bert_pretraining,
        load_torch_weights,
        pretraining_loss,
        torch_named_shapes,
    )

    paddle.seed(0)
    model = bert_pretraining()
    shapes = torch_named_shapes(model)
    embeddings = model.bert.embeddings.word_embeddings.weight
    ids = paddle.randint(1, 30522, [1, 8])
    mlm, nsp = model(ids, paddle.zeros_like(ids), paddle.ones_like(ids),
                     paddle.to_tensor([[1, 5]]))
    (mlm.sum() + nsp.sum()).backward()
    out: dict[str, Any] = {"shapes": shapes, "probes": {
        "padding_row": float(embeddings[0].abs().max()),
        "decoder_grad": [float(embeddings.grad[0].abs().max())],
        "embeddings": sum(p is embeddings for p in model.parameters())}}
    del model, embeddings, mlm, nsp

    ref = np.load(spec["reference"])
    model = bert_pretraining(BertShape(**spec["shape"]))
    model.eval()
    load_torch_weights(model, {k.removeprefix("param/"): ref[k] for k in ref.files
                               if k.startswith("param/")})
    batch = [paddle.to_tensor(ref[k])
             for k in ("input_ids", "token_type_ids", "attention_mask", "masked_positions")]
    intermediate = model.bert.encoder.layer[0].intermediate
    # Pre-activations of about N(0, 2.3): where exact and tanh GELU differ (by up to 4.7e-4).
    paddle.seed(0)
    x = paddle.randn([64, spec["shape"]["hidden_size"]]) * 20
    with paddle.no_grad():
        mlm, nsp = model(*batch)
        loss = pretraining_loss((mlm, nsp), (paddle.to_tensor(ref["mlm_labels"]),
                                             paddle.to_tensor(ref["nsp_labels"])))
        pre, post = intermediate.dense(x).numpy(), intermediate(x).numpy()
    erf_gelu = pre * 0.5 * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))
    out["outputs"] = {"eager": {
        "mlm_logits": float(np.abs(mlm.numpy() - ref["mlm_logits"]).max()),
        "nsp_logits": float(np.abs(nsp.numpy() - ref["nsp_logits"]).max()),
        "loss": float(abs(loss.numpy() - ref["loss"]))}}
    out["once"] = {"gelu": float(np.abs(post - erf_gelu).max())}
    return out


def bert_jax(spec: dict[str, Any]) -> dict[str, Any]:
    """BERT-base from the built-in CPU case's recipe, built only (a forward and backward of
    BERT-base takes ~15 s eagerly here): its parameters by name, order and shape, the arrays
    it holds (the tied decoder none of its own), transformers' initialization, torch's
    padding_idx. Then TINY from torch's weights (given as a ``state_dict`` names them, the
    tied tensors twice), in eval mode (no dropout) on torch's batch, whose attention mask has
    zeros, eager and through ``nnx.split``/``nnx.merge`` under ``jax.jit``, errors relative to
    the largest logit (the loss's to the loss). Measured with TINY on JAX 0.12's CPU kernels
    (2026-11-26): LayerNorm epsilon 1e-5 moves the masked-LM logits by 1.5e-3, an ignored mask
    by 2.1e-3, tanh-approximated GELU everywhere by 7.8e-6; a faithful model is within 3.4e-7
    (next-sentence logits 2e-7, loss 1.8e-7). The GELU kind is also checked directly, as it is
    the closest call: 3.6e-7 from float64's erf GELU, the tanh kind 4.7e-4; and its
    derivative, the model's own (JAX's fails under shard_map), 1.2e-7."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from pytest_dlperf.core.workload import BuildContext
    from pytest_dlperf.models import BERT_BASE
    from pytest_dlperf.models.bert import BertShape
    from pytest_dlperf.models.bert.jax import (
        load_torch_weights,
        model,
        named_parameters,
        pretraining_loss,
        recipe,
        torch_named_shapes,
    )

    ctx = BuildContext(framework="jax", device_type="cpu", device="cpu",
                       batch_size=BERT_BASE.batch_for("cpu", "fp32"),
                       sizes=BERT_BASE.sizes_for("cpu", "fp32"), precision="fp32",
                       amp_dtype="float32", compiled=True, seed=0, rank=0, world_size=1,
                       local_rank=0)
    base = recipe(ctx).model
    params = jax.tree.leaves(nnx.state(base, nnx.Param))
    named = {name: np.asarray(value) for name, value in named_parameters(base).items()}
    # torch's padding_idx: the lookup sends the padding row (id 0) no gradient, id 7 one.
    base.eval()
    embeddings = base.bert.embeddings
    ids = jnp.array([[0, 7, 0]], jnp.int32)
    weights = jax.random.normal(jax.random.key(1), (1, 3, 768))  # a sum of LayerNorm's is flat
    grads = nnx.grad(lambda e: (e(ids, jnp.zeros_like(ids)) * weights).sum())(embeddings)
    lookup = grads["word_embeddings"]["embedding"][...]
    out: dict[str, Any] = {"shapes": torch_named_shapes(base), "probes": {
        "held": [len(params), sum(int(p.size) for p in params)],
        "init": {name: [float(a.mean()), float(a.std()), float(np.abs(a).max()), float(a.min())]
                 for name, a in named.items()},
        "padding_row": float(np.abs(named["bert.embeddings.word_embeddings.weight"][0]).max()),
        "lookup_grad": [float(jnp.abs(lookup[i]).max()) for i in (0, 7)]}}
    del base, params, named, embeddings, grads

    ref = np.load(spec["reference"])
    bert = model(BertShape(**spec["shape"]))
    arrays = {k.removeprefix("param/"): ref[k] for k in ref.files if k.startswith("param/")}
    load_torch_weights(bert, {**arrays,  # a state_dict names the tied tensors twice
                              "cls.predictions.decoder.weight":
                                  arrays["bert.embeddings.word_embeddings.weight"],
                              "cls.predictions.decoder.bias": arrays["cls.predictions.bias"]})
    bert.eval()
    inputs = tuple(jnp.asarray(ref[k], jnp.int32) for k in
                   ("input_ids", "token_type_ids", "attention_mask", "masked_positions"))
    labels = (jnp.asarray(ref["mlm_labels"], jnp.int32),
              jnp.asarray(ref["nsp_labels"], jnp.int32))
    graphdef, state, rest = nnx.split(bert, nnx.Param, ...)
    jitted = jax.jit(lambda state, rest: nnx.merge(graphdef, state, rest, copy=True)(*inputs))
    outputs = {}
    for mode, (mlm, nsp) in (("eager", bert(*inputs)), ("jit", jitted(state, rest))):
        loss = pretraining_loss((mlm, nsp), labels)
        outputs[mode] = {
            "mlm_logits": float(np.abs(mlm - ref["mlm_logits"]).max()
                                / np.abs(ref["mlm_logits"]).max()),
            "nsp_logits": float(np.abs(nsp - ref["nsp_logits"]).max()
                                / np.abs(ref["nsp_logits"]).max()),
            "loss": float(abs(loss - ref["loss"]) / ref["loss"])}
    intermediate = bert.bert.encoder.layer[0].intermediate
    # Pre-activations of about N(0, 2.3): where exact and tanh GELU differ (by up to 4.7e-4).
    x = jax.random.normal(jax.random.key(0), (64, spec["shape"]["hidden_size"])) * 20
    pre, post = np.asarray(intermediate.dense(x)), np.asarray(intermediate(x))
    x64 = pre.astype(np.float64)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2)))
    grad = np.asarray(jax.vmap(jax.grad(intermediate.activation))(pre.reshape(-1)))
    exact = cdf + x64 * np.exp(-0.5 * x64 * x64) / math.sqrt(2 * math.pi)
    out["outputs"] = outputs
    out["once"] = {"gelu": float(np.abs(post - x64 * cdf).max()),
                   "gelu_grad": float(np.abs(grad - exact.reshape(-1)).max())}
    return out


def bert_tensorflow(spec: dict[str, Any]) -> dict[str, Any]:
    """The recipe's BERT-base built only, under mixed bfloat16 as an AMP case on CPU builds it
    (its variables are float32 whatever the policy): its trainable weights by torch's name and
    shape, as many as torch's, the tied decoder once. Then TINY from torch's weights on torch's
    batch, whose attention mask has zeros; fp32 on both sides: 1.2e-7 apart here. Tight on
    purpose: at TINY's N(0, 0.02) weights the tanh GELU moves the logits by 2.7e-6 only, a
    wrong LayerNorm eps (1e-5) by 5e-4, an ignored attention mask by 7e-4; so the GELU is also
    checked against torch's where the two forms differ most (|x| ~ 2: 5e-4)."""
    import keras

    from pytest_dlperf.core.workload import BuildContext
    from pytest_dlperf.models.bert import BertShape
    from pytest_dlperf.models.bert import tensorflow as bert_keras

    small = BuildContext(
        framework="tensorflow", device_type="cpu", device="cpu", batch_size=2,
        sizes={"seq_length": 16, "max_predictions_per_seq": 3}, precision="amp",
        amp_dtype="bfloat16", compiled=False, seed=0, rank=0, world_size=1, local_rank=0)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(0)
        model = bert_keras.recipe(small).model
    finally:
        keras.mixed_precision.set_global_policy("float32")
    word_embeddings = model.get_layer("bert.embeddings.word_embeddings").embeddings
    out: dict[str, Any] = {"shapes": bert_keras.torch_named_shapes(model), "probes": {
        "held": [len(model.trainable_weights),
                 sum(int(np.prod(w.shape)) for w in model.trainable_weights)],
        "embeddings": sum(w is word_embeddings for w in model.trainable_weights)}}
    del model, word_embeddings

    ref = np.load(spec["reference"])
    model = bert_keras.bert_pretraining(BertShape(**spec["shape"]))
    bert_keras.load_torch_weights(model, {k.removeprefix("param/"): ref[k] for k in ref.files
                                          if k.startswith("param/")})
    inputs = tuple(ref[k].astype("int32") for k in
                   ("input_ids", "token_type_ids", "attention_mask", "masked_positions"))
    mlm, nsp = model(inputs, training=False)
    loss = bert_keras.pretraining_loss(
        (mlm, nsp), (ref["mlm_labels"].astype("int32"), ref["nsp_labels"].astype("int32")))
    out["outputs"] = {"eager": {
        "mlm_logits": float(np.abs(mlm.numpy() - ref["mlm_logits"]).max()),
        "nsp_logits": float(np.abs(nsp.numpy() - ref["nsp_logits"]).max()),
        "loss": float(abs(float(loss) - float(ref["loss"])))}}
    out["once"] = {"gelu": max(
        float(np.abs(np.asarray(model.get_layer(name).activation(ref["gelu_x"]))
                     - ref["gelu"]).max())
        for name in ("bert.encoder.layer.1.intermediate.dense", "cls.predictions.transform.dense"))}
    return out
