"""What the adapters share of the workload's optimizer and of the default loss, on numbers
(``frameworks/_optim``, ``frameworks/_loss``): the kind picked and an unknown one refused in the
same words, the decay split by the spec's rule, torch's AdamW step carried over to a fused Adam
kernel without bias correction, the mean over every token. That each adapter's optimizer is
the workload's (clipped, decayed, AdamW as torch's) is a conformance check, in training
(tests/test_conformance.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_dlperf.core.spec import OptimizerSpec
from pytest_dlperf.frameworks import _loss, _optim


@dataclass
class Param:
    shape: tuple[int, ...]


def test_the_kind_builds_its_optimizer_and_no_other() -> None:
    built: list[str] = []

    def spelled(kind: str) -> Any:
        def build() -> str:
            built.append(kind)
            return kind

        return build

    for kind in _optim.KINDS:
        spec = OptimizerSpec(lr=0.1, kind=kind)
        assert _optim.build("torch", spec, sgd=spelled("sgd"), adamw=spelled("adamw")) == kind
    assert built == list(_optim.KINDS)


def test_an_unknown_kind_is_refused_naming_the_adapter_and_the_kinds_it_has() -> None:
    def never() -> None:
        raise AssertionError("no optimizer is built for an unknown kind")

    with pytest.raises(ValueError) as refused:
        _optim.build("paddle", OptimizerSpec(lr=0.1, kind="lamb"), sgd=never, adamw=never)
    assert str(refused.value) == "the paddle adapter has no optimizer 'lamb' (has: sgd, adamw)"


def test_the_decay_split_follows_the_spec_and_keeps_the_order() -> None:
    params = [Param((4, 3)), Param((3,)), Param((2, 2, 2)), Param(()), Param((5, 1))]
    bert = OptimizerSpec(lr=0.1, kind="adamw", weight_decay=0.01, no_decay_1d=True)
    decayed, exempt = _optim.decay_split(params, bert)
    assert decayed == [params[0], params[2], params[4]]  # matrices, whatever their sizes
    assert exempt == [params[1], params[3]]  # biases and norm scales, and a scalar
    assert _optim.decay_groups(params, bert) == [
        {"params": decayed, "weight_decay": 0.01}, {"params": exempt, "weight_decay": 0.0}]
    every = OptimizerSpec(lr=0.1, kind="adamw", weight_decay=0.01, no_decay_1d=False)
    # Nothing exempt: no empty group (an optimizer refuses one).
    assert _optim.decay_groups(params, every) == [{"params": params, "weight_decay": 0.01}]
    assert _optim.decay_split([(3,), (3, 3)], bert, shape=lambda s: s) == ([(3, 3)], [(3,)])


unit = st.floats(0.0, 1.0, exclude_max=True)


@given(m=st.floats(-10, 10), v=st.floats(0, 100), step=st.integers(1, 100_000),
       lr=st.floats(1e-6, 1.0), eps=st.floats(1e-12, 1e-2), beta1=unit, beta2=unit)
def test_the_kernels_step_is_torchs(m: float, v: float, step: int, lr: float, eps: float,
                                    beta1: float, beta2: float) -> None:
    """torch's bias-corrected step ``lr * (m / c1) / (sqrt(v / c2) + eps)`` equals the kernel's
    ``lr' * m / (sqrt(v) + eps')`` at the rates carried over (in float64, to rounding)."""
    c1, c2 = 1 - beta1 ** step, 1 - beta2 ** step
    if c1 < 1e-12 or c2 < 1e-12:
        return  # a beta so near 1 that the correction is 1 / 0 in torch too
    torchs = lr * (m / c1) / (math.sqrt(v / c2) + eps)
    rate, epsilon = _optim.kernel_rates(lr, beta1, beta2, eps, step)
    assert rate * m / (math.sqrt(v) + epsilon) == pytest.approx(torchs, rel=1e-9, abs=1e-300)
    # The same epsilon from a framework's tensors and its own square root.
    on_tensors = _optim.kernel_epsilon(np.float64(eps), np.float64(beta2) ** step, np.sqrt)
    assert on_tensors == pytest.approx(epsilon, rel=1e-12)


def test_the_decay_is_torchs_decoupled_one() -> None:
    weight = np.array([2.0, -4.0])
    assert list(weight * _optim.decay_factor(0.1, 0.5)) == [2.0 * 0.95, -4.0 * 0.95]


def softmax_mean(logits: np.ndarray, labels: np.ndarray) -> Any:
    assert logits.ndim == 2 and labels.ndim == 1  # what the framework's loss is given
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -log_p[np.arange(len(labels)), labels].mean()


def test_the_default_loss_is_the_mean_over_every_token() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 3, 5)).astype(np.float16)
    tokens = rng.integers(0, 5, (2, 3))
    criterion = _loss.cross_entropy(softmax_mean, fp32=lambda x: x.astype(np.float32))
    per_token = [softmax_mean(logits[b, t][None].astype(np.float32), tokens[b, t][None])
                 for b in range(2) for t in range(3)]
    assert criterion(logits, tokens) == pytest.approx(np.mean(per_token), rel=1e-6)
    assert criterion(logits, tokens).dtype == np.float32  # cast up before the loss
    classes, labels = logits[:, 0], tokens[:, 0]  # [B, C] against [B]: as they are
    assert _loss.cross_entropy(softmax_mean)(classes, labels) == softmax_mean(classes, labels)
