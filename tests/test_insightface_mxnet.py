"""MXNet's InsightFace recipe trains data parallel on two ranks through the adapter, the ``pfc``
strategy refuses what it does not run, and MXNet's store carries a head split by class. That it
is torch's model (torch's parameters by name and shape, torch's weights give torch's loss and
head gradient, eager and hybridized) and that under the ``pfc`` layout kind
(``frameworks/mxnet/classes.py``) two ranks holding 6 and 5 of 11 classes' centres train what
one process with the whole head trains (a wrong label offset seen, Partial FC keeping the
batch's classes) is the port contract's, tests/ports.py's row, run by tests/test_ports.py and
tests/test_ports_ranks.py.

``pytest_dlperf.models.insightface.mxnet`` writes the model from ``mxnet.gluon.nn``. The MXNet
lines run under MXNet's interpreter (``scripts/setup-mxnet``, or ``DLPERF_TEST_MXNET_PYTHON``);
those tests skip without it. The torch references run in this process.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
from snippets import REPO, free_ports, run_together

from pytest_dlperf.models.insightface import CPU_SIZES, FaceShape

CLASSES = 11


TRAIN = """
import dataclasses, hashlib, json
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.recipes import load_recipe
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.frameworks import DistEnv, load
from pytest_dlperf.models.insightface import WORKLOAD
workload = dataclasses.replace(WORKLOAD, recipes={
    "mxnet": "pytest_dlperf.models.insightface.mxnet:recipe"})
spec = spec_for("mxnet", workload, protocol=QUICK, device_type="cpu", compiler="compiled",
                world_size=2, batch_size=2, sizes={"num_classes": 101})
trainer = load("mxnet").build_trainer(spec, DistEnv(RANK, 2, RANK, 2, 0),
                                      load_recipe(spec.recipe))
head = trainer.model.head.weight
before = head.data().asnumpy()
losses = []
for _ in range(2):
    trainer.step()
    trainer.synchronize()
    losses.append(trainer.loss())
after = head.data().asnumpy()
print(json.dumps({"losses": losses, "environment": trainer.environment(),
                  "moved": float(abs(after - before).max()), # (a digest: a megabyte of JSON fills the pipe, and rank 0's close waits for rank 1)
                  "head": hashlib.sha256(after.tobytes()).hexdigest()}))
trainer.close()
"""


def test_the_recipe_trains_data_parallel_on_two_ranks(mxnet_python: str) -> None:
    """MobileFaceNet at 101 classes, batch 2 a rank, hybridized, two SGD steps (momentum,
    weight decay) through the adapter over the store (``dist_sync``): every rank ends with the
    same head, moved, from losses of its own batch, finite."""
    pytest.importorskip("torch")
    from pytest_dlperf.models.insightface.torch import build

    shape = FaceShape.of({**CPU_SIZES, "num_classes": 101})
    parameters = sum(p.numel() for p in build(shape).parameters())
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "GLOG_minloglevel": "2", "MASTER_ADDR": "127.0.0.1",
           "DLPERF_FRAMEWORK_PORT": str(free_ports(1)[0])}
    ranks: list[Any] = run_together(mxnet_python, [TRAIN.replace("RANK", str(rank))
                                                   for rank in (0, 1)], env)
    for rank in ranks:
        assert all(math.isfinite(loss) for loss in rank["losses"]), rank["losses"]
        assert rank["moved"] > 0
        assert rank["environment"]["data_parallel_ranks"] == 2
        assert rank["environment"]["kvstore"] == "dist_sync"
        assert rank["environment"]["parameters"] == parameters
    assert ranks[0]["head"] == ranks[1]["head"]  # the mean gradient applied on both
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank's own labels


def test_what_the_mxnet_pfc_strategy_does_not_run_is_refused_saying_why() -> None:
    from pytest_dlperf.core.strategies import kinds_of, why_not
    from pytest_dlperf.frameworks import load

    load("mxnet")
    assert "pfc" in kinds_of("mxnet")
    assert why_not("mxnet", ("pfc",), "cpu") is None
    why = why_not("mxnet", ("pfc",), "cpu", compiled=True)
    assert why is not None and "'Symbol' object has no attribute 'shape'" in why


# A head split by class over two ranks (6 and 5 of 11 classes), written from the store's
# pushpull as the torch strategy (frameworks/torch/classes.py) writes it from all_gather and
# all_reduce, against the whole head on the global batch; CosFace at scale 64.
SPLIT = """
import json, os
import numpy as np
from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.frameworks.mxnet import prepare_environ, start_roles
prepare_environ(os.environ, DistEnv(RANK, 2, RANK, 2, 0))
roles = start_roles(os.environ) if RANK == 0 else []
import mxnet as mx
from mxnet import autograd, nd
kv = mx.kv.create("dist_sync")
B, E, C, N = 3, 8, 11, 6
rng = np.random.RandomState(0)
W, X = rng.randn(C, E).astype("float32"), rng.randn(2 * B, E).astype("float32")
Y = rng.randint(0, C, 2 * B).astype("float32")
start, count = (0, N) if RANK == 0 else (N, C - N)
mine = slice(RANK * B, (RANK + 1) * B)
shapes = [(2 * B, E), (2 * B,), (2, 2 * B), (2 * B,), (2 * B,), (2 * B, E)]
for key, shape in enumerate(shapes):
    kv.init(key, nd.zeros(shape))
