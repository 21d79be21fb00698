"""BERT-base pretraining in PaddlePaddle: torch's ``BertForPreTraining`` rebuilt from
``paddle.nn``.

Paddle itself has no BERT, and rather than depend on PaddleNLP for one, the network is written
here, layer for layer as ``transformers`` writes it and under its parameter names
(``named_parameters`` gives ``bert.encoder.layer.0.attention.self.query.weight`` because each
sublayer is an attribute named as torch's module is), so that the alignment tests compare it
with torch's by name and shape and load torch's weights into it to compare outputs. It is
``oneflow``'s model in Paddle's terms; what it has to match, and why each is not Paddle's
default:

- exact (erf) GELU (``approximate=False``) and LayerNorm epsilon 1e-12 (Paddle's is 1e-5);
  Linear and Embedding weights from N(0, 0.02), given as the parameters' initializer so that
  BERT-base's 110M values are drawn once (Paddle's own are Xavier); Linear biases start at zero,
  as Paddle's do;
- the word embeddings' padding row (id 0) zero at start and given no gradient by the lookup
  (``padding_idx``; Paddle's ``Embedding`` zeroes that row after its initializer, in dynamic
  mode, where the model is built); the masked-LM decoder still trains it, since it is the same
  tensor;
- the decoder tied to the word embeddings: the head is handed the embedding matrix at each call
  (``matmul(x, weight, transpose_y=True)``) instead of holding it, so the matrix is one
  parameter under one name;
- the attention mask added as ``(1 - mask) * -10000``, which fp16 holds (``oneflow`` says
  why not float32's lowest);
- position embeddings read by slicing their table up to the sequence length, which is known when
  ``paddle.jit.to_static`` traces; the masked positions are gathered along axis 1.

Paddle's ``Linear`` keeps its weight as [in, out], torch's as [out, in]. The model keeps Paddle's
layout (no transpose in the forward pass); ``torch_named_shapes`` and ``load_torch_weights``
transpose the Linear weights to compare with torch and to load its weights. Embeddings are
[num, dim] in both.

Paddle is imported inside functions only: the pytest side imports this module and need not have
Paddle. The classes are defined once, on first use, in four groups (``_attention_classes`` to
``_model_classes``).
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
    """BERT with both pretraining heads, the masked-LM head on the masked positions only:
    ``model(input_ids, token_type_ids, attention_mask, masked_positions)`` returns
    ``(mlm_logits [batch, positions, vocab], nsp_logits [batch, 2])``."""
    return _model_classes().BertForPreTraining(shape)


def recipe(ctx: BuildContext) -> Parts:
    """BERT-base on synthetic sentences resident on the device, labels drawn every step."""
    import paddle

    # No device arguments: the Paddle adapter has called paddle.set_device for this rank before
    # the recipe runs, and tensors are created there.
    batch, seq = ctx.batch_size, int(ctx.sizes["seq_length"])
    predictions = int(ctx.sizes["max_predictions_per_seq"])
    vocab = BERT_BASE.vocab_size
    model = bert_pretraining()
    input_ids = paddle.randint(0, vocab, [batch, seq], dtype="int64")
    token_type_ids = paddle.randint(0, BERT_BASE.type_vocab_size, [batch, seq], dtype="int64")
    attention_mask = paddle.ones([batch, seq], dtype="int64")
    # Distinct positions per sequence, in order, as BERT's data pipeline writes them.
    positions = paddle.rand([batch, seq]).argsort(axis=1)[:, :predictions]
    positions = paddle.sort(positions, axis=1).astype("int64")

    def fresh_labels() -> Any:
        return (paddle.randint(0, vocab, [batch, predictions], dtype="int64"),
                paddle.randint(0, 2, [batch], dtype="int64"))

    return Parts(model=model, inputs=(input_ids, token_type_ids, attention_mask, positions),
                 targets=fresh_labels, loss=pretraining_loss)


def pretraining_loss(outputs: Any, targets: Any) -> Any:
    """Masked-LM plus next-sentence cross-entropy, both means; eager and under to_static."""
    import paddle.nn.functional as F

    mlm_logits, nsp_logits = outputs
    mlm, nsp = targets
    # In fp32 whatever the AMP dtype: a 30522-way softmax in fp16 loses the loss.
    vocab = mlm_logits.shape[-1]
    return (F.cross_entropy(mlm_logits.reshape([-1, vocab]).astype("float32"), mlm.reshape([-1]))
            + F.cross_entropy(nsp_logits.astype("float32"), nsp))


def torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The trainable parameters under BertForPreTraining's names, in torch's layout and order:
    what the alignment test compares with ``bert.torch.torch_named_shapes``."""
    linear = _linear_weight_names(model)
    return {name: _torch_layout(name, p.shape, linear)
            for name, p in model.named_parameters() if not p.stop_gradient}


