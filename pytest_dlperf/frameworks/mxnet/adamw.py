"""torch's AdamW as an MXNet optimizer: bias-corrected moments, the decay decoupled and scaled
by the learning rate (``w -= lr * wd * w``), epsilon added outside the square root of the
corrected second moment. MXNet 1.9 registers no AdamW. The step is MXNet's fused Adam kernel
(``adam_update``: both moments and the step in one pass) with no decay of its own, after the
decoupled decay as one in-place scaling of the weight (torch's order: the decay reads the weight
before the step, and the step does not read the weight). The kernel has no bias correction:
its rate and epsilon at each step are torch's carried over to it (``_optim.kernel_rates``, the
identity MindSpore's fused ``Adam`` runs on too). Measured on a 30522 x 768 matrix here
(2026-11-26, two threads): this 0.054 s, ``contrib.adamw_update`` (which has no bias
correction either and scales the decay by ``eta``, not the rate) 0.13 s, and the update written
from NDArray operators (eleven passes, each allocating) took a BERT-base step 3.4 s against
torch's 0.13 s. The class is made inside ``adamw`` so that MXNet is imported in the rank only."""

from __future__ import annotations

from typing import Any

from .._optim import decay_factor, kernel_rates


def adamw(mx: Any) -> Any:
    """The optimizer class, for MXNet ``mx``: ``adamw(mx)(learning_rate=, betas=, epsilon=,
    wd=)``; a parameter's ``wd_mult`` 0 leaves it undecayed."""
    nd = mx.nd

    class TorchAdamW(mx.optimizer.Optimizer):  # type: ignore[misc]
        def __init__(self, betas: tuple[float, float] = (0.9, 0.999), epsilon: float = 1e-8,
                     **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.beta1, self.beta2 = betas
            self.epsilon = epsilon

        def create_state(self, index: int, weight: Any) -> Any:
            return (nd.zeros(weight.shape, weight.context, dtype=weight.dtype),
                    nd.zeros(weight.shape, weight.context, dtype=weight.dtype))

        def update(self, index: int, weight: Any, grad: Any, state: Any) -> None:
            self._update_count(index)
            step = self._index_update_count[index]
            lr, wd = self._get_lr(index), self._get_wd(index)
            rate, epsilon = kernel_rates(lr, self.beta1, self.beta2, self.epsilon, step)
            if wd:
                weight *= decay_factor(lr, wd)  # in place
            mean, var = state
            nd.adam_update(
                weight, grad, mean, var, lr=rate, beta1=self.beta1, beta2=self.beta2,
                epsilon=epsilon, wd=0.0,
                rescale_grad=self.rescale_grad,
                clip_gradient=self.clip_gradient if self.clip_gradient is not None else -1.0,
                out=weight)

    return TorchAdamW
