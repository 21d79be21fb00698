"""BERT-base pretraining in OneFlow: torch's ``BertForPreTraining`` rebuilt from ``oneflow.nn``.

OneFlow 0.9.0 has no BERT to borrow: flowvision has none, and LiBai's is Megatron's pre-LN
variant (a different model) with pinned dependencies. So the network is written here, module for
module as ``transformers`` writes it and under its parameter names, so that the alignment tests
compare it with torch's by name and shape and load torch's weights into it to compare outputs.
What it has to match, and why each is not OneFlow's default:

- exact (erf) GELU and LayerNorm eps 1e-12; Linear and Embedding weights from N(0, 0.02) with
  zero biases (OneFlow's own Linear initialization is Kaiming-uniform);
- the word embeddings' padding row (id 0) zero at start and given no gradient by the lookup
  (``padding_idx``), as in ``transformers``; the masked-LM decoder still trains it, since it is
  the same tensor;
- the decoder tied to the word embeddings: the head is handed the embedding matrix at each call
  instead of holding it, so the matrix is one parameter under one name (torch lists it once too);
- the attention mask added as ``(1 - mask) * -10000``: large enough that a masked key gets no
  weight, small enough for fp16. ``transformers`` adds float32's lowest value, which becomes
  ``-inf`` where nn.Graph's AMP casts it to fp16 (a row of masked keys then gives NaN);
- position embeddings read by slicing their table rather than looking up an ``arange``: a tensor
  created inside ``forward`` would need a placement and SBP of its own once nn.Graph makes the
  model global, and a slice of a broadcast parameter has them already. The masked positions are
  gathered along dim 1, which keeps the batch split (dim 0) of a data-parallel graph.

OneFlow is imported inside functions only: the pytest side imports this module and has no
OneFlow. The classes are defined once, on first use, by ``_modules``.
"""

from __future__ import annotations

import functools
import math
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
    import oneflow as flow

    model = _modules().BertForPreTraining(shape)
    init = flow.nn.init
    with flow.no_grad():
        for module in model.modules():
            if isinstance(module, (flow.nn.Linear, flow.nn.Embedding)):
                init.normal_(module.weight, mean=0.0, std=shape.initializer_range)
            if isinstance(module, flow.nn.Linear) and module.bias is not None:
                init.zeros_(module.bias)
            if isinstance(module, flow.nn.Embedding) and module.padding_idx is not None:
                module.weight[module.padding_idx] = 0.0
            if isinstance(module, flow.nn.LayerNorm):
                init.ones_(module.weight)
                init.zeros_(module.bias)
    return model


def recipe(ctx: BuildContext) -> Parts:
    """BERT-base on synthetic sentences resident on the device, labels drawn every step."""
    import oneflow as flow

    batch, seq = ctx.batch_size, int(ctx.sizes["seq_length"])
    predictions = int(ctx.sizes["max_predictions_per_seq"])
    vocab = BERT_BASE.vocab_size
    model = bert_pretraining()
    device = ctx.device
    input_ids = flow.randint(0, vocab, (batch, seq), device=device)
    token_type_ids = flow.randint(0, BERT_BASE.type_vocab_size, (batch, seq), device=device)
    attention_mask = flow.ones(batch, seq, dtype=flow.int64, device=device)
    # Distinct positions per sequence, in order, as BERT's data pipeline writes them (argsort
    # gives int32 in OneFlow; torch's are int64).
    positions = flow.rand(batch, seq, device=device).argsort(dim=1)[:, :predictions]
    positions = flow.sort(positions, dim=1).values.to(flow.int64)

    def fresh_labels() -> Any:
        return (flow.randint(0, vocab, (batch, predictions), device=device),
                flow.randint(0, 2, (batch,), device=device))

    return Parts(model=model, inputs=(input_ids, token_type_ids, attention_mask, positions),
                 targets=fresh_labels, loss=pretraining_loss)


def pretraining_loss(outputs: Any, targets: Any) -> Any:
    """Masked-LM plus next-sentence cross-entropy, both means; runs eager and in nn.Graph."""
    import oneflow.nn.functional as F

    mlm_logits, nsp_logits = outputs
    mlm, nsp = targets
    # In fp32 whatever the AMP dtype: a 30522-way softmax in fp16 loses the loss.
    vocab = mlm_logits.shape[-1]
    return (F.cross_entropy(mlm_logits.reshape(-1, vocab).float(), mlm.reshape(-1))
            + F.cross_entropy(nsp_logits.float(), nsp))