def summed(key, value):  # the sum over the ranks: the store's pushpull
    out = nd.zeros(shapes[key])
    kv.pushpull(key, value, out=out)
    return out
def gathered(key, value, where):  # each rank's value in its slot of zeros, summed
    buf = nd.zeros(shapes[key])
    buf[where] = value
    return summed(key, buf)
class Gather(autograd.Function):
    def forward(self, x):
        return gathered(0, x, mine)
    def backward(self, grad):
        return summed(5, grad)[mine] * 2
class SoftmaxLoss(autograd.Function):
    def forward(self, logits, target):
        top = gathered(2, logits.max(axis=1), RANK).max(axis=0).reshape((-1, 1))
        prob = nd.exp(nd.broadcast_sub(logits, top))
        prob = nd.broadcast_div(prob, summed(3, prob.sum(axis=1)).reshape((-1, 1)))
        own = summed(4, nd.pick(prob, nd.maximum(target, 0), axis=1) * (target >= 0))
        self.save_for_backward(prob, target)
        return -nd.log(nd.maximum(own, 1e-44)).mean()
    def backward(self, grad):
        prob, target = self.saved_tensors
        hot = nd.one_hot(nd.maximum(target, 0), prob.shape[1]) * (target >= 0).reshape((-1, 1))
        return (prob - hot) * grad / prob.shape[0], nd.zeros_like(target)
def logits(cosine, target):
    hot = nd.one_hot(nd.maximum(target, 0), cosine.shape[1]) * (target >= 0).reshape((-1, 1))
    return (cosine - 0.4 * hot) * 64
x, w = nd.array(X[mine]), nd.array(W[start:start + count])
whole_x, whole_w = nd.array(X), nd.array(W)
for array in (x, w, whole_x, whole_w):
    array.attach_grad()
with autograd.record():
    labels = gathered(1, nd.array(Y[mine]), mine) - start
    target = nd.where((labels >= 0) * (labels < count), labels, -nd.ones_like(labels))
    cosine = nd.dot(nd.L2Normalization(Gather()(x)), nd.L2Normalization(w), transpose_b=True)
    loss = SoftmaxLoss()(logits(cosine, target), target)
    cosine = nd.dot(nd.L2Normalization(whole_x), nd.L2Normalization(whole_w), transpose_b=True)
    y = nd.array(Y)
    whole = -nd.pick(nd.log_softmax(logits(cosine, y), axis=1), y, axis=1).mean()
loss.backward()
whole.backward()
scale = float(nd.abs(whole_w.grad).max().asscalar())
print(json.dumps({"loss": float(loss.asscalar()), "whole": float(whole.asscalar()),
                  "x": float(nd.abs(x.grad - whole_x.grad[mine] * 2).max().asscalar()) / scale,
                  "w": float(nd.abs(w.grad - whole_w.grad[start:start + count]).max()
                             .asscalar()) / scale}))
"""


def test_the_store_carries_a_head_split_by_class(mxnet_python: str) -> None:
    """What the pfc strategy (_mxnet_classes) is built on: on two CPU ranks over ``dist_sync``, the
    embeddings and labels all-gathered as pushpulls of zero-padded buffers, the row maxima as a
    gathered row of each rank's, the sums of exponentials and the own class's probability
    pushpulled, the embeddings' gradient summed in backward (``autograd.Function``). Measured
    (2026-11-29): the loss is the whole head's to float32 rounding on both ranks, the gradients
    within 3.7e-6 of the largest."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "GLOG_minloglevel": "2", "MASTER_ADDR": "127.0.0.1",
           "DLPERF_FRAMEWORK_PORT": str(free_ports(1)[0])}
    ranks: list[Any] = run_together(mxnet_python, [SPLIT.replace("RANK", str(rank))
                                                   for rank in (0, 1)], env)
    for rank in ranks:
        assert rank["loss"] == pytest.approx(rank["whole"], rel=1e-6), rank
        assert rank["x"] < 1e-5 and rank["w"] < 1e-5, rank
