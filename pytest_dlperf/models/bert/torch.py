"""BERT-base in torch: ``transformers``' ``BertForPreTraining`` from its config, its heads run on
the masked positions only; its parameters by name are the reference every other framework's BERT
is checked against (``torch_named_shapes``)."""

from __future__ import annotations

from typing import Any

from ...core.workload import BuildContext, Parts, WorkloadError
from . import BERT_BASE, BertShape


def torch_model(shape: BertShape = BERT_BASE) -> Any:
    """``transformers``' BertForPreTraining from its config, its heads run on the masked
    positions only. Parameter names are BertForPreTraining's (``bert.*``, ``cls.*``)."""
    import torch

    try:
        from transformers import BertConfig, BertForPreTraining
    except ImportError as exc:
        raise WorkloadError(
            f"BERT-base's torch model is transformers' BertForPreTraining, and transformers "
            f"cannot be imported here ({exc}); pip install 'pytest-dlperf[torch]' (or "
            "transformers) where the ranks run") from None

    config = BertConfig(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads,
        intermediate_size=shape.intermediate_size, hidden_act="gelu",
        max_position_embeddings=shape.max_positions, type_vocab_size=shape.type_vocab_size,
        layer_norm_eps=shape.layer_norm_eps, hidden_dropout_prob=shape.dropout,
        attention_probs_dropout_prob=shape.dropout, initializer_range=shape.initializer_range,
        tie_word_embeddings=True)
    pretraining = BertForPreTraining(config)

    class GatheredBertForPreTraining(torch.nn.Module):
        """BertForPreTraining whose heads see the masked positions only."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = pretraining.bert
            self.cls = pretraining.cls  # its decoder's weight is bert's word embeddings

        def forward(self, input_ids: Any, token_type_ids: Any, attention_mask: Any,
                    masked_positions: Any) -> Any:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids)
            hidden = out.last_hidden_state
            index = masked_positions.unsqueeze(-1).expand(-1, -1, hidden.size(-1))
            return self.cls(torch.gather(hidden, 1, index), out.pooler_output)

    return GatheredBertForPreTraining()


def recipe(ctx: BuildContext) -> Parts:
    import torch

    batch, seq = ctx.batch_size, int(ctx.sizes["seq_length"])
    predictions = int(ctx.sizes["max_predictions_per_seq"])
    vocab = BERT_BASE.vocab_size
    model = torch_model()
    device = ctx.device
    input_ids = torch.randint(0, vocab, (batch, seq), device=device)
    token_type_ids = torch.randint(0, BERT_BASE.type_vocab_size, (batch, seq), device=device)
    attention_mask = torch.ones(batch, seq, dtype=torch.long, device=device)
    # Distinct positions per sequence, in order, as BERT's data pipeline writes them.
    positions = torch.rand(batch, seq, device=device).argsort(dim=1)[:, :predictions]
    positions = positions.sort(dim=1).values
    mlm_labels = torch.zeros(batch, predictions, dtype=torch.long, device=device)
    nsp_labels = torch.zeros(batch, dtype=torch.long, device=device)

    def fresh_labels() -> Any:  # two tiny kernels, in place
        return (torch.randint(0, vocab, mlm_labels.shape, out=mlm_labels),
                torch.randint(0, 2, nsp_labels.shape, out=nsp_labels))

    def loss(outputs: Any, targets: Any) -> Any:
        mlm_logits, nsp_logits = outputs
        mlm, nsp = targets
        f = torch.nn.functional
        # In fp32 whatever the AMP dtype: a 30522-way softmax in fp16 loses the loss.
        return (f.cross_entropy(mlm_logits.reshape(-1, vocab).float(), mlm.reshape(-1))
                + f.cross_entropy(nsp_logits.float(), nsp))

    return Parts(model=model, inputs=(input_ids, token_type_ids, attention_mask, positions),
                 targets=fresh_labels, loss=loss)


def torch_named_shapes(shape: BertShape = BERT_BASE) -> dict[str, tuple[int, ...]]:
    """torch's trainable parameters by name (tied weights once): the alignment reference."""
    return {name: tuple(p.shape) for name, p in torch_model(shape).named_parameters()}
