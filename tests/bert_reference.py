"""torch's BERT as the reference the other frameworks' BERTs are checked against: its weights by
parameter name, one batch of inputs and what the model computes from them (eval mode: no
dropout), written to an ``.npz`` by a torch subprocess (TensorFlow and torch do not share a
process safely; OneFlow's interpreter has no torch).

Arrays in the file: ``param/<torch name>`` (torch layout), ``input_ids``, ``token_type_ids``,
``attention_mask``, ``masked_positions``, ``mlm_logits``, ``nsp_logits``, and ``loss`` for
``mlm_labels`` / ``nsp_labels`` under the recipe's loss.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from pytest_dlperf.models.bert import BertShape

REPO = Path(__file__).resolve().parents[1]

# Small enough for a test, every part of BERT-base present (2 layers, several heads).
TINY = BertShape(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                 max_positions=40)

_WRITE = """
import json, sys
import numpy as np
import torch
from pytest_dlperf.models.bert import BertShape
from pytest_dlperf.models.bert.torch import torch_model
from pytest_dlperf.core.workload import BuildContext
shape = BertShape(**json.loads(sys.argv[2]))
batch, seq, predictions = 3, 16, 4
torch.manual_seed(0)
model = torch_model(shape).eval()
g = torch.Generator().manual_seed(1)
input_ids = torch.randint(0, shape.vocab_size, (batch, seq), generator=g)
token_type_ids = torch.randint(0, shape.type_vocab_size, (batch, seq), generator=g)
# Not all ones: the mask must reach the attention scores in every framework.
attention_mask = torch.ones(batch, seq, dtype=torch.long)
attention_mask[1, 12:] = 0
positions = torch.rand(batch, seq, generator=g).argsort(dim=1)[:, :predictions].sort(dim=1).values
mlm_labels = torch.randint(0, shape.vocab_size, (batch, predictions), generator=g)
nsp_labels = torch.randint(0, 2, (batch,), generator=g)
with torch.no_grad():
    mlm_logits, nsp_logits = model(input_ids, token_type_ids, attention_mask, positions)
    f = torch.nn.functional
    loss = (f.cross_entropy(mlm_logits.reshape(-1, shape.vocab_size), mlm_labels.reshape(-1))
            + f.cross_entropy(nsp_logits, nsp_labels))
arrays = {f"param/{n}": p.detach().numpy() for n, p in model.named_parameters()}
arrays.update(input_ids=input_ids.numpy(), token_type_ids=token_type_ids.numpy(),
              attention_mask=attention_mask.numpy(), masked_positions=positions.numpy(),
              mlm_labels=mlm_labels.numpy(), nsp_labels=nsp_labels.numpy(),
              mlm_logits=mlm_logits.numpy(), nsp_logits=nsp_logits.numpy(), loss=loss.numpy())
np.savez(sys.argv[1], **arrays)
"""


def write_reference(path: Path, shape: BertShape = TINY) -> Path:
    """Write torch's reference for ``shape`` to ``path`` (an ``.npz``) and return it."""
    done = subprocess.run(
        [sys.executable, "-c", _WRITE, str(path), json.dumps(dataclasses.asdict(shape))],
        capture_output=True, text=True, timeout=300, cwd=REPO, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    return path
