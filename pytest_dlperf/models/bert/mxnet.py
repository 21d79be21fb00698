"""BERT-base pretraining in MXNet 1.9: torch's ``BertForPreTraining`` from Gluon HybridBlocks.

MXNet's BERT is GluonNLP's, not used: another dependency, retired with MXNet, whose
``get_model`` fetches a vocabulary over the network, which a rank may not have. So the network
is written here, block for block as ``transformers`` writes it and under its parameter names,
as ``mindspore`` is: the alignment tests compare it with torch's by name and shape and
load torch's weights into it to compare outputs.

Names: Gluon 1.x names a parameter by its blocks' prefixes. Every block here is made in its
parent's ``name_scope`` with the prefix ``<attribute>.`` (the model's own is empty), so
``collect_params()`` (what a ``gluon.Trainer`` and the adapter see) lists torch's names in
torch's order (a block's own parameters first, then its children as made). ``nn.Dense`` holds
``weight`` [out, in] and ``bias`` as torch's ``Linear``; LayerNorm (``nn.LayerNorm`` holds
``gamma``, ``beta``) and the embeddings are written here with ``weight`` and ``bias``. What
else it has to match, and why each is not MXNet's default:

- exact (erf) GELU: ``LeakyReLU(act_type='gelu')`` is erf-based in MXNet 1.9 (the tests check
  it against float64's erf); LayerNorm epsilon 1e-12 (``nn.LayerNorm``'s is 1e-5);
- ``Dense`` and embedding weights from N(0, 0.02), biases zero (``Dense``'s default weights are
  uniform); the word embeddings' padding row (id 0) zero at start and given no gradient by the
  lookup, as torch's ``padding_idx``; the masked-LM decoder still trains it;
- the decoder tied to the word embeddings: the model hands the head the embeddings'
  ``Parameter`` (its symbol when hybridized, its array when eager): one parameter, one name;
- the attention mask added as ``(1 - mask) * -10000`` (fp16 holds it; exp() of it is 0);
- dropout 0.1 on the embeddings, the attention probabilities and every residual branch, on
  under ``autograd.record()`` (training mode) only.

Inputs: the ids (tokens, segments, masked positions) and labels are int32, which
``Embedding``, ``gather_nd`` and ``pick`` take, exact for any id; the attention mask is float32
(1.0 attend, 0.0 masked): it is arithmetic on the scores, MXNet's binary operators refuse mixed
dtypes, and a cast in the model would pin a dtype that AMP should choose.

Every block is a ``HybridBlock`` that reads no shape: the model runs eager and
``hybridize(static_alloc=True, static_shape=True)``. It casts nothing, so that
``mxnet.contrib.amp.init`` (called before the model is built) decides the dtypes: its lists run
``FullyConnected`` in the low precision, softmax, LayerNorm, the embeddings and the loss's
``log_softmax`` in float32. MXNet is imported inside functions only (the pytest side has none);
the classes are defined once, on first use, in groups (``_layers`` to ``_model_classes``).
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


def bert_pretraining(shape: BertShape = BERT_BASE, ctx: Any = None) -> Any:
    """BERT with both pretraining heads, the masked-LM head on the masked positions only,
    its parameters initialized on ``ctx`` (an MXNet context; default the CPU):
    ``model(input_ids, token_type_ids, attention_mask, masked_positions)`` returns
    ``(mlm_logits [batch, positions, vocab], nsp_logits [batch, 2])``."""
    import mxnet as mx

    model = _model_classes().BertForPreTraining(shape, prefix="")
    model.initialize(ctx=ctx or mx.cpu())
    return model


def recipe(ctx: BuildContext) -> Parts:
    """BERT-base on synthetic sentences resident on the device, labels drawn every step."""
    import mxnet as mx

    batch, seq = ctx.batch_size, int(ctx.sizes["seq_length"])
    predictions = int(ctx.sizes["max_predictions_per_seq"])
    vocab = BERT_BASE.vocab_size
    device = mx.cpu() if ctx.device == "cpu" else mx.gpu(int(ctx.device.split(":")[1]))
    model = bert_pretraining(BERT_BASE, device)
    randint = functools.partial(mx.nd.random.randint, ctx=device, dtype="int32")
    input_ids = randint(0, vocab, (batch, seq))
    token_type_ids = randint(0, BERT_BASE.type_vocab_size, (batch, seq))
    attention_mask = mx.nd.ones((batch, seq), ctx=device, dtype="float32")
    # Distinct positions per sequence, in order, as BERT's data pipeline writes them.
    order = mx.nd.random.uniform(shape=(batch, seq), ctx=device).argsort(axis=1, dtype="int32")
    positions = mx.nd.sort(order[:, :predictions], axis=1)

    def fresh_labels() -> Any:
        return randint(0, vocab, (batch, predictions)), randint(0, 2, (batch,))

    return Parts(model=model, inputs=(input_ids, token_type_ids, attention_mask, positions),
                 targets=fresh_labels, loss=pretraining_loss)


def pretraining_loss(outputs: Any, targets: Any) -> Any:
    """Masked-LM plus next-sentence cross-entropy, both means: a shape-(1,) NDArray (a Symbol
    for Symbols). ``outputs`` are the model's ``(mlm_logits, nsp_logits)``, ``targets``
    ``(mlm_labels [batch, positions], nsp_labels [batch])`` of class ids. No cast: under AMP,
    ``log_softmax`` is on MXNet's float32 lists, so a 30522-way softmax never runs in bf16."""
    import mxnet as mx

    F = mx.sym if isinstance(outputs[0], mx.sym.Symbol) else mx.nd
    mlm, nsp = (-F.pick(F.log_softmax(logits, axis=-1), labels, axis=-1).mean()
                for logits, labels in zip(outputs, targets))
    return mlm + nsp


def torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The trainable parameters by name, in MXNet's order (``collect_params()``): torch's names,
    order and layout already, checked against ``bert.torch.torch_named_shapes``."""
    return {name: tuple(int(d) for d in param.shape)
            for name, param in model.collect_params().items() if param.grad_req != "null"}


def load_torch_weights(model: Any, arrays: Mapping[str, Any]) -> None:
    """Set every parameter from torch's arrays by name (the same layout) on all its contexts.
    Refuses a missing or extra name and a shape that differs."""
    import mxnet as mx

    params = model.collect_params()
    if set(params) != set(arrays):
        raise ValueError(f"torch's weights do not name the model's parameters: missing "
                         f"{sorted(set(params) - set(arrays))[:5]}, extra "
                         f"{sorted(set(arrays) - set(params))[:5]}")
    for name, param in params.items():
        if tuple(arrays[name].shape) != tuple(param.shape):
            raise ValueError(f"{name}: torch's {arrays[name].shape}, the model's {param.shape}")
        param.set_data(mx.nd.array(arrays[name], dtype=param.dtype))


@functools.cache
def _layers() -> SimpleNamespace:
    """Dense, LayerNorm and Embedding as BERT needs them, under torch's parameter names."""
    import mxnet as mx
    from mxnet.gluon import HybridBlock, nn

    Block: Any = HybridBlock

    def dense(s: BertShape, width: int, out: int, name: str) -> Any:
        """Made in the parent's ``name_scope``: ``<parent's prefix><name>.weight``, ``.bias``."""
        return nn.Dense(out, in_units=width, flatten=False, prefix=f"{name}.",
                        weight_initializer=mx.init.Normal(s.initializer_range),
                        bias_initializer="zeros")

    class LayerNorm(Block):  # type: ignore[misc]
        def __init__(self, s: BertShape, prefix: str = "LayerNorm.") -> None:
            super().__init__(prefix=prefix)
            self.eps = s.layer_norm_eps
            self.weight = self.params.get("weight", shape=(s.hidden_size,), init="ones")
            self.bias = self.params.get("bias", shape=(s.hidden_size,), init="zeros")

        def hybrid_forward(self, F: Any, x: Any, weight: Any, bias: Any) -> Any:
            return F.LayerNorm(x, weight, bias, axis=-1, eps=self.eps)

    class PaddedNormal(mx.init.Normal):  # type: ignore[misc]
        """N(0, sigma) with the padding row zero, as transformers initializes it."""

        def _init_weight(self, name: Any, arr: Any) -> None:
            super()._init_weight(name, arr)
            arr[PADDING_ID] = 0.0

    class Embedding(Block):  # type: ignore[misc]
        def __init__(self, s: BertShape, num: int, name: str, padding: bool = False) -> None:
            super().__init__(prefix=f"{name}.")
            self.num, self.width, self.padding = num, s.hidden_size, padding
            init = (PaddedNormal if padding else mx.init.Normal)(s.initializer_range)
            self.weight = self.params.get("weight", shape=(num, s.hidden_size), init=init)

        def hybrid_forward(self, F: Any, ids: Any, weight: Any) -> Any:
            out = F.Embedding(ids, weight, input_dim=self.num, output_dim=self.width)
            if not self.padding:
                return out
            # torch's padding_idx: the row is read, but its lookups send it no gradient.
            padding = F.broadcast_like(F.expand_dims(ids == PADDING_ID, -1), out)
            return F.where(padding, F.BlockGrad(out), out)

    return SimpleNamespace(dense=dense, LayerNorm=LayerNorm, Embedding=Embedding)


