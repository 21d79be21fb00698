"""JAX's GPT is torch's: the same parameters under the same names, in the same order, initialized
alike; the same logits and loss from torch's weights (the port contract's at the CPU sizes,
tests/ports.py, checked in tests/test_ports.py), attending causally; and the recipe trains under
``jax.jit``, in float32 and computing in bfloat16.

``pytest_dlperf.models.gpt.jax`` writes GPT-2 as a Flax NNX module; these tests are what makes
its throughput comparable with torch's. The JAX side runs under JAX's interpreter
(``scripts/setup-jax``, or ``DLPERF_TEST_JAX_PYTHON``) and skips without it; torch's side runs
here.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from snippets import run_snippet

from pytest_dlperf.core.workload import WorkloadError
from pytest_dlperf.models import gpt
from pytest_dlperf.models.gpt import jax as gpt_jax
from pytest_dlperf.models.gpt import torch as gpt_torch

SMALL = gpt.GPTShape.of(gpt.CPU_SIZES)


def test_llamas_architecture_is_refused_naming_gpt2() -> None:
    llama = gpt.GPTShape.of({**gpt.CPU_SIZES, "arch": "llama", "num_kv_heads": 2})
    with pytest.raises(WorkloadError, match="JAX recipe builds GPT-2 only"):
        gpt_jax.model(llama)  # before JAX is imported: this side has none


OWN = """
import json, math
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from pytest_dlperf.models import gpt
from pytest_dlperf.models.gpt.jax import (load_torch_weights, model, named_parameters,
                                          torch_named_shapes)
def adapter_count(m):  # what the JAX adapter trains: nnx.split's Param leaves
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(nnx.state(m, nnx.Param)))
small = model(gpt.GPTShape.of(gpt.CPU_SIZES), seed=0)
big = nnx.eval_shape(lambda: model(gpt.GPTShape.of(gpt.GPT2_124M)))  # no memory
params = {n: np.asarray(a) for n, a in named_parameters(small).items()}
out = {"small": torch_named_shapes(small), "big": torch_named_shapes(big),
       "counted": [adapter_count(small), adapter_count(big)],
       "arrays": {n: list(a.shape) for n, a in params.items()},
       "stats": {n: [float(a.mean()), float(a.std())] for n, a in params.items()}}
ref = np.load(REF)
weights = {k[len("param/"):]: ref[k] for k in ref.files if k.startswith("param/")}
gpt2 = model(gpt.GPTShape.of(gpt.CPU_SIZES), seed=1)
refused = []
for wrong in ({**weights, "layers.0.feed_forward.w1.weight":
               weights["layers.0.feed_forward.w1.weight"].T},
              {n: a for n, a in weights.items() if n != "norm.bias"},
              {**weights, "output.weight": weights["tok_embeddings.weight"]}):
    try:
        load_torch_weights(gpt2, wrong)
    except ValueError as error:
        refused.append(str(error))
load_torch_weights(gpt2, weights)
back = max(float(np.abs(np.asarray(a) - weights[n]).max())
           for n, a in named_parameters(gpt2).items())
forward = nnx.jit(lambda m, tokens: m(tokens))
tokens = jnp.asarray(ref["tokens"], jnp.int32)
logits = np.asarray(forward(gpt2, tokens))
changed = np.asarray(forward(gpt2, tokens.at[:, AT].set((tokens[:, AT] + 1) % 512)))
scale = float(np.abs(ref["logits"]).max())
out.update(refused=refused, back=back,
           before=float(np.abs(changed[:, :AT] - logits[:, :AT]).max()) / scale,
           after=float(np.abs(changed[:, AT:] - logits[:, AT:]).max()) / scale)
print(json.dumps(out))
"""
CHANGED_AT = 40  # the position whose token the causality check changes


@pytest.fixture(scope="module")
def own(jax_python: str) -> dict[str, Any]:
    """What this module checks of the port beyond the port contract's (the CPU sizes'
    parameters by torch's name, order and shape, torch's logits and loss from torch's weights:
    tests/test_ports.py), from one JAX process: GPT-2 124M's names and shapes (only traced),
    what the adapter counts, the initialization, the loading's refusals and read-back, and
    causality, on torch's reference (tests/port_references.py)."""
    pytest.importorskip("torch")
    from port_references import torch_reference

    out = run_snippet(jax_python, f"REF = {str(torch_reference('gpt'))!r}\n"
                                  f"AT = {CHANGED_AT}\n{OWN}")
    assert isinstance(out, dict)
    return out