def load_torch_weights(model: Any, arrays: Mapping[str, Any]) -> None:
    """Set every parameter from torch's by name (torch layout: Linear weights are transposed
    here). Refuses a missing or extra name and a shape that differs."""
    import paddle

    params = dict(model.named_parameters())
    if set(params) != set(arrays):
        raise ValueError(f"torch names without a parameter: {sorted(set(arrays) - set(params))}; "
                         f"parameters without an array: {sorted(set(params) - set(arrays))}")
    linear = _linear_weight_names(model)
    with paddle.no_grad():
        for name, param in params.items():
            value = arrays[name]
            if tuple(value.shape) != _torch_layout(name, param.shape, linear):
                raise ValueError(f"{name}: torch's array is {tuple(value.shape)}, the parameter "
                                 f"is {tuple(param.shape)} in Paddle's layout")
            param.set_value(value.T if name in linear else value)


def _linear_weight_names(model: Any) -> set[str]:
    import paddle

    return {f"{prefix}.weight" for prefix, layer in model.named_sublayers()
            if isinstance(layer, paddle.nn.Linear)}


def _torch_layout(name: str, shape: Any, linear: set[str]) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    return dims[::-1] if name in linear else dims


def _normal(s: BertShape) -> Any:
    import paddle

    return paddle.ParamAttr(initializer=paddle.nn.initializer.Normal(0.0, s.initializer_range))


def _linear(s: BertShape, width: int, out: int) -> Any:
    import paddle

    return paddle.nn.Linear(width, out, weight_attr=_normal(s))  # bias: Paddle's zeros


def _embedding(s: BertShape, num: int, padding_idx: int | None = None) -> Any:
    import paddle

    return paddle.nn.Embedding(num, s.hidden_size, padding_idx=padding_idx,
                               weight_attr=_normal(s))


def _layer_norm(s: BertShape) -> Any:
    import paddle

    return paddle.nn.LayerNorm(s.hidden_size, epsilon=s.layer_norm_eps)  # ones and zeros


@functools.cache
def _attention_classes() -> SimpleNamespace:
    """BertAttention and its parts, defined on first use (they derive from
    ``paddle.nn.Layer``); ``Residual`` is BertOutput too."""
    import paddle
    import paddle.nn.functional as F

    Layer: Any = paddle.nn.Layer
    matmul: Any = paddle.matmul  # unannotated in Paddle's stubs

    class SelfAttention(Layer):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.heads, self.head_size = s.num_heads, s.hidden_size // s.num_heads
            self.query = _linear(s, s.hidden_size, s.hidden_size)
            self.key = _linear(s, s.hidden_size, s.hidden_size)
            self.value = _linear(s, s.hidden_size, s.hidden_size)
            self.dropout = paddle.nn.Dropout(s.dropout)

        def split_heads(self, x: Any) -> Any:  # [B, S, H] -> [B, heads, S, head_size]
            # 0 in a reshape keeps that dimension: no shape read at trace time.
            return x.reshape([0, 0, self.heads, self.head_size]).transpose([0, 2, 1, 3])

        def forward(self, x: Any, additive_mask: Any) -> Any:
            q = self.split_heads(self.query(x))
            k = self.split_heads(self.key(x))
            v = self.split_heads(self.value(x))
            scores = matmul(q, k, transpose_y=True) / math.sqrt(self.head_size)
            probs = self.dropout(F.softmax(scores + additive_mask, axis=-1))
            return matmul(probs, v).transpose([0, 2, 1, 3]).reshape([0, 0, -1])

    class Residual(Layer):  # type: ignore[misc]
        """BertSelfOutput and BertOutput: dense, dropout, residual, LayerNorm."""

        def __init__(self, s: BertShape, width: int) -> None:
            super().__init__()
            self.dense = _linear(s, width, s.hidden_size)
            self.LayerNorm = _layer_norm(s)
            self.dropout = paddle.nn.Dropout(s.dropout)

        def forward(self, x: Any, residual: Any) -> Any:
            return self.LayerNorm(self.dropout(self.dense(x)) + residual)

    class Attention(Layer):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.self = SelfAttention(s)
            self.output = Residual(s, s.hidden_size)

        def forward(self, x: Any, additive_mask: Any) -> Any:
            return self.output(self.self(x, additive_mask), x)

    return SimpleNamespace(Attention=Attention, Residual=Residual)