@functools.cache
def _attention_classes() -> SimpleNamespace:
    """BertAttention and its parts; ``Residual`` is BertOutput too."""
    from mxnet.gluon import HybridBlock, nn

    Block: Any = HybridBlock
    L = _layers()

    class SelfAttention(Block):  # type: ignore[misc]
        def __init__(self, s: BertShape, prefix: str = "self.") -> None:
            super().__init__(prefix=prefix)
            self.heads, self.scale = s.num_heads, math.sqrt(s.hidden_size // s.num_heads)
            with self.name_scope():
                self.query = L.dense(s, s.hidden_size, s.hidden_size, "query")
                self.key = L.dense(s, s.hidden_size, s.hidden_size, "key")
                self.value = L.dense(s, s.hidden_size, s.hidden_size, "value")
                self.dropout = nn.Dropout(s.dropout)

        def split_heads(self, F: Any, x: Any) -> Any:  # [B, S, H] -> [B * heads, S, head]
            x = F.transpose(F.reshape(x, shape=(0, 0, self.heads, -1)), axes=(0, 2, 1, 3))
            return F.reshape(x, shape=(-3, -2))

        def hybrid_forward(self, F: Any, x: Any, additive_mask: Any) -> Any:
            q = self.split_heads(F, self.query(x))
            k = self.split_heads(F, self.key(x))
            v = self.split_heads(F, self.value(x))
            scores = F.batch_dot(q, k, transpose_b=True) / self.scale
            scores = F.reshape(scores, shape=(-4, -1, self.heads, -2))  # [B, heads, S, S]
            probs = self.dropout(F.softmax(F.broadcast_add(scores, additive_mask), axis=-1))
            context = F.batch_dot(F.reshape(probs, shape=(-3, -2)), v)
            context = F.reshape(context, shape=(-4, -1, self.heads, -2))  # [B, heads, S, head]
            return F.reshape(F.transpose(context, axes=(0, 2, 1, 3)), shape=(0, 0, -1))

    class Residual(Block):  # type: ignore[misc]
        """BertSelfOutput and BertOutput: dense, dropout, residual, LayerNorm."""

        def __init__(self, s: BertShape, width: int, prefix: str = "output.") -> None:
            super().__init__(prefix=prefix)
            with self.name_scope():
                self.dense = L.dense(s, width, s.hidden_size, "dense")
                self.LayerNorm = L.LayerNorm(s)
                self.dropout = nn.Dropout(s.dropout)

        def hybrid_forward(self, F: Any, x: Any, residual: Any) -> Any:
            return self.LayerNorm(self.dropout(self.dense(x)) + residual)

    class Attention(Block):  # type: ignore[misc]
        def __init__(self, s: BertShape, prefix: str = "attention.") -> None:
            super().__init__(prefix=prefix)
            with self.name_scope():
                self.self = SelfAttention(s)
                self.output = Residual(s, s.hidden_size)

        def hybrid_forward(self, F: Any, x: Any, additive_mask: Any) -> Any:
            return self.output(self.self(x, additive_mask), x)

    return SimpleNamespace(Attention=Attention, Residual=Residual)


@functools.cache
def _encoder_classes() -> SimpleNamespace:
    """BertEncoder: its layers of attention, intermediate and output."""
    from mxnet.gluon import HybridBlock, nn

    Block: Any = HybridBlock
    L, parts = _layers(), _attention_classes()

    class Intermediate(Block):  # type: ignore[misc]
        """BertIntermediate: its Dense is named ``dense``; exact (erf) GELU."""

        def __init__(self, s: BertShape, prefix: str = "intermediate.") -> None:
            super().__init__(prefix=prefix)
            with self.name_scope():
                self.dense = L.dense(s, s.hidden_size, s.intermediate_size, "dense")

        def hybrid_forward(self, F: Any, x: Any) -> Any:
            return F.LeakyReLU(self.dense(x), act_type="gelu")

    class Layer(Block):  # type: ignore[misc]
        def __init__(self, s: BertShape, prefix: str) -> None:
            super().__init__(prefix=prefix)
            with self.name_scope():
                self.attention = parts.Attention(s)
                self.intermediate = Intermediate(s)
                self.output = parts.Residual(s, s.intermediate_size)

        def hybrid_forward(self, F: Any, x: Any, additive_mask: Any) -> Any:
            x = self.attention(x, additive_mask)
            return self.output(self.intermediate(x), x)

    class Encoder(Block):  # type: ignore[misc]
        def __init__(self, s: BertShape, prefix: str = "encoder.") -> None:
            super().__init__(prefix=prefix)
            with self.name_scope():
                self.layer = nn.HybridSequential(prefix="layer.")  # a list: children 0, 1...
                with self.layer.name_scope():
                    for i in range(s.num_layers):
                        self.layer.add(Layer(s, prefix=f"{i}."))

        def hybrid_forward(self, F: Any, x: Any, attention_mask: Any) -> Any:
            # [B, S] of 1 (attend) / 0 (masked) -> added to the [B, heads, S, S] scores.
            keep = F.expand_dims(F.expand_dims(attention_mask, 1), 1)
            additive_mask = (1.0 - keep) * MASKED_SCORE
            for i in range(len(self.layer)):
                x = self.layer[i](x, additive_mask)
            return x

    return SimpleNamespace(Encoder=Encoder, Intermediate=Intermediate)


@functools.cache
def _head_classes() -> SimpleNamespace:
    """BertPreTrainingHeads (the masked-LM head, the next-sentence classifier) and the pooler
    that the classifier reads (which is BertModel's)."""
    from mxnet.gluon import HybridBlock

    Block: Any = HybridBlock
    L = _layers()

    class Transform(Block):  # type: ignore[misc]
        def __init__(self, s: BertShape, prefix: str = "transform.") -> None:
            super().__init__(prefix=prefix)
            with self.name_scope():
                self.dense = L.dense(s, s.hidden_size, s.hidden_size, "dense")
                self.LayerNorm = L.LayerNorm(s)

        def hybrid_forward(self, F: Any, x: Any) -> Any:
            return self.LayerNorm(F.LeakyReLU(self.dense(x), act_type="gelu"))

    class Pooler(Block):  # type: ignore[misc]
        def __init__(self, s: BertShape, prefix: str = "pooler.") -> None:
            super().__init__(prefix=prefix)
            with self.name_scope():
                self.dense = L.dense(s, s.hidden_size, s.hidden_size, "dense")

        def hybrid_forward(self, F: Any, x: Any) -> Any:
            first = F.reshape(F.slice_axis(x, axis=1, begin=0, end=1), shape=(0, -1))
            return F.tanh(self.dense(first))

    class Predictions(Block):  # type: ignore[misc]
        """The masked-LM head; its decoder weight is the word embeddings, passed in."""

        def __init__(self, s: BertShape, prefix: str = "predictions.") -> None:
            super().__init__(prefix=prefix)
            self.vocab = s.vocab_size
            self.bias = self.params.get("bias", shape=(s.vocab_size,), init="zeros")
            with self.name_scope():
                self.transform = Transform(s)

        def hybrid_forward(self, F: Any, x: Any, decoder_weight: Any, bias: Any) -> Any:
            return F.FullyConnected(self.transform(x), decoder_weight, bias,
                                    num_hidden=self.vocab, flatten=False)

    def heads(s: BertShape) -> Any:
        """BertPreTrainingHeads, which is called by its parts only: a block holding them."""
        cls = Block(prefix="cls.")
        with cls.name_scope():
            cls.predictions = Predictions(s)
            cls.seq_relationship = L.dense(s, s.hidden_size, 2, "seq_relationship")
        return cls

    return SimpleNamespace(Pooler=Pooler, heads=heads)


@functools.cache
def _model_classes() -> SimpleNamespace:
    """The embeddings, BertModel, and BertForPreTraining with its heads."""
    import mxnet as mx
    from mxnet.gluon import HybridBlock, nn

    Block: Any = HybridBlock
    L = _layers()

    class Embeddings(Block):  # type: ignore[misc]
        def __init__(self, s: BertShape, prefix: str = "embeddings.") -> None:
            super().__init__(prefix=prefix)
            with self.name_scope():
                self.word_embeddings = L.Embedding(s, s.vocab_size, "word_embeddings", True)
                self.position_embeddings = L.Embedding(s, s.max_positions, "position_embeddings")
                self.token_type_embeddings = L.Embedding(s, s.type_vocab_size,
                                                         "token_type_embeddings")
                self.LayerNorm = L.LayerNorm(s)
                self.dropout = nn.Dropout(s.dropout)

        def hybrid_forward(self, F: Any, input_ids: Any, token_type_ids: Any) -> Any:
            positions = self.position_embeddings(F.contrib.arange_like(input_ids, axis=1))
            x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
            return self.dropout(self.LayerNorm(F.broadcast_add(x, F.expand_dims(positions, 0))))

    class BertModel(Block):  # type: ignore[misc]
        def __init__(self, s: BertShape, prefix: str = "bert.") -> None:
            super().__init__(prefix=prefix)
            with self.name_scope():
                self.embeddings = Embeddings(s)
                self.encoder = _encoder_classes().Encoder(s)
                self.pooler = _head_classes().Pooler(s)

        def hybrid_forward(self, F: Any, input_ids: Any, token_type_ids: Any,
                           attention_mask: Any) -> Any:
            hidden = self.encoder(self.embeddings(input_ids, token_type_ids), attention_mask)
            return hidden, self.pooler(hidden)

    class BertForPreTraining(Block):  # type: ignore[misc]
        def __init__(self, s: BertShape, prefix: str = "") -> None:
            super().__init__(prefix=prefix)
            with self.name_scope():
                self.bert = BertModel(s)
                self.cls = _head_classes().heads(s)

        def hybrid_forward(self, F: Any, input_ids: Any, token_type_ids: Any,
                           attention_mask: Any, masked_positions: Any) -> Any:
            hidden, pooled = self.bert(input_ids, token_type_ids, attention_mask)
            rows = F.broadcast_like(  # [B, P]: each position's sequence
                F.expand_dims(F.contrib.arange_like(masked_positions, axis=0), 1),
                masked_positions)
            masked = F.gather_nd(hidden, F.stack(rows, masked_positions))  # [B, P, H]
            # The tied decoder: the word embeddings' own parameter, as Gluon hands a block
            # its own (a symbol when hybridized, the array of this context when eager).
            table = self.bert.embeddings.word_embeddings.weight
            weight = table.var() if F is mx.sym else table.data(input_ids.context)
            return self.cls.predictions(masked, weight), self.cls.seq_relationship(pooled)

    return SimpleNamespace(BertForPreTraining=BertForPreTraining)