def test_parameters_are_torchs_at_124m_counted_and_initialized_alike(
        own: dict[str, Any]) -> None:
    """GPT-2 124M only traced (``nnx.eval_shape``): torch's names in torch's order with its
    shapes, the tied head once, and what the adapter counts (every ``nnx.Param``) is the
    workload's count, at the CPU sizes too. Initialization: each matrix's spread is within 5%
    of torch's model's (the smallest, 64 x 128 positions, puts one sampling error at 1.1%; the
    unscaled residual projections would be 2.8x), the vectors exactly torch's zeros and ones."""
    import torch

    want = {name: tuple(p.shape) for name, p in
            gpt_torch.build(gpt.GPTShape.of(gpt.GPT2_124M), "meta").named_parameters()}
    got = {name: tuple(shape) for name, shape in own["big"].items()}
    assert list(got) == list(want)  # names, and in torch's order
    assert got == want
    assert own["arrays"] == {name: list(shape) for name, shape in own["small"].items()}
    assert own["counted"] == [gpt.parameter_count(gpt.CPU_SIZES),
                              gpt.parameter_count(gpt.GPT2_124M)] == [867_072, 124_475_904]
    torch.manual_seed(0)
    reference = gpt_torch.build(SMALL)
    for name, p in reference.named_parameters():
        mean, std = own["stats"][name]
        if p.dim() == 1:
            assert [mean, std] == [p.mean().item(), p.std(correction=0).item()], name
        else:
            assert std == pytest.approx(p.std().item(), rel=0.05), name
            assert abs(mean) < 0.1 * std, name


def test_the_loading_refuses_what_does_not_fit_and_the_attention_is_causal(
        own: dict[str, Any]) -> None:
    """torch's weights loaded by name (a transposed, a missing and an extra array refused
    first; read back unchanged), the forward compiled with ``nnx.jit``, on two sequences of
    64. Changing the token at position 40 leaves the logits before it exactly as they were and
    moves those from it on (relative to the largest logit, 27): the attention is causal (no
    causal mask moves the logits by 0.86)."""
    wrong_shape, missing, extra = own["refused"]
    assert ("layers.0.feed_forward.w1.weight: torch's array is (128, 512), the parameter's in "
            "torch's layout (512, 128)") in wrong_shape, wrong_shape
    assert "parameters without an array: ['norm.bias']" in missing, missing
    assert "torch names without a parameter: ['output.weight']" in extra, extra
    assert own["back"] == 0.0, own
    assert own["before"] == 0.0, own  # causal: no position sees a later one
    assert own["after"] > 1e-3, own


