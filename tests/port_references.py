"""torch's side of the port contract (tests/ports.py): what the other frameworks' ports are
checked against, each made once a process and shared by the modules that run there.

torch's BERT: its weights by parameter name, one batch of inputs and what the model computes
from them (eval mode: no dropout), written to an ``.npz`` by a torch subprocess (TensorFlow and
torch do not share a process safely; OneFlow's interpreter has no torch).

Arrays in the file: ``param/<torch name>`` (torch layout), ``input_ids``, ``token_type_ids``,
``attention_mask``, ``masked_positions``, ``mlm_logits``, ``nsp_logits``, and ``loss`` for
``mlm_labels`` / ``nsp_labels`` under the recipe's loss; torch's GELU (``gelu``) of ``gelu_x``.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import shutil
import subprocess
import sys
import tempfile
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
# torch's GELU where the exact and tanh forms differ most (|x| ~ 2: 5e-4), which TINY's small
# activations never reach.
arrays["gelu_x"] = np.linspace(-6, 6, 1001, dtype="float32")
arrays["gelu"] = torch.nn.functional.gelu(torch.from_numpy(arrays["gelu_x"])).numpy()
np.savez(sys.argv[1], **arrays)
"""


def write_reference(path: Path, shape: BertShape = TINY) -> Path:
    """Write torch's reference for ``shape`` to ``path`` (an ``.npz``) and return it."""
    done = subprocess.run(
        [sys.executable, "-c", _WRITE, str(path), json.dumps(dataclasses.asdict(shape))],
        capture_output=True, text=True, timeout=300, cwd=REPO, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    return path


@functools.cache
def tiny_reference() -> Path:
    """torch's reference for TINY, written once a process (a torch subprocess: ~7 s) to a
    folder of its own, removed at exit. The arrays are the same every time: seeded."""
    folder = Path(tempfile.mkdtemp(prefix="dlperf-bert-reference-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return write_reference(folder / "ref.npz")


def resnet50_reference(path: Path) -> None:
    """torchvision's ResNet-50 from a seed, with running statistics that are not BatchNorm's
    initial 0 and 1, its weights, two 64x64 images and what it makes of them (``path``, an
    .npz): eval logits; training-mode logits, the gradients of their dot product with a random
    ``head``, and the running statistics after, as torch moves them and as MXNet would (with
    the batch's biased variance)."""
    import numpy as np
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval()
    norms = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)}
    with torch.no_grad():
        for module in norms.values():
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
        images, head = torch.randn(2, 3, 64, 64), torch.randn(2, 1000)
        arrays = {name: value.numpy().copy() for name, value in model.state_dict().items()
                  if not name.endswith("num_batches_tracked")}
        logits = model(images)
    biased = {}
    for name, module in norms.items():  # what MXNet's rule makes of each BatchNorm's input
        def expect(module: torch.nn.Module, args: tuple, name: str = name) -> None:
            var = args[0].detach().var(dim=(0, 2, 3), unbiased=False)
            biased[f"{name}.running_var"] = (0.9 * module.running_var + 0.1 * var).numpy()
        module.register_forward_pre_hook(expect)
    train_logits = model.train()(images)
    train_logits.backward(head)
    np.savez(path, images=images.numpy(), logits=logits.numpy(), head=head.numpy(),
             train_logits=train_logits.detach().numpy(),
             **{f"param/{n}": a for n, a in arrays.items()},
             **{f"grad/{n}": p.grad.numpy() for n, p in model.named_parameters()},
             **{f"after/{n}": a.numpy() for n, a in model.state_dict().items()
                if n.endswith(("running_mean", "running_var"))},
             **{f"biased/{n}": a for n, a in biased.items()})


def gpt_reference(path: Path) -> None:
    """torch's GPT of the CPU sizes, its weights drawn wider than GPT-2's initialization (which
    leaves biases and LayerNorm at 0 and 1 and the MLP's inputs where every GELU is linear): a
    batch of two full sequences, the logits, and the loss of torch's recipe for random
    targets, written to ``path`` (an .npz) with the weights as ``param/<name>``."""
    import numpy as np
    import torch

    from pytest_dlperf.core.workload import BuildContext
    from pytest_dlperf.models import gpt
    from pytest_dlperf.models.gpt import torch as gpt_torch

    small = gpt.GPTShape.of(gpt.CPU_SIZES)
    torch.manual_seed(0)
    model = gpt_torch.build(small)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(std=0.5 if "embeddings" in name else 0.1)
            else:  # LayerNorm's weights about one, every bias about zero
                p.normal_(mean=0.0 if name.endswith("bias") else 1.0, std=0.1)
        tokens = torch.randint(0, small.vocab_size, (2, small.seq_length))
        targets = torch.randint(0, small.vocab_size, (2, small.seq_length))
        logits = model(tokens)
        context = BuildContext("torch", "cpu", "meta", 2, dict(gpt.CPU_SIZES), "fp32",
                               "float32", False, 0, 0, 1, 0)
        recipe_loss = gpt_torch.recipe(context).loss
        assert recipe_loss is not None
        loss = recipe_loss(logits, targets)
    np.savez(path, tokens=tokens.numpy(), targets=targets.numpy(), logits=logits.numpy(),
             loss=loss.numpy(), **{f"param/{n}": a.numpy() for n, a in model.state_dict().items()})


def wide_deep_reference(path: Path) -> None:
    """torch's Wide & Deep at SMALL's sizes (a CPU case's, vocab 5,000, hidden 64) from a
    seed, in eval mode (no dropout), a batch of 64 of its power-law ids (and the uniforms they
    were drawn from, ``u/wide`` and ``u/deep``) and what it makes of them: logits, and the loss
    for random clicks, written to ``path`` (an .npz) with the weights as ``param/<name>``."""
    import numpy as np
    import torch

    from pytest_dlperf.models import wide_deep
    from pytest_dlperf.models.wide_deep import torch as wide_deep_torch

    shape = wide_deep.WideDeepShape.of({**wide_deep.WORKLOAD.sizes_for("cpu", "fp32"),
                                        "vocab": 5_000, "hidden_size": 64})
    torch.manual_seed(0)
    reference = wide_deep_torch.build(shape).eval()
    generator = torch.Generator().manual_seed(1)
    batch = 64
    dense = torch.rand(batch, shape.dense_fields, generator=generator)
    ids = {}
    for name, slots, first in (("wide", shape.wide_slots, shape.deep_slots),
                               ("deep", shape.deep_slots, 0)):
        state = generator.get_state()
        ids[name] = wide_deep_torch.power_law_ids(shape, batch, slots, first, generator, "cpu")
        generator.set_state(state)  # the uniforms those ids came from
        ids[f"u/{name}"] = torch.rand(batch, slots, generator=generator, dtype=torch.float64)
    clicks = torch.randint(0, 2, (batch,), generator=generator).float()
    with torch.no_grad():
        logits = reference(dense, ids["wide"], ids["deep"])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, clicks)
    np.savez(path, dense=dense.numpy(), clicks=clicks.numpy(), logits=logits.numpy(),
             loss=loss.numpy(), **{k: v.numpy() for k, v in ids.items()},
             **{f"param/{n}": p.detach().numpy() for n, p in reference.named_parameters()})


