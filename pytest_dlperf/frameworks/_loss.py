"""The default loss (a recipe's ``Parts.loss`` left out), where a framework's adapter spells it
from the framework's softmax cross-entropy (MindSpore's, MXNet's, JAX's): class logits
against integer labels, and a language model's ``[B, T, V]`` logits against ``[B, T]`` tokens
flattened to ``[B*T, V]`` against ``[B*T]``, so that the mean is over every token.

The others keep their own, each for a reason of its framework: torch's also reads a library
model's output object (``loss``, ``logits``) and takes ``[B, C, ...]`` logits against
``[B, ...]`` labels as torch's ``cross_entropy`` does; TensorFlow's sparse cross-entropy takes
any leading dimensions itself (and a ``tf.Tensor`` has no ``reshape`` method); OneFlow's and
Paddle's are their framework's own loss as it comes.

Runs inside a rank, under any interpreter: the standard library only (the framework's
cross-entropy and cast are passed in).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def cross_entropy(mean: Callable[[Any, Any], Any],
                  fp32: Callable[[Any], Any] | None = None) -> Callable[[Any, Any], Any]:
    """The default loss as ``criterion(outputs, targets)``. ``mean(logits, labels)``: the
    framework's softmax cross-entropy of ``[N, C]`` logits against ``[N]`` labels, averaged;
    ``fp32``: the logits cast to float32 first (bf16 logits under AMP, as torch's autocast runs
    cross-entropy in fp32), where the adapter casts them."""

    def criterion(outputs: Any, targets: Any) -> Any:
        if fp32 is not None:
            outputs = fp32(outputs)
        if len(outputs.shape) > 2:  # a language model's tokens: the mean over every one
            outputs = outputs.reshape(-1, outputs.shape[-1])
            targets = targets.reshape(-1)
        return mean(outputs, targets)

    return criterion
