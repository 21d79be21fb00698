"""torch's strategy for the ``pfc`` layout kind: a classifier's head split over the kind's ranks by
class (InsightFace's model-parallel FC), as arcface_torch's Partial FC does it, written here.

Each rank trains the backbone on a batch of its own (its gradients averaged over the ranks after
backward, ``TorchPart.averaged``) and holds the centres of its share of the classes (the first
``classes % N`` ranks one more). A step:

1. the ranks' embeddings and labels are all-gathered (the embeddings through an autograd
   function whose backward sums their gradients over the ranks and keeps this rank's rows);
2. each rank takes the cosines of every gathered embedding with its own centres, the margin on
   the samples whose class it holds;
3. the softmax over all classes is taken across the ranks: the logits' row maxima and the sums
   of their exponentials all-reduced, the probability of each sample's own class from the rank
   that holds it; the loss is the global batch's mean, the same on every rank;
4. backward: the local logits' gradient is (softmax - one-hot) / global batch, computed from what
   the forward kept (no collective); the embeddings' gradient is summed over the ranks.

Partial FC (``pfc2-r0.1``): each step a rank keeps ``ratio`` of its centres, every class of the
batch it holds among them and the rest drawn at random (seeded by the case's seed and the rank);
the loss is the softmax over the kept centres, and only they get a gradient.

The recipe names the head in ``Parts.plans["pfc"]``: a module with a ``weight`` of [classes,
embedding], a ``logits(cosine, target)`` method (the margin and the scale) and a ``split``
attribute that its forward hands the loss to (``models/insightface/torch.py``'s ``MarginHead``).

Runs inside a rank; torch is imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.kinds import LayoutError
from ...core.kinds.pfc import class_range, sample_ratio
from ...core.strategies import TorchPart, only_kind, register_strategy
from ...core.workload import WorkloadError


@dataclass(frozen=True)
class SplitHead:
    """The head's centres split over the ``pfc`` ranks by class; the rest data parallel."""

    kind: str = "pfc"

    def why_not(self, kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
        alone = only_kind("pfc", kinds,
                          "the torch adapter splits a head beside a data-parallel backbone only")
        if alone:
            return alone
        if compiled:
            return ("torch.compile of the split head: not tried here (its collectives sit in "
                    "autograd functions of their own); run the eager case")
        return None

    def apply(self, part: TorchPart) -> None:
        split_head(part)


register_strategy("torch", SplitHead())


def split_head(part: TorchPart) -> None:
    torch = part.torch
    try:
        ratio = sample_ratio(part.layout.options_of("pfc"))
    except LayoutError as exc:
        raise WorkloadError(f"layout {part.layout.id}: {exc}") from None
    if part.spec.optimizer.clip_norm is not None:
        raise WorkloadError("gradient clipping under a pfc layout: the norm over the head's "
                            "shards is not written; clear the optimizer's clip_norm")
    name = part.parts.plan("pfc")
    head = _head(part.module, name, part.layout.id)
    group = part.mesh["pfc"].get_group()
    dist = torch.distributed
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    classes = head.weight.shape[0]
    if classes < world:
        raise WorkloadError(f"layout {part.layout.id}: {classes} classes cannot be split over "
                            f"{world} ranks; take more classes or fewer ranks")
    start, count = class_range(classes, rank, world)
    with torch.no_grad():
        head.weight = torch.nn.Parameter(head.weight[start:start + count].clone())
    generator = torch.Generator(device=head.weight.device)
    generator.manual_seed(part.spec.seed * 1_000_003 + 7919 * rank + 1)
    head.split = ClassSplit(group, start, count, ratio, generator)
    held = id(head.weight)
    part.averaged.append(([p for p in part.module.parameters()
                           if id(p) != held and p.requires_grad], group))
    part.notes["pfc"] = {"head": name, "classes": classes, "sample_ratio": ratio,
                         "ranks": [[r, *class_range(classes, r, world)] for r in range(world)]}


def _head(model: Any, name: Any, layout: str) -> Any:
    if not isinstance(name, str) or not name:
        raise WorkloadError(
            f"layout {layout} splits a classifier's head, and the recipe names none: give "
            "Parts(plans={'pfc': '<the head module's name>'}) (models/insightface/torch.py does)")
    try:
        head = model.get_submodule(name)
    except AttributeError:
        raise WorkloadError(f"layout {layout}: Parts.plans['pfc'] names {name!r}, and the "
                            f"model ({type(model).__name__}) has no such module") from None
    weight = getattr(head, "weight", None)
    if getattr(weight, "ndim", 0) != 2 or not hasattr(head, "logits") or not hasattr(
            head, "split"):
        raise WorkloadError(
            f"layout {layout}: the head {name!r} ({type(head).__name__}) is not one the pfc "
            "strategy splits: it needs a weight of [classes, embedding], a logits(cosine, "
            "target) method and a split attribute its forward hands the loss to "
            "(models/insightface/torch.py's MarginHead)")
    return head


class ClassSplit:
    """The loss of a head whose centres this rank holds ``count`` of, from ``start``."""

    def __init__(self, group: Any, start: int, count: int, ratio: float, generator: Any):
        self.group, self.start, self.count, self.ratio = group, start, count, ratio
        self.generator = generator
        self.sampled: Any = None  # the centres the last step kept (Partial FC), for checks
        self.gather, self.softmax_loss = _gather(group), _softmax_loss().apply

    def __call__(self, head: Any, embeddings: Any, labels: Any) -> Any:
        import torch

        gathered = self.gather(embeddings)
        labels = _gather_plain(torch, labels, self.group)
        local = labels - self.start
        mine = (local >= 0) & (local < self.count)
        weight = head.weight
        if self.ratio < 1:  # the batch's classes are among the kept centres: their columns
            index = sample(torch, local[mine], self.count, self.ratio, self.generator)
            self.sampled = index + self.start
            weight = weight[index]
            local = torch.searchsorted(index, local.clamp(0, self.count - 1))
        target = torch.where(mine, local, torch.full_like(local, -1))
        norm = torch.nn.functional.normalize
        cosine = norm(gathered).matmul(norm(weight).t())  # float32 at least, as the head's
        cosine = cosine.to(torch.promote_types(cosine.dtype, torch.float32))
        return self.softmax_loss(head.logits(cosine, target), target, self.group)


def sample(torch: Any, positives: Any, count: int, ratio: float, generator: Any) -> Any:
    """The sorted indices of the centres a step keeps: every one of ``positives`` (the batch's
    classes this rank holds), then random others up to ``ratio`` of ``count`` (all positives
    where they are more)."""
    keep = max(1, int(ratio * count))
    positives = torch.unique(positives)
    if positives.numel() >= keep:
        return positives
    score = torch.rand(count, generator=generator, device=positives.device)
    score[positives] = 2.0  # above any draw: always kept
    return torch.topk(score, keep, sorted=False).indices.sort().values


def _gather(group: Any) -> Any:
    """All-gather along the batch whose backward sums the gradients over the ranks and keeps
    this rank's rows, times the ranks: the backbone's gradients are averaged after backward
    (``TorchPart.averaged``), and each rank's rows' gradient is already the global batch's."""
    import torch

    dist = torch.distributed

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, tensor: Any) -> Any:
            world = dist.get_world_size(group)
            parts = [torch.empty_like(tensor) for _ in range(world)]
            dist.all_gather(parts, tensor.contiguous(), group=group)
            ctx.rows = tensor.shape[0]
            return torch.cat(parts)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            grad = grad.contiguous()
            dist.all_reduce(grad, group=group)
            rank, world = dist.get_rank(group), dist.get_world_size(group)
            return grad[rank * ctx.rows:(rank + 1) * ctx.rows] * world

    return Gather.apply


