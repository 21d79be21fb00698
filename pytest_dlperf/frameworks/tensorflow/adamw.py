"""torch's AdamW as a Keras 3 optimizer: the TensorFlow adapter's ``adamw``.

Keras' own ``AdamW`` trains another algorithm than ``torch.optim.AdamW`` in two places, both
measured on Wide & Deep (three steps from torch's weights, 2026-11-29):

- **epsilon**: Keras adds it to ``sqrt(v)`` and folds the bias corrections into the step size,
  torch adds it to ``sqrt(v) / sqrt(1 - beta_2^t)``; where gradients are small next to epsilon
  (a tower's, an embedding's) the updates differ by tens of percent;
- **sparse gradients**: a lookup's gradient is ``tf.IndexedSlices``, which Keras applies row by
  row (a row looked up twice in a batch gets its moments updated twice, from each slice alone,
  and a row not looked up keeps its moments), where torch's dense gradient updates every row
  once, from their sum.

This optimizer makes the update torch's: the gradient made dense (the sum over the slices),
``m`` and ``v`` as torch keeps them, the step ``lr / (1 - beta_1^t) * m / (sqrt(v) / sqrt(1 -
beta_2^t) + eps)``; the decoupled weight decay is Keras' AdamW's (``variable -= lr * wd *
variable`` before the update), which is torch's. Three steps of Wide & Deep from torch's weights
end within 6.7e-4 of how far torch moved each parameter (float32; Keras' own AdamW: 1.02;
``tests/test_wide_deep_tensorflow.py``).

Keras and TensorFlow are imported inside the function (the leading underscore keeps
``frameworks.known_frameworks`` from taking the module for an adapter).
"""

from __future__ import annotations

from typing import Any


def torch_adamw(keras: Any, learning_rate: float, weight_decay: float, beta_1: float,
                beta_2: float, epsilon: float) -> Any:
    """A Keras optimizer that updates as ``torch.optim.AdamW`` does."""
    import tensorflow as tf
    from keras import ops

    class TorchAdamW(keras.optimizers.AdamW):  # type: ignore[misc]
        def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
            if isinstance(gradient, tf.IndexedSlices):
                gradient = tf.convert_to_tensor(gradient)  # the sum over the slices
            dtype = variable.dtype
            lr = ops.cast(learning_rate, dtype)
            gradient = ops.cast(gradient, dtype)
            step = ops.cast(self.iterations + 1, dtype)
            first = 1 - ops.power(ops.cast(self.beta_1, dtype), step)
            second = 1 - ops.power(ops.cast(self.beta_2, dtype), step)
            index = self._get_variable_index(variable)
            m, v = self._momentums[index], self._velocities[index]
            self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
            self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v),
                                            1 - self.beta_2))
            denominator = ops.add(ops.divide(ops.sqrt(v), ops.sqrt(second)), self.epsilon)
            self.assign_sub(variable, ops.divide(ops.multiply(m, lr / first), denominator))

    return TorchAdamW(learning_rate=learning_rate, weight_decay=weight_decay, beta_1=beta_1,
                      beta_2=beta_2, epsilon=epsilon)
