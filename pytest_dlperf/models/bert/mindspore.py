"""BERT-base pretraining in MindSpore: torch's ``BertForPreTraining`` rebuilt from
``mindspore.nn`` and ``mindspore.ops``.

No BERT installs beside MindSpore 2.10 (``mindnlp`` 0.5.1 wants MindSpore <= 2.7 and brings
torch, ``mindformers`` 2.1 wants 2.11), so the network is written here, cell for cell as
``transformers`` writes it and under its parameter names, as ``oneflow`` and
``paddle`` are: the alignment tests compare it with torch's by name and shape and load
torch's weights into it to compare outputs.

Names: MindSpore names a parameter by the attribute path to it (``parameters_and_names()`` and
``Parameter.name`` both give ``bert.encoder.layer.0.attention.self.query.weight``, a
``CellList``'s items as ``0``, ``1``..., no prefix of the model's own). ``nn.Dense`` holds
``weight`` [out, in] and ``bias`` as torch's ``Linear``, but ``nn.LayerNorm`` holds ``gamma`` and
``beta`` and ``nn.Embedding`` an ``embedding_table``; the two are written here instead, one
primitive each (``ops.LayerNorm``, ``ops.gather``), with ``weight`` and ``bias``, so that every
name is torch's in MindSpore's own listing (which the adapter and a checkpoint see), not only
after a translation. What else it has to match, and why each is not MindSpore's default:

- exact (erf) GELU (``nn.GELU``'s default is the tanh approximation) and LayerNorm epsilon
  1e-12; ``Dense`` and embedding weights from N(0, 0.02), ``Dense`` biases zero (``Dense``'s
  defaults are torch's ``Linear``'s, uniform);
- the word embeddings' padding row (id 0) zero at start and given no gradient by the lookup, as
  torch's ``padding_idx`` (``nn.Embedding``'s ``padding_idx`` only zeroes the row at start); the
  masked-LM decoder still trains it, since it is the same tensor;
- the decoder tied to the word embeddings: the head is handed the embedding matrix at each call
  instead of holding it, so the matrix is one parameter under one name;
- the attention mask added as ``(1 - mask) * -10000``, which fp16 holds (``oneflow`` says
  why not float32's lowest);
- position embeddings read by slicing their table up to the sequence length, which is static
  when GRAPH mode compiles; the masked positions gathered along axis 1 (``ops.gather`` with
  ``batch_dims=1``).

It runs as it is in PyNative and in GRAPH mode (``mindspore.jit`` of the whole training step,
the same losses to the printed digit): every ``construct`` takes ``self`` first, as GRAPH mode
requires, reads no shape it does not know when compiling, and the loss imports nothing.
Matrix products go through the primitives (``ops.BatchMatMul``, ``ops.MatMul`` with
``transpose_b``): in PyNative on CPU, ``ops.matmul`` and ``ops.dense`` were 4-10x slower here. A ``Cell`` is built with ``training`` off (dropout then does nothing):
``bert_pretraining`` switches it on, and the adapter must keep it on for its steps.

MindSpore is imported inside functions only: the pytest side imports this module and has none.
The classes are defined once, on first use, in groups (``_layers`` to ``_model_classes``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from ...core.workload import BuildContext, Parts
from . import BERT_BASE, BertShape

MASKED_SCORE = -10000.0  # added to the scores of masked keys: exp() of it is 0, and fp16 holds it
PADDING_ID = 0  # BertConfig's pad_token_id: the word embeddings' padding_idx


def bert_pretraining(shape: BertShape = BERT_BASE) -> Any:
    """BERT with both pretraining heads, the masked-LM head on the masked positions only,
    in training mode: ``model(input_ids, token_type_ids, attention_mask, masked_positions)``
    returns ``(mlm_logits [batch, positions, vocab], nsp_logits [batch, 2])``."""
    model = _model_classes().BertForPreTraining(shape)
    model.set_train(True)
    return model


def recipe(ctx: BuildContext) -> Parts:
    """BERT-base on synthetic sentences resident on the device, labels drawn every step."""
    import mindspore as ms
    from mindspore import ops

    # No device arguments: MindSpore's device is its context's, set by the adapter.
    batch, seq = ctx.batch_size, int(ctx.sizes["seq_length"])
    predictions = int(ctx.sizes["max_predictions_per_seq"])
    vocab = BERT_BASE.vocab_size
    model = bert_pretraining()
    input_ids = ops.randint(0, vocab, (batch, seq), dtype=ms.int64)
    token_type_ids = ops.randint(0, BERT_BASE.type_vocab_size, (batch, seq), dtype=ms.int64)
    attention_mask = ops.ones((batch, seq), ms.int64)
    # Distinct positions per sequence, in order, as BERT's data pipeline writes them (sorted
    # as floats: exact below 2**24).
    positions = ops.rand(batch, seq).argsort(axis=1)[:, :predictions]
    positions = ops.sort(positions.astype(ms.float32), axis=1)[0].astype(ms.int64)

    def fresh_labels() -> Any:
        return (ops.randint(0, vocab, (batch, predictions), dtype=ms.int64),
                ops.randint(0, 2, (batch,), dtype=ms.int64))

    return Parts(model=model, inputs=(input_ids, token_type_ids, attention_mask, positions),
                 targets=fresh_labels, loss=_loss().pretraining_loss)


def pretraining_loss(outputs: Any, targets: Any) -> Any:
    """Masked-LM plus next-sentence cross-entropy, both means, in float32: ``outputs`` are the
    model's ``(mlm_logits, nsp_logits)``, ``targets`` ``(mlm_labels [batch, positions],
    nsp_labels [batch])`` of integer class ids. It calls the function ``_loss`` defines, which
    reads MindSpore from its closure: GRAPH mode refuses to compile a function with an
    ``import`` statement in it. The recipe hands the adapter that one directly."""
    return _loss().pretraining_loss(outputs, targets)


def torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The trainable parameters by name, in MindSpore's order: torch's names, order and layout
    already, which the alignment test checks against ``bert.torch.torch_named_shapes``."""
    return {name: tuple(int(d) for d in param.shape)
            for name, param in model.parameters_and_names() if param.requires_grad}


