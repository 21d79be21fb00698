"""OneFlow's strategy for the ``pfc`` layout kind, the way oneflow_face trains InsightFace: the
head's centres a global tensor split over the kind's ranks by class (``flow.sbp.split(0)``), the
backbone broadcast (data parallel), the batch split over the ranks (each rank's own per-device
batch), and OneFlow's SBP inference inserting the collectives.

A step: the embeddings and the labels go from split to broadcast (all-gathers); their cosines
with the split centres come out split by class (``split(1)``, no collective); the fused margin
(``combined_margin_loss``) and softmax cross-entropy (``sparse_softmax_cross_entropy``, whose
model-parallel kernel all-reduces the rows' maxima and sums) take the split logits and the
broadcast labels, each rank finding its own columns from the split; the loss is the global
batch's mean (a partial sum, made whole where it is read). Backward is OneFlow's autograd of the
same: the embeddings' gradient, a partial sum, is reduce-scattered back to each rank's samples,
and the backbone's gradients are made whole for the update. Since the loss is the global
batch's mean, nothing is rescaled (torch's strategy multiplies by the ranks: there the backbone's
gradients are averaged).

Partial FC (``pfc2-r0.1``): ``flow.distributed_partial_fc_sample``, oneflow_face's op, has no
CPU kernel in OneFlow 0.9 (``SAMPLE_OP``), so the sampling is written here: each rank keeps the
same number of its centres (oneflow_face's ``int(ratio * ceil(classes / ranks))``, more where the
batch's classes on some rank outnumber it, fewer on a rank with fewer centres: OneFlow's split
must stay balanced), every class of the global batch it holds among them, the rest drawn at
random (seeded by the case's seed and the rank); the kept centres form a split global tensor,
and the labels are mapped to their columns among every rank's kept centres (an all-gather of
the kept class ids).

The recipe names the head in ``Parts.plans["pfc"]``: a module with a ``weight`` of [classes,
embedding], a ``logits(cosine, target)`` method (the margin and the scale) and a ``split``
attribute that its forward hands the loss to (``models/insightface/oneflow.py``'s
``MarginHead``).

Runs inside a rank; OneFlow is passed in, never imported at module level (the leading
underscore keeps ``frameworks.known_frameworks`` from taking it for an adapter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.kinds import LayoutError
from ...core.kinds.pfc import class_range, sample_ratio
from ...core.strategies import only_kind, register_strategy
from ...core.workload import WorkloadError
from .parallel import OneFlowPart

# Measured 2026-11-29, OneFlow 0.9.0 on CPU: oneflow_face's sampling op has no CPU kernel.
SAMPLE_OP = ("flow.distributed_partial_fc_sample has no CPU kernel in OneFlow 0.9 ('Cannot find "
             "the kernel matching Current OperatorConf ... op_type_name: "
             "distributed_partial_fc_sample DeviceType_Name: kCPU')")
# Measured 2026-11-29, OneFlow 0.9.0 on 2 CPU processes: the sampling written here reads the
# batch's classes on each rank, which a graph does not let it.
GRAPH_SAMPLING = ("Partial FC under nn.Graph: the sampling written here (for want of a CPU "
                  "kernel of flow.distributed_partial_fc_sample) reads the batch's labels on "
                  "each rank, and OneFlow 0.9's graph refuses it ('global_tensor.to_local() is "
                  "not supported within nn.Graph for now'); run the eager case, or pfc without "
                  "a ratio")


@dataclass(frozen=True)
class SplitHead:
    """The head's centres a global tensor split by class over the ranks; the rest broadcast."""

    kind: str = "pfc"

    def why_not(self, kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
        alone = only_kind("pfc", kinds,
                          "the oneflow adapter splits a head beside a data-parallel backbone only")
        if alone:
            return alone
        return None  # nn.Graph runs it (Partial FC's sampling excepted: split_head refuses)

    def apply(self, part: OneFlowPart) -> None:
        split_head(part)


register_strategy("oneflow", SplitHead())


def split_head(part: OneFlowPart) -> None:
    flow, layout = part.flow, part.layout
    try:
        ratio = sample_ratio(layout.options_of("pfc"))
    except LayoutError as exc:
        raise WorkloadError(f"layout {layout.id}: {exc}") from None
    if ratio < 1 and part.spec.compiled:  # why_not sees the kinds, not the ratio
        raise WorkloadError(f"layout {layout.id}: {GRAPH_SAMPLING}")
    if part.spec.optimizer.clip_norm is not None:
        raise WorkloadError("gradient clipping under a pfc layout on OneFlow: not checked "
                            "against one process here; clear the optimizer's clip_norm")
    name = part.parts.plan("pfc")
    head = _head(part.module, name, layout.id)
    world, rank = layout.world_size, flow.env.get_rank()
    classes = head.weight.shape[0]
    if classes < world:
        raise WorkloadError(f"layout {layout.id}: {classes} classes cannot be split over "
                            f"{world} ranks; take more classes or fewer ranks")
    weight = head.weight
    head.weight = flow.nn.Parameter(weight.to_global(part.placement, flow.sbp.split(0)),
                                    requires_grad=weight.requires_grad)
    generator = flow.Generator(device=part.placement.type)
    generator.manual_seed(part.spec.seed * 1_000_003 + 7919 * rank + 1)
    head.split = ClassSplit(flow, part.placement, classes, rank, world, ratio, generator)
    part.notes["pfc"] = {"head": name, "classes": classes, "sample_ratio": ratio,
                         "ranks": [[r, *class_range(classes, r, world)] for r in range(world)]}


def _head(model: Any, name: Any, layout: str) -> Any:
    if not isinstance(name, str) or not name:
        raise WorkloadError(
            f"layout {layout} splits a classifier's head, and the recipe names none: give "
            "Parts(plans={'pfc': '<the head module's name>'}) (models/insightface/oneflow.py "
            "does)")
    head = dict(model.named_modules()).get(name)
    if head is None:
        raise WorkloadError(f"layout {layout}: Parts.plans['pfc'] names {name!r}, and the "
                            f"model ({type(model).__name__}) has no such module")
    weight = getattr(head, "weight", None)
    if getattr(weight, "ndim", 0) != 2 or not hasattr(head, "logits") or not hasattr(
            head, "split"):
        raise WorkloadError(
            f"layout {layout}: the head {name!r} ({type(head).__name__}) is not one the pfc "
            "strategy splits: it needs a weight of [classes, embedding], a logits(cosine, "
            "target) method and a split attribute its forward hands the loss to "
            "(models/insightface/oneflow.py's MarginHead)")
    return head


class ClassSplit:
    """The loss of a head whose centres are a global tensor split by class."""

    def __init__(self, flow: Any, placement: Any, classes: int, rank: int, world: int,
                 ratio: float, generator: Any) -> None:
        self.flow, self.placement, self.ratio, self.generator = flow, placement, ratio, generator
        self.ranges = [class_range(classes, r, world) for r in range(world)]
        self.start, self.count = self.ranges[rank]
        # oneflow_face's share of a rank's centres: of the largest rank's count
        self.keep = max(1, int(ratio * self.ranges[0][1]))
        self.sampled: Any = None  # the classes the last step kept on this rank, for checks

    def __call__(self, head: Any, embeddings: Any, labels: Any) -> Any:
        flow = self.flow
        broadcast = flow.sbp.broadcast
        gathered = embeddings.to_global(placement=self.placement, sbp=broadcast)
        labels = labels.to_global(placement=self.placement, sbp=broadcast)
        weight = head.weight
        if self.ratio < 1:
            weight, labels = self.sample(weight, labels)
        norm = flow.nn.functional.normalize
        cosine = norm(gathered, dim=1).matmul(norm(weight, dim=1).t())  # split(1): by class
        if cosine.dtype in (flow.float16, flow.bfloat16):
            cosine = cosine.float()
        logits = head.logits(cosine, labels)
        return flow.nn.functional.sparse_softmax_cross_entropy(labels, logits).mean()

    def sample(self, weight: Any, labels: Any) -> tuple[Any, Any]:
        """The kept centres (a split global tensor) and the labels as their columns."""
        flow = self.flow
        every = labels.to_local()  # the global batch's classes, on every rank
        held = [0]  # each rank's classes in the batch: every rank keeps as many (balanced)
        for start, count in self.ranges:
            inside = every[(every >= start) & (every < start + count)]
            held.append(int(flow.unique(inside).numel()) if inside.numel() else 0)
        keep = min(max(self.keep, *held), self.count)
        mine = every[(every >= self.start) & (every < self.start + self.count)] - self.start
        index = sample(flow, mine, self.count, keep, self.generator)
        self.sampled = index + self.start
        kept = weight.to_local()[index].to_global(placement=self.placement,
                                                  sbp=flow.sbp.split(0))
        ids = self.sampled.to_global(placement=self.placement, sbp=flow.sbp.split(0))
        ids = ids.to_global(placement=self.placement, sbp=flow.sbp.broadcast).to_local()
        column = flow.full((self.ranges[-1][0] + self.ranges[-1][1],), -1, dtype=flow.int64,
                           device=every.device)
        column[ids] = flow.arange(ids.numel(), dtype=flow.int64, device=every.device)
        mapped = column[every].to_global(placement=self.placement, sbp=flow.sbp.broadcast)
        return kept, mapped


def sample(flow: Any, positives: Any, count: int, keep: int, generator: Any) -> Any:
    """The sorted indices of ``keep`` of ``count`` centres: every one of ``positives`` (the
    batch's classes this rank holds, ``keep`` at least as many), then random others."""
    score = flow.rand(count, generator=generator, dtype=flow.float64, device=positives.device)
    if positives.numel():
        score[flow.unique(positives)] = 2.0  # above any draw: always kept
    return flow.topk(score, keep).indices.sort().values
