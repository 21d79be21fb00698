"""The port job's GPT port (tests/port_job.py): the CPU sizes built (names, shapes), then
torch's weights (tests/port_references.py's reference) under the framework's interpreter: no
pytest, the framework imported inside its function only.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def gpt_jax(spec: dict[str, Any]) -> dict[str, Any]:
    """The CPU sizes built: torch's names and shapes. Then torch's weights loaded by name, the
    forward compiled with ``nnx.jit``, on two sequences of 64; errors relative to the largest
    logit (27), the loss's (the adapter's default, against torch's recipe's) to the loss.
    Measured on XLA's CPU kernels (jax 0.12, 2026-11-27): a faithful model is 7.6e-7 from
    torch's logits (its loss equal); exact GELU moves them by 2.6e-4, Flax's LayerNorm epsilon
    (1e-6) by 1.6e-5, no causal mask by 0.86. Flax's one-pass variance moves them by 8.2e-7
    only, which they cannot tell from rounding here (the activations' means are small beside
    their spread)."""
    import jax.numpy as jnp
    from flax import nnx

    from pytest_dlperf.frameworks.jax import cross_entropy
    from pytest_dlperf.models import gpt
    from pytest_dlperf.models.gpt.jax import load_torch_weights, model, torch_named_shapes

    shape = gpt.GPTShape.of(gpt.CPU_SIZES)
    out: dict[str, Any] = {"shapes": torch_named_shapes(model(shape, seed=0)), "probes": {}}
    ref = np.load(spec["reference"])
    gpt2 = model(shape, seed=1)
    load_torch_weights(gpt2, {k[len("param/"):]: ref[k] for k in ref.files
                              if k.startswith("param/")})
    logits = np.asarray(nnx.jit(lambda m, tokens: m(tokens))(
        gpt2, jnp.asarray(ref["tokens"], jnp.int32)))
    scale = float(np.abs(ref["logits"]).max())
    loss = float(cross_entropy(jnp.asarray(logits), jnp.asarray(ref["targets"], jnp.int32)))
    out["outputs"] = {"jit": {"logits": float(np.abs(logits - ref["logits"]).max()) / scale,
                              "loss": abs(loss - float(ref["loss"])) / float(ref["loss"])}}
    out["once"] = {"scale": scale}
    return out
