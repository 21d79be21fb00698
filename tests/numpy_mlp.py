"""A team's own framework adapter and model, for the tests of flows: A/B, bisect, the nightly
gate, a busy machine. What they test is the plugin's flow (launches in turns or side by side,
worktrees, verdicts, the gate's state), not a framework, and the README's torch MLP made every
launch of theirs import torch: a one-launch case took 10.2 s here where this one takes 2.4 s,
each further launch 5.3 s against 1.2 s (2026-11-28), and the README's model file imports torch
at collection, in every pytest session of theirs. Its step is cut into the standard phases, so a
slower layer is named as the torch MLP's is.

A test writes ``ADAPTER`` as ``numpy_mlp_adapter.py`` beside its test file: ``model(hidden)``,
``test_my_model.py`` (``test_mlp``, parametrized by precision as the README's example is:
``test_mlp[1n1d-fp32]``), or ``ONE`` (``test_one``, no parameters)."""

from __future__ import annotations

# The hidden layer of the model as committed (4x the input's width, as the README's MLP), and
# the slowed model's: 5x as wide, a step ~5x as long here (as the README's wider layer).
FAST = "4 * width"
SLOW = "20 * width"

ADAPTER = '''\
"""A framework adapter of a team's own: a one-hidden-layer MLP in NumPy, data parallel through
the job's store, its step in the four standard phases; its products through ``np.matmul`` (a
framework op a package can wrap, as an upgrade that slows one would)."""

import json

import numpy as np

from pytest_dlperf.frameworks import PhasePlan, exchange, step_phases

DISTRIBUTION = "numpy"
RECIPE_FOR = "numpy"


class Eager:
    """What every NumPy trainer here shares: it computes eagerly, reports its loss and build."""

    dist = None
    _loss = float("nan")

    def synchronize(self):
        pass  # NumPy computes eagerly: a step is done when it returns

    def loss(self):
        return self._loss

    def environment(self):
        return {"framework_version": np.__version__,
                "data_parallel_ranks": self.dist.world_size}

    def close(self):
        pass


class MlpTrainer(Eager):
    def __init__(self, spec, dist, recipe):
        self.dist, self.lr, self.steps, self._loss = dist, spec.optimizer.lr, 0, float("nan")
        parts = recipe(spec.context(dist.rank, dist.world_size, dist.local_rank, "cpu"))
        self.weights, self.inputs, self.targets = parts.model, parts.inputs, parts.targets
        self.grads, self.saved = None, None
        self.phases = step_phases(self.batch, self.forward, self.backward, self.update)

    def batch(self):
        return self.inputs, self.targets

    def forward(self, x, y):
        hidden = np.maximum(np.matmul(x, self.weights[0]), 0.0)
        logits = np.matmul(hidden, self.weights[1])
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        self.saved = (x, y, hidden, p)
        return float(-np.log(p[np.arange(len(y)), y]).mean())

    def backward(self, loss):
        self._loss = loss
        x, y, hidden, p = self.saved
        p[np.arange(len(y)), y] -= 1.0
        p /= len(y)
        back = np.matmul(p, self.weights[1].T) * (hidden > 0)
        grads = [np.matmul(x.T, back), np.matmul(hidden.T, p)]
        if self.dist.world_size > 1:  # every rank steps with the mean gradient
            every = exchange(self.dist, f"grad/{self.steps}",
                             json.dumps([g.tolist() for g in grads]))
            grads = [np.mean([np.array(json.loads(g)[i]) for g in every], axis=0)
                     for i in range(len(grads))]
        self.grads = grads

    def update(self):
        for weight, grad in zip(self.weights, self.grads):
            weight -= self.lr * grad
        self.steps += 1

    def step(self):
        for _, phase in self.phases:
            phase()

    def phase_plan(self):
        return PhasePlan(phases=step_phases(self.batch, self.forward, self.backward,
                                            self.update), how="NumPy computes eagerly")


def build_trainer(spec, dist, recipe):
    return MlpTrainer(spec, dist, recipe)
'''

MODEL = '''\
"""test_my_model.py: a small MLP of our own, in our own framework adapter, as a perf test."""

import numpy as np

from pytest_dlperf import SGD, BuildContext, Parts, Workload


def build_mlp(ctx: BuildContext):
    rng = np.random.default_rng(ctx.seed + ctx.rank)
    width = int(ctx.sizes["width"])
    hidden = HIDDEN
    model = [rng.standard_normal((width, hidden)) / np.sqrt(width),
             rng.standard_normal((hidden, 10)) / np.sqrt(hidden)]
    return Parts(model=model, inputs=rng.standard_normal((ctx.batch_size, width)),
                 targets=rng.integers(0, 10, ctx.batch_size))


MLP = Workload(name="mlp", recipes={"numpy": build_mlp}, batch_size={"cpu": 128},
               sizes={"width": 256}, optimizer=SGD(lr_per_256=0.05, momentum=0.0))


def test_mlp(cluster, amp, throughput_meter):
    report = throughput_meter.measure("numpy_mlp_adapter", MLP)
    assert report.environment.data_parallel_ranks == cluster.world_size
'''


def model(hidden: str) -> str:
    """The model file with its hidden layer ``hidden`` wide (``FAST``, ``SLOW`` or another
    expression of ``width``)."""
    return MODEL.replace("HIDDEN", hidden)


ONE = '''\
import numpy as np

from pytest_dlperf import SGD, Parts, Workload


def mlp(ctx):
    rng = np.random.default_rng(ctx.seed + ctx.rank)
    model = [rng.standard_normal((64, 64)) / 8.0, rng.standard_normal((64, 10)) / 8.0]
    return Parts(model=model, inputs=rng.standard_normal((ctx.batch_size, 64)),
                 targets=rng.integers(0, 10, ctx.batch_size))


MLP = Workload("mlp", recipes={"numpy": mlp}, batch_size={"cpu": 16},
               optimizer=SGD(lr_per_256=0.05, momentum=0.0))


def test_one(throughput_meter):
    throughput_meter.measure("numpy_mlp_adapter", MLP)
'''
"""One case (``test_one``) of a small MLP (64 -> 64 -> 10, batch 16) under the adapter, with no
parameters: the one-case file of the verdict's and the busy machine's tests."""