TRAIN = """
import json
import jax, jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from pytest_dlperf.core.workload import BuildContext, WorkloadError
from pytest_dlperf.frameworks.jax import cross_entropy
from pytest_dlperf.models import gpt
from pytest_dlperf.models.gpt.jax import named_parameters, recipe
def context(amp_dtype, rank=0, sizes=gpt.CPU_SIZES):
    return BuildContext(framework="jax", device_type="cpu", device="cpu", batch_size=2,
                        sizes=dict(sizes), precision="fp32" if amp_dtype == "float32" else "amp",
                        amp_dtype=amp_dtype, compiled=True, seed=0, rank=rank, world_size=2,
                        local_rank=rank)
adamw = gpt.WORKLOAD.optimizer
def train(parts, steps):
    graphdef, params, rest = nnx.split(parts.model, nnx.Param, ...)
    tx = optax.chain(optax.clip_by_global_norm(adamw.clip_norm),
                     optax.adamw(adamw.lr, b1=adamw.betas[0], b2=adamw.betas[1], eps=adamw.eps,
                                 weight_decay=adamw.weight_decay,
                                 mask=jax.tree.map(lambda p: p.ndim > 1, params)))
    def loss_fn(params, tokens, targets):
        return cross_entropy(nnx.merge(graphdef, params, rest)(tokens), targets)
    @jax.jit
    def step(params, opt_state, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads
    opt_state, losses, drawn = tx.init(params), [], []
    for _ in range(steps):
        targets = parts.targets()
        params, opt_state, loss, grads = step(params, opt_state, parts.inputs, targets)
        losses.append(float(loss))
        drawn.append(np.asarray(targets))
    # Rows of the token embedding no input looks up: only the tied head sends them gradient.
    unused = np.setdiff1d(np.arange(512), np.asarray(parts.inputs))
    tied = float(np.abs(np.asarray(grads["tok_embeddings"]["embedding"][...])[unused]).max())
    nnx.update(parts.model, params)
    return losses, drawn, tied
parts = recipe(context("float32"))
before = {n: np.asarray(a) for n, a in named_parameters(parts.model).items()}
losses, drawn, tied = train(parts, 4)
still = [n for n, a in named_parameters(parts.model).items()
         if np.abs(np.asarray(a) - before[n]).max() < 1e-5]
again, other, amp = (recipe(context(dtype, rank)) for dtype, rank in
                     (("float32", 0), ("float32", 1), ("bfloat16", 0)))
forward = nnx.jit(lambda m, tokens: m(tokens))
logits, amp_logits = (forward(m, parts.inputs) for m in (again.model, amp.model))
refused = None
try:
    recipe(context("float32", sizes={**gpt.CPU_SIZES, "arch": "llama", "num_kv_heads": 2}))
except WorkloadError as error:
    refused = str(error)
print(json.dumps({
    "losses": losses, "targets": [t.tolist() for t in drawn], "tied": tied, "still": still,
    "inputs": [list(parts.inputs.shape), str(parts.inputs.dtype), str(drawn[0].dtype),
               int(parts.inputs.min()), int(parts.inputs.max())],
    "same_tokens": bool((again.inputs == parts.inputs).all()),
    "rank1_tokens": bool((other.inputs == parts.inputs).all()),
    "rank1_weights": all(bool((np.asarray(a) == before[n]).all())
                         for n, a in named_parameters(other.model).items()),
    "amp": [str(amp_logits.dtype), sorted({str(a.dtype) for a in
                                           named_parameters(amp.model).values()})],
    "amp_error": float(jnp.abs(amp_logits.astype(jnp.float32) - logits).max()
                       / jnp.abs(logits).max()),
    "amp_loss": float(cross_entropy(amp_logits, drawn[0])), "refused": refused}))
"""


def test_the_recipe_trains_in_float32_and_computes_in_bfloat16(jax_python: str) -> None:
    """The recipe at the CPU sizes, batch 2: four steps of the workload's AdamW (clipping, no
    decay on vectors) over ``nnx.split`` / ``nnx.merge`` in one ``jax.jit``, fresh targets every
    step. The first loss is an untrained model's, ln 512; on fresh targets later ones wander
    but do not run away. Every parameter moves but the key projections' biases: softmax
    ignores what they add to a row of scores, so their gradient is zero but for rounding (as
    in torch). The token embedding's rows no input looks up get gradient: the tied head's.
    The model's weights are every rank's, the tokens each replica's own, drawn again alike.
    Under bfloat16 (the forward only: a second compiled step would double the test's time)
    the logits are bfloat16, near float32's from the same weights, the parameters float32."""
    out = run_snippet(jax_python, TRAIN)
    assert isinstance(out, dict)
    uniform = math.log(SMALL.vocab_size)
    losses = out["losses"]
    assert abs(losses[0] - uniform) < 0.5, out
    assert all(math.isfinite(loss) and loss < 2 * uniform for loss in losses), out
    targets: list[Any] = out["targets"]
    assert len({str(t) for t in targets}) == len(targets) == 4  # fresh every step
    assert all(0 <= i < SMALL.vocab_size for t in targets for row in t for i in row)
    assert out["inputs"][:3] == [[2, SMALL.seq_length], "int32", "int32"]
    assert 0 <= out["inputs"][3] and out["inputs"][4] < SMALL.vocab_size
    assert out["tied"] > 0, out
    assert out["still"] == [f"layers.{i}.attention.wk.bias" for i in range(4)], out
    assert out["same_tokens"] and not out["rank1_tokens"] and out["rank1_weights"], out
    assert out["amp"] == ["bfloat16", ["float32"]], out
    assert out["amp_error"] < 0.05, out  # bf16's 8 bits, through 4 blocks
    assert abs(out["amp_loss"] - uniform) < 0.5, out
    assert "JAX recipe builds GPT-2 only" in out["refused"], out
