"""OneFlow's update: the workload's optimizer as OneFlow builds it eagerly and inside an
``nn.Graph`` (where clipping and decay exclusions must be the optimizer's, a graph's gradients
never reaching Python), and dynamic loss scaling for eager fp16 steps, which OneFlow 0.9.0 sets up
for nn.Graph only. The trainer (``frameworks/oneflow/__init__.py``) calls both; OneFlow is passed in,
never imported here (ranks import this under OneFlow's own interpreter).
"""

from __future__ import annotations

from typing import Any

from ...core.spec import OptimizerSpec
from .. import _optim
from .._loss_scale import POLICY, DynamicScale


def make_optimizer(flow: Any, params: list[Any], opt: OptimizerSpec, graph: bool) -> Any:
    """The workload's optimizer (``_optim``: the kind, which parameters decay). In nn.Graph,
    clipping and the decay exclusions are the optimizer's (a graph's gradients never reach
    Python): one parameter group, so that its clip is by the norm over all parameters (OneFlow
    clips each group by its own norm), and the 1-D parameters excluded from decay by name
    patterns, as OneFlow's BERT did (``graph_adamw``). Eagerly, the step clips, and the
    excluded parameters are a group of their own."""
    clip = ({"clip_grad_max_norm": opt.clip_norm, "clip_grad_norm_type": 2.0}
            if graph and opt.clip_norm is not None else {})

    def adamw() -> Any:
        if graph:
            return graph_adamw(flow, params, opt, clip)
        return flow.optim.AdamW(_optim.decay_groups(params, opt), lr=opt.lr, betas=opt.betas,
                                eps=opt.eps, weight_decay=opt.weight_decay)

    return _optim.build(
        "oneflow", opt, adamw=adamw,
        sgd=lambda: flow.optim.SGD([{"params": params, **clip}], lr=opt.lr,
                                   momentum=opt.momentum, weight_decay=opt.weight_decay))


def graph_adamw(flow: Any, params: list[Any], opt: OptimizerSpec, clip: dict[str, Any]) -> Any:
    """AdamW for nn.Graph: one group (its clip, if any, over every parameter), the exempt
    parameters kept from decay by their variable names in the graph's optimizer conf."""
    decayed, kept = _optim.decay_split(params, opt)
    optimizer = flow.optim.AdamW([{"params": params, **clip}], lr=opt.lr, betas=opt.betas,
                                 eps=opt.eps, weight_decay=opt.weight_decay)
    generate = optimizer._generate_conf_for_graph

    def with_exclusions(train_conf: Any, vars_conf: Any) -> Any:
        confs = generate(train_conf, vars_conf)
        excluded = [vars_conf[p].name for p in kept]
        names = [vars_conf[p].name for p in decayed]
        # OneFlow matches the patterns as substrings of variable names: no decayed name may
        # contain an excluded one (they are full dotted paths from one root, so none does).
        clash = [(e, d) for e in excluded for d in names if e in d]
        if clash:
            raise ValueError(f"cannot exclude {clash[0][0]} from weight decay by name without "
                             f"excluding {clash[0][1]} too")
        for conf in confs:
            conf.weight_decay_conf.excludes.pattern.extend(excluded)
        return confs

    optimizer._generate_conf_for_graph = with_exclusions
    return optimizer


def graph_loss_scaler(flow: Any) -> Any:
    """``nn.Graph``'s dynamic loss scaler, on the one policy (``_loss_scale.POLICY``)."""
    return flow.amp.GradScaler(init_scale=POLICY.initial, growth_factor=POLICY.growth,
                               backoff_factor=POLICY.backoff, growth_interval=POLICY.interval)


class EagerLossScaler:
    """Dynamic loss scaling for eager fp16 steps, the one policy run by hand
    (``_loss_scale.DynamicScale``; OneFlow 0.9.0's ``GradScaler`` sets up nn.Graph only): the
    loss scaled up for backward, the gradients back down, a step with an inf or NaN gradient
    skipped. Checking for infs reads a flag on the host each step (torch's fused optimizer
    avoids it)."""

    def __init__(self, flow: Any) -> None:
        self._flow = flow
        self.dynamic = DynamicScale(POLICY)

    @property
    def scale(self) -> float:
        return self.dynamic.scale

    def backward(self, loss: Any) -> None:
        (loss * self.dynamic.scale).backward()

    def unscale(self, params: list[Any]) -> bool:
        """Unscale the gradients in place; whether they are all finite (the step may go on)."""
        flow = self._flow
        grads = [p.grad for p in params if p.grad is not None]
        for grad in grads:
            grad.mul_(1.0 / self.dynamic.scale)
        return self.dynamic.update(bool(flow.stack([flow.isfinite(g).all()
                                                    for g in grads]).all().item()))