@functools.cache
def _modules() -> SimpleNamespace:
    """The model's classes, defined on first use (they derive from OneFlow's ``nn.Module``)."""
    import oneflow as flow
    import oneflow.nn.functional as F

    nn = flow.nn
    Module: Any = nn.Module

    class Embeddings(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.word_embeddings = nn.Embedding(s.vocab_size, s.hidden_size,
                                                padding_idx=PADDING_ID)
            self.position_embeddings = nn.Embedding(s.max_positions, s.hidden_size)
            self.token_type_embeddings = nn.Embedding(s.type_vocab_size, s.hidden_size)
            self.LayerNorm = nn.LayerNorm(s.hidden_size, eps=s.layer_norm_eps)
            self.dropout = nn.Dropout(s.dropout)

        def forward(self, input_ids: Any, token_type_ids: Any) -> Any:
            positions = self.position_embeddings.weight[:input_ids.shape[1]].unsqueeze(0)
            x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
            return self.dropout(self.LayerNorm(x + positions))

    class SelfAttention(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.heads, self.head_size = s.num_heads, s.hidden_size // s.num_heads
            self.query = nn.Linear(s.hidden_size, s.hidden_size)
            self.key = nn.Linear(s.hidden_size, s.hidden_size)
            self.value = nn.Linear(s.hidden_size, s.hidden_size)
            self.dropout = nn.Dropout(s.dropout)

        def split_heads(self, x: Any) -> Any:  # [B, S, H] -> [B, heads, S, head_size]
            batch, seq, _ = x.shape
            return x.reshape(batch, seq, self.heads, self.head_size).permute(0, 2, 1, 3)

        def forward(self, x: Any, additive_mask: Any) -> Any:
            q, k, v = (self.split_heads(f(x)) for f in (self.query, self.key, self.value))
            scores = flow.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
            probs = self.dropout(F.softmax(scores + additive_mask, dim=-1))
            context = flow.matmul(probs, v).permute(0, 2, 1, 3)
            return context.reshape(x.shape[0], x.shape[1], -1)

    class Residual(Module):  # type: ignore[misc]
        """BertSelfOutput and BertOutput: dense, dropout, residual, LayerNorm."""

        def __init__(self, s: BertShape, width: int) -> None:
            super().__init__()
            self.dense = nn.Linear(width, s.hidden_size)
            self.LayerNorm = nn.LayerNorm(s.hidden_size, eps=s.layer_norm_eps)
            self.dropout = nn.Dropout(s.dropout)

        def forward(self, x: Any, residual: Any) -> Any:
            return self.LayerNorm(self.dropout(self.dense(x)) + residual)

    class Attention(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.self = SelfAttention(s)
            self.output = Residual(s, s.hidden_size)

        def forward(self, x: Any, additive_mask: Any) -> Any:
            return self.output(self.self(x, additive_mask), x)

    class Dense(Module):  # type: ignore[misc]
        """BertIntermediate: its Linear is named ``dense``."""

        def __init__(self, width: int, out: int) -> None:
            super().__init__()
            self.dense = nn.Linear(width, out)

        def forward(self, x: Any) -> Any:
            return F.gelu(self.dense(x))

    class Layer(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.attention = Attention(s)
            self.intermediate = Dense(s.hidden_size, s.intermediate_size)
            self.output = Residual(s, s.intermediate_size)

        def forward(self, x: Any, additive_mask: Any) -> Any:
            x = self.attention(x, additive_mask)
            return self.output(self.intermediate(x), x)

    class Encoder(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.layer = nn.ModuleList([Layer(s) for _ in range(s.num_layers)])

        def forward(self, x: Any, attention_mask: Any) -> Any:
            # [B, S] of 1 (attend) / 0 (masked) -> added to the [B, heads, S, S] scores.
            keep = attention_mask.to(x.dtype).unsqueeze(1).unsqueeze(2)
            additive_mask = (1.0 - keep) * MASKED_SCORE
            for layer in self.layer:
                x = layer(x, additive_mask)
            return x

    class Pooler(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.dense = nn.Linear(s.hidden_size, s.hidden_size)

        def forward(self, x: Any) -> Any:
            return flow.tanh(self.dense(x[:, 0]))

    class BertModel(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.embeddings = Embeddings(s)
            self.encoder = Encoder(s)
            self.pooler = Pooler(s)

        def forward(self, input_ids: Any, token_type_ids: Any, attention_mask: Any) -> Any:
            hidden = self.encoder(self.embeddings(input_ids, token_type_ids), attention_mask)
            return hidden, self.pooler(hidden)

    class Transform(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.dense = nn.Linear(s.hidden_size, s.hidden_size)
            self.LayerNorm = nn.LayerNorm(s.hidden_size, eps=s.layer_norm_eps)

        def forward(self, x: Any) -> Any:
            return self.LayerNorm(F.gelu(self.dense(x)))

    class Predictions(Module):  # type: ignore[misc]
        """The masked-LM head; its decoder weight is the word embeddings, passed in."""

        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.bias = nn.Parameter(flow.zeros(s.vocab_size))
            self.transform = Transform(s)

        def forward(self, x: Any, decoder_weight: Any) -> Any:
            return F.linear(self.transform(x), decoder_weight, self.bias)

    class Heads(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.predictions = Predictions(s)
            self.seq_relationship = nn.Linear(s.hidden_size, 2)

    class BertForPreTraining(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape) -> None:
            super().__init__()
            self.bert = BertModel(s)
            self.cls = Heads(s)

        def forward(self, input_ids: Any, token_type_ids: Any, attention_mask: Any,
                    masked_positions: Any) -> Any:
            hidden, pooled = self.bert(input_ids, token_type_ids, attention_mask)
            index = masked_positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
            masked = flow.gather(hidden, 1, index)
            mlm = self.cls.predictions(masked, self.bert.embeddings.word_embeddings.weight)
            return mlm, self.cls.seq_relationship(pooled)

    return SimpleNamespace(BertForPreTraining=BertForPreTraining)
