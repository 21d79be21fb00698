"""BERT-base pretraining, DLPerf's second model: its recipe per framework.

The model is the same in every framework: BERT-base (12 layers, hidden 768, 12 heads,
intermediate 3072 with exact GELU, vocab 30522, 512 positions, 2 token types, LayerNorm eps
1e-12, dropout 0.1, weights drawn from N(0, 0.02)) with both pretraining heads: masked-LM
(dense + GELU + LayerNorm, then a decoder tied to the word embeddings with its own bias) and
next-sentence prediction (pooler + 2-way classifier). 110,106,428 trainable parameters (the tied
decoder counted once), measured from ``transformers``' ``BertForPreTraining``: torch's model,
and the reference the other two are checked against name by name.

The masked-LM head runs on the masked positions only (gathered from the encoder's output before
the head), as Google's BERT and NVIDIA's pretraining scripts do, which DLPerf ran: 20 positions
of a 128-token sequence. The loss is masked-LM cross-entropy plus next-sentence cross-entropy.

The algorithm is DLPerf's: Adam with decoupled weight decay 0.01 (not on biases and LayerNorm),
epsilon 1e-6, global-norm gradient clipping at 1.0 (leaving it out makes a framework look
faster), a fixed learning rate of 1e-4. Inputs are synthetic and resident on the device: random
token and segment ids, an all-ones attention mask, random masked positions; the masked-LM and
next-sentence labels are drawn afresh every step.

GPU sizes are DLPerf's: sequence 128, 20 masked positions, batch 32 FP32 / 64 AMP per device.
The CPU keeps the model and the algorithm but a sequence of 32 with 5 masked positions (BERT's
15%) and a batch of 2, so that a quick case takes about as long as ResNet-50's.

torch uses ``transformers``' ``BertForPreTraining`` built from its config (nothing downloaded);
TensorFlow (``bert_keras``), OneFlow (``bert_oneflow``), PaddlePaddle (``bert_paddle``), MindSpore
(``bert_mindspore``) and MXNet (``bert_mxnet``) build the same network from their own layers,
under torch's parameter names. Frameworks are imported inside the recipes only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.workload import AdamW, BuildContext, Parts, Workload, WorkloadError

PARAMETERS = 110_106_428  # BertForPreTraining(BertConfig()): what every framework's model has


@dataclass(frozen=True)
class BertShape:
    """BERT's architecture: BERT-base unless changed (tests build tiny ones)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1
    initializer_range: float = 0.02


BERT_BASE = BertShape()

WORKLOAD = Workload(
    name="bert_base",
    unit="sentences",
    batch_size={"cuda": 32, "cuda/amp": 64, "cpu": 2},
    sizes={"seq_length": {"cuda": 128, "cpu": 32},
           "max_predictions_per_seq": {"cuda": 20, "cpu": 5}},
    optimizer=AdamW(lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, clip_norm=1.0),
    recipes={
        "torch": "pytest_dlperf.models.bert:torch_recipe",
        "tensorflow": "pytest_dlperf.models.bert_keras:recipe",
        "oneflow": "pytest_dlperf.models.bert_oneflow:recipe",
        "paddle": "pytest_dlperf.models.bert_paddle:recipe",
        "mindspore": "pytest_dlperf.models.bert_mindspore:recipe",
        "mxnet": "pytest_dlperf.models.bert_mxnet:recipe",
        "jax": "pytest_dlperf.models.bert_jax:recipe",
    },
)


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


def torch_recipe(ctx: BuildContext) -> Parts:
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