def _gather_plain(torch: Any, tensor: Any, group: Any) -> Any:
    parts = [torch.empty_like(tensor) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts)


def _softmax_loss() -> Any:
    """Softmax cross-entropy over classes split across the group's ranks: ``apply(logits,
    target, group)``, logits [global batch, this rank's classes], target the column of each
    row's class on this rank (-1 elsewhere); the global batch's mean loss on every rank."""
    import torch

    dist = torch.distributed

    class SoftmaxLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, logits: Any, target: Any, group: Any) -> Any:
            top = logits.max(dim=1, keepdim=True).values
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
            prob = (logits - top).exp_()
            total = prob.sum(dim=1, keepdim=True)
            dist.all_reduce(total, group=group)
            prob.div_(total)
            rows = torch.nonzero(target >= 0).squeeze(1)
            own = torch.zeros(logits.shape[0], dtype=prob.dtype, device=prob.device)
            own[rows] = prob[rows, target[rows]]
            dist.all_reduce(own, group=group)
            ctx.save_for_backward(prob, target)
            return -own.clamp_min(1e-30).log().mean()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            prob, target = ctx.saved_tensors
            rows = torch.nonzero(target >= 0).squeeze(1)
            out = prob.clone()
            out[rows, target[rows]] -= 1
            return out.mul_(grad / prob.shape[0]), None, None

    return SoftmaxLoss
