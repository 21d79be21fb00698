"""PaddlePaddle: its ResNet-50 is torchvision's, a data loader feeds its steps, and its store
takes the launcher's spare port. The contract every adapter meets (two ranks average, the window
against a wall clock, an own model on two nodes) is tests/test_conformance.py's.

Paddle runs in subprocesses only (``run_snippet``, pytester): importing Paddle and TensorFlow
in one process segfaults here (tensorflow-cpu 2.21 + paddlepaddle 3.3.1), and this suite's
process imports TensorFlow in other modules.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
from snippets import run_snippet

if importlib.util.find_spec("paddle") is None:
    pytest.skip("PaddlePaddle is not installed (pip install 'pytest-dlperf[paddle]')",
                allow_module_level=True)

PYTHON = sys.executable


def test_paddle_vision_resnet50_is_torchvisions_layer_for_layer() -> None:
    torchvision = pytest.importorskip("torchvision")
    out = run_snippet(PYTHON, """
import json, paddle
from pytest_dlperf.models.resnet50.paddle import torch_named_shapes as paddle_torch_named_shapes
model = paddle.vision.models.resnet50(num_classes=1000)
block = model.layer2[0]
bn = model.bn1
print(json.dumps({"shapes": paddle_torch_named_shapes(model),
                  "strides": [block.conv1._stride, block.conv2._stride, block.conv3._stride],
                  "bn": [bn._momentum, bn._epsilon]}))
""")
    assert isinstance(out, dict)
    shapes = {name: tuple(shape) for name, shape in out["shapes"].items()}
    torch_shapes = {n: tuple(p.shape) for n, p in torchvision.models.resnet50().named_parameters()}
    assert list(shapes) == list(torch_shapes)  # the same 161 names, in torch's order
    assert {n: (s, torch_shapes[n]) for n, s in shapes.items() if torch_shapes[n] != s} == {}
    assert sum(math.prod(shape) for shape in shapes.values()) == 25_557_032
    # v1.5: a stage's first block strides on its 3x3 conv, not on its first 1x1.
    assert out["strides"] == [[1, 1], [2, 2], [1, 1]]
    # Paddle's BatchNorm keeps momentum x the old statistics: 0.9 is torch's momentum 0.1.
    assert out["bn"] == [pytest.approx(0.9), pytest.approx(1e-5)]


def test_torchvisions_weights_give_torchvisions_logits(tmp_path: Path) -> None:
    """Eval mode (BatchNorm on its running statistics, loaded too) on one 64x64 image: the same
    function, not only the same shapes. Random running statistics make the logits large
    (130 at most, here); a faithful model is within 1.4e-4 of them (1.1e-6 relative), and the
    tolerance, 1e-5 relative, sits far below what a changed layer costs: epsilon 1e-3 in the
    last BatchNorm alone moved the logits by 0.036 (measured 2026-11-25)."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    import numpy as np

    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval()
    with torch.no_grad():  # running statistics that are not BatchNorm's initial 0 and 1
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
        image = torch.randn(1, 3, 64, 64)
        logits = model(image)
    arrays = {name: value.numpy() for name, value in model.state_dict().items()
              if not name.endswith("num_batches_tracked")}
    np.savez(tmp_path / "ref.npz", image=image.numpy(), logits=logits.numpy(),
             **{f"param/{n}": a for n, a in arrays.items()})
    out = run_snippet(PYTHON, f"""
import json
import numpy as np
import paddle
ref = np.load({str(tmp_path / "ref.npz")!r})
model = paddle.vision.models.resnet50(num_classes=1000)
model.eval()
renames = {{"running_mean": "_mean", "running_var": "_variance"}}
state = {{}}
for key in ref.files:
    if key.startswith("param/"):
        name = key[len("param/"):]
        head, _, tail = name.rpartition(".")
        value = ref[key]
        state[head + "." + renames.get(tail, tail)] = value.T if name == "fc.weight" else value
model.set_state_dict(state)
assert sorted(state) == sorted(model.state_dict()), set(state) ^ set(model.state_dict())
with paddle.no_grad():
    logits = model(paddle.to_tensor(ref["image"])).numpy()
scale = float(np.abs(ref["logits"]).max())
print(json.dumps({{"error": float(np.abs(logits - ref["logits"]).max()), "scale": scale}}))
""")
    assert isinstance(out, dict)
    assert out["scale"] > 0.1  # logits worth comparing
    assert out["error"] < 1e-5 * out["scale"], out


def test_a_data_loader_feeds_the_steps_and_starts_over_at_its_end() -> None:
    out = run_snippet(PYTHON, """
import json, sys
sys.path.insert(0, "tests")
from pytest_dlperf import SGD, Workload
from pytest_dlperf.frameworks import DistEnv, load
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.core.recipes import load_recipe
workload = Workload("loader", recipes={"paddle": "optimizer_recipes:paddle_loader"},
                    batch_size={"cpu": 4}, optimizer=SGD(lr_per_256=1.0))
spec = spec_for("paddle", workload, protocol=QUICK, device_type="cpu")
trainer = load("paddle").build_trainer(spec, DistEnv(0, 1, 0, 1, 0), load_recipe(spec.recipe))
losses = []
for _ in range(7):  # the loader holds 3 batches: two restarts
    trainer.step()
    losses.append(trainer.loss())
print(json.dumps(losses))
""")
    assert isinstance(out, list) and len(out) == 7
    assert all(math.isfinite(loss) and loss > 0 for loss in out)
    assert len(set(out)) > 1  # different batches (and a model that learns)


def test_paddles_variables_name_the_rank_its_gpu_and_the_backend() -> None:
    """Where Paddle's store goes is tests/test_conformance.py's (as every framework's store)."""
    from pytest_dlperf.frameworks import DistEnv
    from pytest_dlperf.frameworks.paddle import prepare_environ

    environ = {"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500",
               "DLPERF_FRAMEWORK_PORT": "31000", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    prepare_environ(environ, DistEnv(1, 2, 0, 1, 1), cuda=True)
    assert environ["PADDLE_MASTER"] == "10.1.2.3:31000"  # the host as given, not resolved
    assert (environ["PADDLE_TRAINER_ID"], environ["PADDLE_TRAINERS_NUM"]) == ("1", "2")
    assert environ["PADDLE_DISTRI_BACKEND"] == "nccl"
    assert environ["FLAGS_selected_gpus"] == "0"  # the local rank's GPU
    assert environ["PADDLE_CURRENT_ENDPOINT"] in environ["PADDLE_TRAINER_ENDPOINTS"].split(",")
    bare = {"MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    prepare_environ(bare, DistEnv(0, 2, 0, 2, 0), cuda=False)
    assert bare["PADDLE_MASTER"] == "h:29500" and bare["PADDLE_DISTRI_BACKEND"] == "gloo"
