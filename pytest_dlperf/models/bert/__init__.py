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

torch uses ``transformers``' ``BertForPreTraining`` built from its config (nothing downloaded;
``torch``); TensorFlow, OneFlow, PaddlePaddle, MindSpore, MXNet and JAX build the same network from
their own layers, under torch's parameter names, each in its module here (``tensorflow``,
``oneflow``, ``paddle``, ``mindspore``, ``mxnet``, ``jax``). This module holds the workload alone,
which the pytest side imports; a framework's module is imported by its ranks only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.workload import AdamW, Workload

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
        "torch": "pytest_dlperf.models.bert.torch:recipe",
        "tensorflow": "pytest_dlperf.models.bert.tensorflow:recipe",
        "oneflow": "pytest_dlperf.models.bert.oneflow:recipe",
        "paddle": "pytest_dlperf.models.bert.paddle:recipe",
        "mindspore": "pytest_dlperf.models.bert.mindspore:recipe",
        "mxnet": "pytest_dlperf.models.bert.mxnet:recipe",
        "jax": "pytest_dlperf.models.bert.jax:recipe",
    },
)