def load_torch_weights(model: Any, arrays: Mapping[str, Any]) -> None:
    """Set every parameter from torch's arrays by name (the same layout). Refuses a missing or
    extra name and a shape that differs."""
    from ..resnet50.mindspore import set_by_name

    set_by_name(dict(model.parameters_and_names()), arrays)


@functools.cache
def _loss() -> SimpleNamespace:
    """The loss, defined where MindSpore is imported: GRAPH mode compiles a function that
    reads ``ops`` from its closure but refuses one with an ``import`` statement in it."""
    import mindspore as ms
    from mindspore import ops

    def pretraining_loss(outputs: Any, targets: Any) -> Any:
        mlm_logits, nsp_logits = outputs
        mlm, nsp = targets
        # In fp32 whatever the AMP dtype: a 30522-way softmax in fp16 loses the loss.
        vocab = mlm_logits.shape[-1]
        return (ops.cross_entropy(mlm_logits.reshape(-1, vocab).astype(ms.float32),
                                  mlm.reshape(-1))
                + ops.cross_entropy(nsp_logits.astype(ms.float32), nsp))

    return SimpleNamespace(pretraining_loss=pretraining_loss)


@functools.cache
def _layers() -> SimpleNamespace:
    """Dense, LayerNorm and Embedding as BERT needs them, under torch's parameter names."""
    import mindspore as ms
    from mindspore import Parameter, nn, ops
    from mindspore.common.initializer import Normal, initializer

    Cell: Any = nn.Cell

    def dense(s: BertShape, width: int, out: int) -> Any:
        return nn.Dense(width, out, weight_init=Normal(s.initializer_range), bias_init="zeros")

    class LayerNorm(Cell):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.weight = Parameter(initializer("ones", (s.hidden_size,)), name="weight")
            self.bias = Parameter(initializer("zeros", (s.hidden_size,)), name="bias")
            self.norm = ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1,
                                      epsilon=s.layer_norm_eps)

        def construct(self, x: Any) -> Any:
            return self.norm(x, self.weight, self.bias)[0]

    class Embedding(Cell):  # type: ignore[misc]
        def __init__(self, s: BertShape, num: int, padding_idx: int | None = None) -> None:
            super().__init__()
            table = initializer(Normal(s.initializer_range), (num, s.hidden_size)).init_data()
            if padding_idx is not None:
                table = table.asnumpy()
                table[padding_idx] = 0.0
                table = ms.Tensor(table)
            self.weight = Parameter(table, name="weight")
            self.padding_idx = padding_idx

        def construct(self, ids: Any) -> Any:
            out = ops.gather(self.weight, ids, 0)
            if self.padding_idx is None:
                return out
            # torch's padding_idx: the row is read, but its lookups send it no gradient.
            padding = (ids == self.padding_idx).expand_dims(-1)
            return ops.select(padding, ops.stop_gradient(out), out)

    return SimpleNamespace(dense=dense, LayerNorm=LayerNorm, Embedding=Embedding)