@functools.cache
def _encoder_classes() -> SimpleNamespace:
    """BertEncoder: its layers of attention, intermediate and output."""
    import paddle
    import paddle.nn.functional as F

    Layer: Any = paddle.nn.Layer
    parts = _attention_classes()

    class Intermediate(Layer):  # type: ignore[misc]
        """BertIntermediate: its Linear is named ``dense``."""

        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.dense = _linear(s, s.hidden_size, s.intermediate_size)

        def forward(self, x: Any) -> Any:
            return F.gelu(self.dense(x), approximate=False)

    class EncoderLayer(Layer):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.attention = parts.Attention(s)
            self.intermediate = Intermediate(s)
            self.output = parts.Residual(s, s.intermediate_size)

        def forward(self, x: Any, additive_mask: Any) -> Any:
            x = self.attention(x, additive_mask)
            return self.output(self.intermediate(x), x)

    class Encoder(Layer):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.layer = paddle.nn.LayerList([EncoderLayer(s) for _ in range(s.num_layers)])

        def forward(self, x: Any, attention_mask: Any) -> Any:
            # [B, S] of 1 (attend) / 0 (masked) -> added to the [B, heads, S, S] scores.
            keep = attention_mask.astype(x.dtype).unsqueeze([1, 2])
            additive_mask = (1.0 - keep) * MASKED_SCORE
            for layer in self.layer:
                x = layer(x, additive_mask)
            return x

    return SimpleNamespace(Encoder=Encoder)


@functools.cache
def _head_classes() -> SimpleNamespace:
    """BertPreTrainingHeads: the masked-LM head and the next-sentence classifier."""
    import paddle
    import paddle.nn.functional as F

    Layer: Any = paddle.nn.Layer
    matmul: Any = paddle.matmul  # unannotated in Paddle's stubs

    class Transform(Layer):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.dense = _linear(s, s.hidden_size, s.hidden_size)
            self.LayerNorm = _layer_norm(s)

        def forward(self, x: Any) -> Any:
            return self.LayerNorm(F.gelu(self.dense(x), approximate=False))

    class Predictions(Layer):  # type: ignore[misc]
        """The masked-LM head; its decoder weight is the word embeddings, passed in."""

        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.bias = self.create_parameter([s.vocab_size], is_bias=True)  # zeros
            self.transform = Transform(s)

        def forward(self, x: Any, decoder_weight: Any) -> Any:
            return matmul(self.transform(x), decoder_weight, transpose_y=True) + self.bias

    class Heads(Layer):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.predictions = Predictions(s)
            self.seq_relationship = _linear(s, s.hidden_size, 2)

    return SimpleNamespace(Heads=Heads)


@functools.cache
def _model_classes() -> SimpleNamespace:
    """The embeddings, the pooler, BertModel, and BertForPreTraining with its heads."""
    import paddle

    Layer: Any = paddle.nn.Layer

    class Embeddings(Layer):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.word_embeddings = _embedding(s, s.vocab_size, padding_idx=PADDING_ID)
            self.position_embeddings = _embedding(s, s.max_positions)
            self.token_type_embeddings = _embedding(s, s.type_vocab_size)
            self.LayerNorm = _layer_norm(s)
            self.dropout = paddle.nn.Dropout(s.dropout)

        def forward(self, input_ids: Any, token_type_ids: Any) -> Any:
            positions = self.position_embeddings.weight[:input_ids.shape[1]].unsqueeze(0)
            x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
            return self.dropout(self.LayerNorm(x + positions))

    class Pooler(Layer):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.dense = _linear(s, s.hidden_size, s.hidden_size)

        def forward(self, x: Any) -> Any:
            return paddle.tanh(self.dense(x[:, 0]))

    class BertModel(Layer):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.embeddings = Embeddings(s)
            self.encoder = _encoder_classes().Encoder(s)
            self.pooler = Pooler(s)

        def forward(self, input_ids: Any, token_type_ids: Any, attention_mask: Any) -> Any:
            hidden = self.encoder(self.embeddings(input_ids, token_type_ids), attention_mask)
            return hidden, self.pooler(hidden)

    class BertForPreTraining(Layer):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.bert = BertModel(s)
            self.cls = _head_classes().Heads(s)

        def forward(self, input_ids: Any, token_type_ids: Any, attention_mask: Any,
                    masked_positions: Any) -> Any:
            hidden, pooled = self.bert(input_ids, token_type_ids, attention_mask)
            index = masked_positions.unsqueeze(-1).expand([-1, -1, hidden.shape[-1]])
            masked = paddle.take_along_axis(hidden, index, axis=1)
            mlm = self.cls.predictions(masked, self.bert.embeddings.word_embeddings.weight)
            return mlm, self.cls.seq_relationship(pooled)

    return SimpleNamespace(BertForPreTraining=BertForPreTraining)
