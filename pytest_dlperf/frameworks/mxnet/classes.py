"""MXNet's strategy for the ``pfc`` layout kind: a classifier's head split over the ranks by class
(InsightFace's model-parallel FC, and its Partial FC), torch's algorithm
(``frameworks.torch.classes``) written on MXNet's distributed key-value store.

Each rank trains the backbone on a batch of its own (its gradients summed through the store, as
every data-parallel gradient) and holds the centres of its share of the classes (the first
``classes % N`` ranks one more), which neither rank 0's broadcast nor the store's sum touches
(``MXNetPart.held``). A step:

1. the ranks' embeddings and labels are all-gathered: each rank's rows in a buffer of zeros,
   pushpulled (the store's sum); the embeddings through an ``autograd.Function`` whose backward
   pushpulls their gradient and keeps this rank's rows;
2. each rank takes the cosines of every gathered embedding with its own centres, the margin on
   the samples whose class it holds (the head's ``logits``, the target -1 elsewhere);
3. the softmax over all classes across the ranks: the rows' maxima gathered (a row of each
   rank's), the sums of exponentials and each sample's own-class probability pushpulled; the
   loss is the global batch's mean, the same on every rank;
4. backward: the local logits' gradient, (softmax - one-hot) / global batch from what forward
   kept, times the ranks: ``Trainer.update(world)`` divides every gradient by the ranks (the
   backbone's are sums), the head's own included.

Partial FC (``pfc2-r0.1``): each step a rank keeps ``ratio`` of its centres, every class of the
batch it holds among them and the rest drawn at random (numpy, seeded by the case's seed and the
rank as torch's generator is); the labels are read on the host to draw them (a wait on the
engine each step). Only the kept centres get a gradient.

Runs inside a rank; MXNet is passed in, never imported at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.kinds import LayoutError
from ...core.kinds.pfc import class_range, sample_ratio
from ...core.strategies import only_kind, register_strategy
from ...core.workload import WorkloadError
from .runtime import MXNetPart

# The split head's store keys, beyond the trainer's (0 .. 2n-1) and the phase plan's (1e6 on).
FIRST_KEY = 2_000_000
# Measured 2026-12-01, MXNet 1.9.1 on two CPU ranks (the check let through): the hybridized model
# hands its head Symbols, and the split is NDArray pushpulls inside autograd.Functions.
HYBRIDIZED = ("the split head under hybridize: a hybridized model hands its head Symbols, and the "
              "split's all-gathers and sums are the store's NDArray pushpulls inside "
              "autograd.Functions (tried: \"AttributeError: 'Symbol' object has no attribute "
              "'shape'\" in the split's all-gather); run the eager case")


@dataclass(frozen=True)
class SplitHead:
    """The head's centres split over the ``pfc`` ranks by class; the rest data parallel."""

    kind: str = "pfc"

    def why_not(self, kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
        alone = only_kind("pfc", kinds,
                          "the mxnet adapter splits a head beside a data-parallel backbone only")
        if alone:
            return alone
        return HYBRIDIZED if compiled else None

    def apply(self, part: MXNetPart) -> None:
        split_head(part)


register_strategy("mxnet", SplitHead())


def split_head(part: MXNetPart) -> None:
    layout = part.layout
    try:
        ratio = sample_ratio(layout.options_of("pfc"))
    except LayoutError as exc:
        raise WorkloadError(f"layout {layout.id}: {exc}") from None
    if part.spec.optimizer.clip_norm is not None:
        raise WorkloadError("gradient clipping under a pfc layout: the norm over the head's "
                            "shards is not written; clear the optimizer's clip_norm")
    name = part.parts.plan("pfc")
    head = _head(part.module, name, layout.id)
    rank, world = layout.coordinates(part.rank).get("pfc", 0), layout.degree("pfc")
    old = head.weight
    classes = old.shape[0]
    if classes < world:
        raise WorkloadError(f"layout {layout.id}: {classes} classes cannot be split over "
                            f"{world} ranks; take more classes or fewer ranks")
    start, count = class_range(classes, rank, world)
    new = part.mx.gluon.Parameter(old.name, shape=(count, old.shape[1]), dtype=old.dtype,
                                  grad_req=old.grad_req)
    new.initialize(ctx=part.context)
    new.set_data(old.data(part.context)[start:start + count])
    _replace(head, "weight", old, new)
    seed = part.spec.seed * 1_000_003 + 7919 * rank + 1
    head.split = ClassSplit(part.mx, Collectives(part.mx, part.store, rank, world), start,
                            count, ratio, seed)
    part.held.append(new)
    part.notes["pfc"] = {"head": name, "classes": classes, "sample_ratio": ratio,
                         "ranks": [[r, *class_range(classes, r, world)] for r in range(world)]}


def _replace(head: Any, name: str, old: Any, new: Any) -> None:
    """``head``'s parameter ``name`` replaced by ``new``. Gluon 1.x keeps a block's parameter in
    two places, the dict forward reads (``_reg_params``) and the ``ParameterDict`` that
    ``collect_params`` reads, and refuses to override the attribute; both private, frozen since
    MXNet 1.9.1 (its last release)."""
    head._reg_params[name] = new
    head.params._params[old.name] = new
    object.__setattr__(head, name, new)


def _head(model: Any, name: Any, layout: str) -> Any:
    if not isinstance(name, str) or not name:
        raise WorkloadError(
            f"layout {layout} splits a classifier's head, and the recipe names none: give "
            "Parts(plans={'pfc': '<the head block's name>'}) (models/insightface/mxnet.py does)")
    head = model
    for attribute in name.split("."):
        head = getattr(head, attribute, None)
    weight = getattr(head, "weight", None)
    if head is None or len(getattr(weight, "shape", ())) != 2 or not hasattr(
            head, "logits") or not hasattr(head, "split"):
        raise WorkloadError(
            f"layout {layout}: Parts.plans['pfc'] names {name!r}, and the model has no block "
            "there the pfc strategy splits: it needs a weight of [classes, embedding], a "
            "logits(cosine, target) method and a split attribute its forward hands the loss to "
            "(models/insightface/mxnet.py's MarginHead)")
    return head


class Collectives:
    """Sums and all-gathers over the ``pfc`` ranks through the store: each a pushpull under a
    key of its own, made on first use (every rank calls them in the same order); on one rank
    (no store) what this rank has."""

    def __init__(self, mx: Any, store: Any, rank: int, world: int) -> None:
        self.nd, self.store, self.rank, self.world = mx.nd, store, rank, world
        self.keys: dict[tuple[str, tuple[int, ...]], int] = {}

    def summed(self, name: str, value: Any) -> Any:
        if self.store is None:
            return value.copy()
        key = self.keys.get((name, value.shape))
        if key is None:
            key = self.keys[(name, value.shape)] = FIRST_KEY + len(self.keys)
            self.store.init(key, self.nd.zeros_like(value))
        out = self.nd.zeros_like(value)
        self.store.pushpull(key, value, out=out)
        return out

    def gathered(self, name: str, value: Any) -> Any:
        """Every rank's ``value`` (the same shape on each) stacked along the first axis."""
        rows = value.shape[0]
        buffer = self.nd.zeros((rows * self.world, *value.shape[1:]), ctx=value.context,
                               dtype=value.dtype)
        buffer[self.rank * rows:(self.rank + 1) * rows] = value
        return self.summed(name, buffer)


class ClassSplit:
    """The loss of a head whose centres this rank holds ``count`` of, from ``start``."""

    def __init__(self, mx: Any, collectives: Collectives, start: int, count: int,
                 ratio: float, seed: int) -> None:
        import numpy

        self.mx, self.collectives = mx, collectives
        self.start, self.count, self.ratio = start, count, ratio
        self.random = numpy.random.RandomState(seed % 2**32)
        self.sampled: Any = None  # the classes the last step kept (Partial FC), for checks

    def __call__(self, head: Any, embeddings: Any, labels: Any, weight: Any) -> Any:
        nd, each = self.mx.nd, self.collectives
        gathered = _gather(self.mx, each)(embeddings)
        local = each.gathered("labels", labels.astype(embeddings.dtype)) - self.start
        mine = (local >= 0) * (local < self.count)
        target = nd.where(mine, local, -nd.ones_like(local))
        if self.ratio < 1:  # the batch's classes among the kept centres: their columns
            target, index = self.sample(target)
            weight = nd.take(weight, nd.array(index, ctx=weight.context, dtype="int64"))
        norm = nd.L2Normalization
        cosine = nd.dot(norm(gathered, mode="instance", eps=1e-24),
                        norm(weight, mode="instance", eps=1e-24), transpose_b=True)
        if __import__("numpy").dtype(cosine.dtype).itemsize < 4:  # float32 at least
            cosine = cosine.astype("float32")
        return _softmax_loss(self.mx, each)(head.logits(cosine, target), target)

    def sample(self, target: Any) -> tuple[Any, Any]:
        """The targets as columns of the kept centres, and the kept centres' indices."""
        numpy = __import__("numpy")
        host = target.asnumpy()
        index = sample(numpy, host[host >= 0].astype("int64"), self.count, self.ratio,
                       self.random)
        self.sampled = index + self.start
        column = numpy.searchsorted(index, numpy.clip(host, 0, self.count - 1))
        mapped = numpy.where(host >= 0, column, -1).astype(host.dtype)
        return self.mx.nd.array(mapped, ctx=target.context, dtype=target.dtype), index


def sample(numpy: Any, positives: Any, count: int, ratio: float, random: Any) -> Any:
    """The sorted indices of the centres a step keeps: every one of ``positives`` (the batch's
    classes this rank holds), then random others up to ``ratio`` of ``count`` (all positives
    where they are more)."""
    keep = max(1, int(ratio * count))
    positives = numpy.unique(positives)
    if positives.size >= keep:
        return positives
    score = random.random_sample(count)
    score[positives] = 2.0  # above any draw: always kept
    return numpy.sort(numpy.argsort(-score, kind="stable")[:keep])


def _gather(mx: Any, each: Collectives) -> Any:
    """An all-gather along the batch whose backward sums the gradients over the ranks and
    keeps this rank's rows."""

    class Gather(mx.autograd.Function):  # type: ignore[misc]
        def forward(self, tensor: Any) -> Any:
            self.rows = tensor.shape[0]
            return each.gathered("embeddings", tensor)

        def backward(self, grad: Any) -> Any:
            rows = self.rows
            return each.summed("embeddings_grad", grad)[each.rank * rows:(each.rank + 1) * rows]

    return Gather()


def _softmax_loss(mx: Any, each: Collectives) -> Any:
    """Softmax cross-entropy over classes split across the ranks: ``(logits, target)``, logits
    [global batch, this rank's classes], target the column of each row's class on this rank
    (-1 elsewhere); the global batch's mean loss on every rank."""
    nd = mx.nd

    class SoftmaxLoss(mx.autograd.Function):  # type: ignore[misc]
        def forward(self, logits: Any, target: Any) -> Any:
            top = each.gathered("max", logits.max(axis=1).reshape((1, -1))).max(axis=0)
            prob = nd.exp(nd.broadcast_sub(logits, top.reshape((-1, 1))))
            total = each.summed("sum", prob.sum(axis=1))
            prob = nd.broadcast_div(prob, total.reshape((-1, 1)))
            hot = self.hot = _one_hot(nd, target, logits.shape[1])
            own = each.summed("own", (prob * hot).sum(axis=1))
            self.save_for_backward(prob, target)
            return -nd.log(nd.maximum(own, 1e-300 if own.dtype == "float64" else 1e-30)).mean()

        def backward(self, grad: Any) -> Any:
            prob, target = self.saved_tensors
            scale = nd.broadcast_mul(grad, nd.ones((1,), ctx=grad.context, dtype=grad.dtype)
                                     * (each.world / prob.shape[0]))
            return nd.broadcast_mul(prob - self.hot, scale.reshape((1, 1))), nd.zeros_like(
                target)

    return SoftmaxLoss()


def _one_hot(nd: Any, target: Any, depth: int) -> Any:
    """Each row's one-hot of its column; a row of zeros where the target is -1."""
    return nd.one_hot(target, depth=depth, dtype=target.dtype)
