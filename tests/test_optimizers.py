"""torch's own optimizer quirks. That the optimizer each adapter builds is the workload's
(the global gradient norm clipped, AdamW's decay kept off 1-D parameters, SGD's momentum carrying
the coupled decay) is a contract of every framework: tests/test_conformance.py checks it."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from snippets import run_snippet

SKIPPED_THEN_REAL = """
import json, math, torch
from pytest_dlperf.core.spec import OptimizerSpec
from pytest_dlperf.frameworks.torch import make_optimizer

def after_a_skipped_then_a_real_step(fused):
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(4096))
    optimizer = make_optimizer(torch, [param], OptimizerSpec(lr=0.1, momentum=0.9), fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    for grad in (torch.full_like(param, math.inf), torch.randn(4096)):
        scaler.scale(torch.ones(()))  # the scale exists before step, as after a backward
        param.grad = grad * scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
    return param.detach().tolist()

print(json.dumps([after_a_skipped_then_a_real_step(fused) for fused in (True, False)]))
"""


def test_a_skipped_first_fused_sgd_step_leaves_no_momentum_behind() -> None:
    """GradScaler skips a step whose scaled gradients overflowed, as the first fp16 steps at
    the initial scale do. torch's fused SGD allocates its momentum buffers uninitialized on its
    first step and leaves them so when the step is skipped; the next step then adds whatever
    the memory held (on an H200 it was NaN: ResNet-50's AMP case diverged). The adapter's fused
    SGD must step as the unfused one does after the same skip. (In a process of its own: torch
    compiles nothing here, but its optimizer imports dynamo, which crashes beside TensorFlow.)"""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    fused, unfused = run_snippet(sys.executable, SKIPPED_THEN_REAL)  # type: ignore[misc]
    assert fused == unfused