@functools.cache
def _attention_classes() -> SimpleNamespace:
    """BertAttention and its parts; ``Residual`` is BertOutput too."""
    from mindspore import nn, ops

    Cell: Any = nn.Cell
    L = _layers()

    class SelfAttention(Cell):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.heads, self.head_size = s.num_heads, s.hidden_size // s.num_heads
            self.query = L.dense(s, s.hidden_size, s.hidden_size)
            self.key = L.dense(s, s.hidden_size, s.hidden_size)
            self.value = L.dense(s, s.hidden_size, s.hidden_size)
            self.dropout = nn.Dropout(p=s.dropout)
            self.scale = 1.0 / math.sqrt(self.head_size)
            # The primitives: ops.matmul broadcasts in Python first, 5-10x slower on CPU here.
            self.matmul_t = ops.BatchMatMul(transpose_b=True)
            self.matmul = ops.BatchMatMul()

        def split_heads(self, x: Any) -> Any:  # [B, S, H] -> [B, heads, S, head_size]
            batch, seq, _ = x.shape
            return x.reshape(batch, seq, self.heads, self.head_size).transpose(0, 2, 1, 3)

        def construct(self, x: Any, additive_mask: Any) -> Any:
            q = self.split_heads(self.query(x))
            k = self.split_heads(self.key(x))
            v = self.split_heads(self.value(x))
            scores = self.matmul_t(q, k) * self.scale
            probs = self.dropout(ops.softmax(scores + additive_mask, axis=-1))
            context = self.matmul(probs, v).transpose(0, 2, 1, 3)
            return context.reshape(x.shape[0], x.shape[1], -1)

    class Residual(Cell):  # type: ignore[misc]
        """BertSelfOutput and BertOutput: dense, dropout, residual, LayerNorm."""

        def __init__(self, s: BertShape, width: int) -> None:
            super().__init__()
            self.dense = L.dense(s, width, s.hidden_size)
            self.LayerNorm = L.LayerNorm(s)
            self.dropout = nn.Dropout(p=s.dropout)

        def construct(self, x: Any, residual: Any) -> Any:
            return self.LayerNorm(self.dropout(self.dense(x)) + residual)

    class Attention(Cell):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.self = SelfAttention(s)
            self.output = Residual(s, s.hidden_size)

        def construct(self, x: Any, additive_mask: Any) -> Any:
            return self.output(self.self(x, additive_mask), x)

    return SimpleNamespace(Attention=Attention, Residual=Residual)


@functools.cache
def _encoder_classes() -> SimpleNamespace:
    """BertEncoder: its layers of attention, intermediate and output."""
    from mindspore import nn, ops

    Cell: Any = nn.Cell
    L, parts = _layers(), _attention_classes()

    class Intermediate(Cell):  # type: ignore[misc]
        """BertIntermediate: its Dense is named ``dense``."""

        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.dense = L.dense(s, s.hidden_size, s.intermediate_size)

        def construct(self, x: Any) -> Any:
            return ops.gelu(self.dense(x), approximate="none")

    class Layer(Cell):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.attention = parts.Attention(s)
            self.intermediate = Intermediate(s)
            self.output = parts.Residual(s, s.intermediate_size)

        def construct(self, x: Any, additive_mask: Any) -> Any:
            x = self.attention(x, additive_mask)
            return self.output(self.intermediate(x), x)

    class Encoder(Cell):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.layer = nn.CellList([Layer(s) for _ in range(s.num_layers)])

        def construct(self, x: Any, attention_mask: Any) -> Any:
            # [B, S] of 1 (attend) / 0 (masked) -> added to the [B, heads, S, S] scores.
            keep = attention_mask.astype(x.dtype).expand_dims(1).expand_dims(2)
            additive_mask = (1.0 - keep) * MASKED_SCORE
            for layer in self.layer:
                x = layer(x, additive_mask)
            return x

    return SimpleNamespace(Encoder=Encoder)