def insightface_reference(path: Path) -> None:
    """torch's InsightFace models, each that a port checks (tests/port_insightface.py's
    ``CHECKED``: a backbone, a margin, a class count) with the faces it is checked on, as
    ``<key>/...``: its weights and BatchNorm's statistics before the step (``param/<name>``,
    ``buffer/<name>``), two 112 x 112 faces and their labels, the loss in training mode and the
    head's gradient; written to ``path`` (an .npz)."""
    import numpy as np
    import torch
    from port_insightface import CHECKED, key, sizes

    from pytest_dlperf.models.insightface import FaceShape
    from pytest_dlperf.models.insightface.torch import build

    out: dict[str, object] = {}
    for framework, checked in CHECKED.items():
        for variant, classes in checked:
            if framework == "oneflow":  # the model from seed 3, the faces from their own
                generator = torch.Generator().manual_seed(5)
                images = torch.randn(2, 3, 112, 112, generator=generator)
                labels = torch.randint(0, classes, (2,), generator=generator)
                torch.manual_seed(3)
                model = build(FaceShape.of(sizes(variant, classes)))
            else:  # the model from seed 0, then the faces
                torch.manual_seed(0)
                model = build(FaceShape.of(sizes(variant, classes)))
                images, labels = torch.randn(2, 3, 112, 112), torch.tensor([3, 7])
            name = key(variant, classes)
            out.update({f"{name}/param/{n}": p.detach().numpy().copy()
                        for n, p in model.named_parameters()})
            out.update({f"{name}/buffer/{n}": b.numpy().copy()
                        for n, b in model.named_buffers()
                        if not n.endswith("num_batches_tracked")})
            loss = model(images, labels)
            loss.backward()
            assert model.head.weight.grad is not None
            out.update({f"{name}/images": images.numpy(), f"{name}/labels": labels.numpy(),
                        f"{name}/loss": loss.detach().numpy(),
                        f"{name}/head_grad": model.head.weight.grad.numpy()})
    np.savez(path, **out)


