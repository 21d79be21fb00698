"""torch's AdamW for the MindSpore adapter (``mindspore.py``), MindSpore imported by the caller
(it runs inside a rank, under MindSpore's own interpreter)."""

from __future__ import annotations

import functools
from typing import Any

from .._optim import decay_factor, kernel_epsilon


@functools.cache
def adamw(ms: Any) -> Any:
    """torch's AdamW as a MindSpore optimizer, PyNative and GRAPH mode alike: per parameter,
    ``p *= 1 - lr * decay``, then Adam's bias-corrected step by MindSpore's fused ``Adam``
    kernel, whose update ``lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps')`` is torch's
    ``lr * m_hat / (sqrt(v_hat) + eps)`` with ``eps' = eps * sqrt(1 - b2^t)`` (``_optim``'s
    ``kernel_epsilon`` and ``decay_factor``, the identity MXNet's kernel runs on too; within
    2e-6 of torch's AdamW in float64 over 3 steps, clipped and not, eager and inside a compiled
    step: tests/test_mindspore.py). The update is one compiled graph in PyNative mode too, as
    MindSpore's own optimizers' are (``jit(backend="ms_backend")`` on their ``construct``): op
    by op, a BERT-base AdamW update took 4.3 s here, as a graph of the same operators 2.05 s,
    with the fused kernel 0.33 s. An ``nn.Optimizer``, not a plain Cell: as a Cell, its
    compiled update called after ``value_and_grad`` kept a gradient-sized buffer every step,
    and the BERT-base eager case ran out of memory in its fifth window
    (tests/test_mindspore.py). With ``clip_norm`` the
    global-norm clip runs in the same graph: BERT-base's eager optimizer phase went from 1.74 s
    (the clip op by op in PyNative) to 0.60 s, the case from 0.51 to 0.76 sentences/s."""
    ops, tensor, f32 = ms.ops, ms.Tensor, ms.float32
    per_parameter = ops.MultitypeFuncGraph("dlperf_adamw")

    @per_parameter.register("Function", *["Tensor"] * 11)  # type: ignore[untyped-decorator]
    def _update(fused: Any, lr: Any, beta1: Any, beta2: Any, eps: Any, power1: Any,
                power2: Any, decay: Any, param: Any, grad: Any, m: Any, v: Any) -> Any:
        param = ops.depend(param, ops.assign(param, param * decay_factor(lr, decay)))
        return ops.depend(param, fused(param, m, v, power1, power2, lr, beta1, beta2, eps, grad))

    class AdamW(ms.nn.Optimizer):  # type: ignore[misc]
        def __init__(self, params: list[Any], decays: list[float], lr: float,
                     betas: tuple[float, float], eps: float,
                     clip_norm: float | None = None) -> None:
            super().__init__(lr, params)
            self.clip_norm = clip_norm  # the trainer leaves the clip to this update
            self.decays = tuple(tensor(d, f32) for d in decays)
            self.exp_avg = self.parameters.clone(prefix="exp_avg", init="zeros")
            self.exp_avg_sq = self.parameters.clone(prefix="exp_avg_sq", init="zeros")
            self.step_count = ms.Parameter(tensor(0.0, f32), name="adamw_step")
            self.lr, self.eps = tensor(lr, f32), tensor(eps, f32)
            self.beta1, self.beta2 = tensor(betas[0], f32), tensor(betas[1], f32)
            self.fused = ops.Adam()
            self.map = ops.HyperMap()

        @ms.jit(backend="ms_backend")  # type: ignore[untyped-decorator]
        def construct(self, grads: Any) -> Any:
            if self.clip_norm is not None:  # a constant: compiled in or out
                grads = ops.clip_by_global_norm(grads, self.clip_norm)
            step = self.step_count + 1.0
            ops.assign(self.step_count, step)
            power1 = ops.pow(self.beta1, step)
            power2 = ops.pow(self.beta2, step)
            eps = kernel_epsilon(self.eps, power2, ops.sqrt)
            return self.map(ops.partial(per_parameter, self.fused, self.lr, self.beta1,
                                        self.beta2, eps, power1, power2),
                            self.decays, self.parameters, grads, self.exp_avg, self.exp_avg_sq)

    return AdamW


__all__ = ["adamw"]
