"""The one dynamic loss-scale policy (``frameworks/_loss_scale``) as it is run by hand where a
framework has no scaler for its steps (OneFlow's eager fp16 steps), against torch's
``GradScaler`` on the same run of clean and overflowing steps. That every framework's own
scaler is built on the policy is a conformance check (tests/test_conformance.py)."""

from __future__ import annotations

import math

import torch

from pytest_dlperf.frameworks._loss_scale import POLICY, DynamicScale, LossScalePolicy


def test_the_policy_run_by_hand_steps_and_scales_as_torchs_grad_scaler() -> None:
    # A short growth interval, so that the scale grows, backs off and grows again within a
    # dozen steps; an overflow in the middle of a clean run restarts its count.
    policy = LossScalePolicy(initial=1024.0, growth=2.0, backoff=0.5, interval=3)
    finite = [True, True, True, False, True, True, False, False, True, True, True, True]
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=policy.initial, growth_factor=policy.growth,
                                  backoff_factor=policy.backoff, growth_interval=policy.interval)
    by_hand = DynamicScale(policy)
    torch_run, hand_run = [], []
    for clean in finite:
        optimizer.zero_grad()
        before = param.detach().clone()
        loss = (param * torch.tensor([1.0, 1.0 if clean else math.inf])).sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        torch_run.append((not torch.equal(param.detach(), before), scaler.get_scale()))
        stepped = by_hand.update(clean)
        hand_run.append((stepped, by_hand.scale))
    assert [s for s, _ in torch_run] == finite  # torch skipped exactly the overflowing steps
    assert hand_run == torch_run


def test_the_policy_is_torchs_default() -> None:
    """The policy is torch's ``GradScaler`` as it comes (what the CUDA figures were taken with)."""
    scaler = torch.amp.GradScaler("cpu")
    assert (POLICY.initial, POLICY.growth, POLICY.backoff, POLICY.interval) == (
        scaler.get_scale(), scaler.get_growth_factor(), scaler.get_backoff_factor(),
        scaler.get_growth_interval())