@functools.cache
def torch_reference(model: str) -> Path:
    """torch's reference for ``model``'s ports, written once a process to a folder of its own,
    removed at exit: BERT's for TINY (a torch subprocess: ~7 s), the others' in this process."""
    if model == "bert":
        return tiny_reference()
    folder = Path(tempfile.mkdtemp(prefix=f"dlperf-{model}-reference-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    {"resnet50": resnet50_reference, "gpt": gpt_reference,
     "wide_deep": wide_deep_reference, "insightface": insightface_reference}[model](
        folder / "ref.npz")
    return folder / "ref.npz"


@functools.cache
def _shapes(model: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    if model == "bert":
        from pytest_dlperf.models.bert.torch import torch_named_shapes

        return tuple(torch_named_shapes().items())
    # Built on the CPU, not the meta device: torch's meta tensors, first used after
    # TensorFlow's import (by another module in this process), crash it.
    if model == "wide_deep":  # a CPU case's sizes (vocab 200k)
        from pytest_dlperf.models import wide_deep
        from pytest_dlperf.models.wide_deep import torch as wide_deep_torch

        return tuple((n, tuple(p.shape)) for n, p in wide_deep_torch.build(
            wide_deep.WideDeepShape.of(wide_deep.WORKLOAD.sizes_for("cpu", "fp32"))
        ).named_parameters())
    if model == "insightface":  # MobileFaceNet with ArcFace at 100 classes
        from port_insightface import TABLE, sizes

        from pytest_dlperf.models.insightface import FaceShape
        from pytest_dlperf.models.insightface.torch import build as build_face

        return tuple((n, tuple(p.shape)) for n, p in build_face(
            FaceShape.of(sizes(*TABLE))).named_parameters())
    if model == "gpt":  # the CPU sizes
        from pytest_dlperf.models import gpt
        from pytest_dlperf.models.gpt import torch as gpt_torch

        return tuple((n, tuple(p.shape)) for n, p in gpt_torch.build(
            gpt.GPTShape.of(gpt.CPU_SIZES)).named_parameters())
    import torchvision

    return tuple((n, tuple(p.shape)) for n, p in torchvision.models.resnet50().named_parameters())


def torch_shapes(model: str) -> dict[str, tuple[int, ...]]:
    """torch's parameters of ``model`` (``bert``: BERT-base; ``resnet50``: torchvision's;
    ``gpt``: the CPU sizes; ``wide_deep``: a CPU case's; ``insightface``: MobileFaceNet with
    ArcFace at 100 classes) by
    name and shape, in its order (tied weights once), each built once a process (BERT-base:
    5 s of CPU), not once a test."""
    return dict(_shapes(model))


def bert_shapes() -> dict[str, tuple[int, ...]]:
    """torch's BERT-base parameters by name and shape, in its order (the tied decoder once)."""
    return torch_shapes("bert")