@functools.cache
def _head_classes() -> SimpleNamespace:
    """BertPreTrainingHeads: the masked-LM head and the next-sentence classifier."""
    from mindspore import Parameter, nn, ops
    from mindspore.common.initializer import initializer

    Cell: Any = nn.Cell
    L = _layers()

    class Transform(Cell):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.dense = L.dense(s, s.hidden_size, s.hidden_size)
            self.LayerNorm = L.LayerNorm(s)

        def construct(self, x: Any) -> Any:
            return self.LayerNorm(ops.gelu(self.dense(x), approximate="none"))

    class Predictions(Cell):  # type: ignore[misc]
        """The masked-LM head; its decoder weight is the word embeddings, passed in."""

        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.bias = Parameter(initializer("zeros", (s.vocab_size,)), name="bias")
            self.transform = Transform(s)
            self.matmul_t = ops.MatMul(transpose_b=True)  # ops.dense: 4x slower here

        def construct(self, x: Any, decoder_weight: Any) -> Any:
            batch, positions, width = x.shape
            x = self.transform(x).reshape(batch * positions, width)
            logits = self.matmul_t(x, decoder_weight) + self.bias
            return logits.reshape(batch, positions, -1)

    class Heads(Cell):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.predictions = Predictions(s)
            self.seq_relationship = L.dense(s, s.hidden_size, 2)

    return SimpleNamespace(Heads=Heads)


@functools.cache
def _model_classes() -> SimpleNamespace:
    """The embeddings, the pooler, BertModel, and BertForPreTraining with its heads."""
    from mindspore import nn, ops

    Cell: Any = nn.Cell
    L = _layers()

    class Embeddings(Cell):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.word_embeddings = L.Embedding(s, s.vocab_size, padding_idx=PADDING_ID)
            self.position_embeddings = L.Embedding(s, s.max_positions)
            self.token_type_embeddings = L.Embedding(s, s.type_vocab_size)
            self.LayerNorm = L.LayerNorm(s)
            self.dropout = nn.Dropout(p=s.dropout)

        def construct(self, input_ids: Any, token_type_ids: Any) -> Any:
            positions = self.position_embeddings.weight[:input_ids.shape[1]].expand_dims(0)
            x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
            return self.dropout(self.LayerNorm(x + positions))

    class Pooler(Cell):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.dense = L.dense(s, s.hidden_size, s.hidden_size)

        def construct(self, x: Any) -> Any:
            return ops.tanh(self.dense(x[:, 0]))

    class BertModel(Cell):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.embeddings = Embeddings(s)
            self.encoder = _encoder_classes().Encoder(s)
            self.pooler = Pooler(s)

        def construct(self, input_ids: Any, token_type_ids: Any, attention_mask: Any) -> Any:
            hidden = self.encoder(self.embeddings(input_ids, token_type_ids), attention_mask)
            return hidden, self.pooler(hidden)

    class BertForPreTraining(Cell):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.bert = BertModel(s)
            self.cls = _head_classes().Heads(s)

        def construct(self, input_ids: Any, token_type_ids: Any, attention_mask: Any,
                      masked_positions: Any) -> Any:
            hidden, pooled = self.bert(input_ids, token_type_ids, attention_mask)
            masked = ops.gather(hidden, masked_positions, 1, batch_dims=1)
            mlm = self.cls.predictions(masked, self.bert.embeddings.word_embeddings.weight)
            return mlm, self.cls.seq_relationship(pooled)

    return SimpleNamespace(BertForPreTraining=BertForPreTraining)
