"""InsightFace (DLPerf's face-recognition special case): a backbone maps a 112 x 112 face to an
embedding, and a fully connected head over every identity trains it with a margin loss; the head
outgrows one device as the identities grow, so it is split over the ranks by class (the ``pfc``
layout kind: model-parallel FC, and Partial FC with a sample ratio), and the largest number of
classes that fits is searched (``--dlperf-size num_classes=max``).

The model of DLPerf's scripts (OneFlow's ``oneflow_face``, deepinsight's MXNet insightface, and
arcface_torch where InsightFace lives today): an IResNet (100 layers on a GPU) or MobileFaceNet
backbone, embedding 512, the head's centres and the embeddings L2-normalized, their cosines
scaled by 64 with an additive angular margin of 0.5 on each sample's own class (ArcFace) or an
additive cosine margin of 0.4 (CosFace), softmax cross-entropy; SGD with momentum 0.9, weight
decay 5e-4 and lr 0.1 per 512 samples (arcface_torch's). The head's centres start normal with
std 0.01, the backbone as torch's defaults (Kaiming-uniform convolutions).

Inputs are synthetic: one batch of normal images held on the device, and labels drawn uniformly
over the classes afresh every step (seeded by the case's seed and the rank), so that the classes
a step touches move as a real epoch's do, and Partial FC samples around different positives.

Sizes: on CUDA DLPerf's (IResNet-100, batch 64 per device, face_emore's 85,744 classes); on CPU
MobileFaceNet at batch 32 with the same 85,744 classes. ``num_classes`` is the size a sweep or
the largest-size search varies.

The recipes are in ``torch``, ``oneflow`` and ``mxnet``; this
module holds the sizes, the arithmetic and the workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...core.workload import SGD, SizeValue, Workload, WorkloadError

BACKBONES = {
    # name: IResNet's blocks per stage, or None for MobileFaceNet
    "mobilefacenet": None,
    "iresnet18": (2, 2, 2, 2),
    "iresnet34": (3, 4, 6, 3),
    "iresnet50": (3, 4, 14, 3),
    "iresnet100": (3, 13, 30, 3),
}
MARGINS = {"arcface": 0.5, "cosface": 0.4}  # the margin each loss adds (angle, or cosine)
CUDA_SIZES: dict[str, SizeValue] = {
    "num_classes": 85_744, "embedding": 512, "backbone": "iresnet100", "margin": "arcface",
    "scale": 64.0, "image": 112}
CPU_SIZES: dict[str, SizeValue] = {**CUDA_SIZES, "backbone": "mobilefacenet"}


@dataclass(frozen=True)
class FaceShape:
    """A face-recognition model's dimensions, read from a case's sizes."""

    num_classes: int
    embedding: int
    backbone: str
    margin: str
    scale: float
    image: int

    @classmethod
    def of(cls, sizes: Mapping[str, SizeValue]) -> FaceShape:
        def whole(name: str) -> int:
            value = sizes[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"insightface: size {name!r} must be a positive integer, "
                                    f"got {value!r}")
            return value

        backbone, margin = str(sizes["backbone"]), str(sizes["margin"])
        if backbone not in BACKBONES:
            raise WorkloadError(f"insightface: backbone {backbone!r} is not one of "
                                f"{', '.join(BACKBONES)}")
        if margin not in MARGINS:
            raise WorkloadError(f"insightface: margin {margin!r} is not one of "
                                f"{', '.join(MARGINS)}")
        shape = cls(whole("num_classes"), whole("embedding"), backbone, margin,
                    float(sizes["scale"]), whole("image"))
        if shape.image != 112:
            raise WorkloadError(f"insightface: image {shape.image}: the backbones take 112 x 112 "
                                "faces (their last feature map is 7 x 7)")
        return shape

    @property
    def head_parameters(self) -> int:
        """The head's centres: one embedding-sized row a class."""
        return self.num_classes * self.embedding


def head_bytes_per_rank(sizes: Mapping[str, SizeValue], ranks: int = 1, copies: int = 3,
                        bytes_each: int = 4) -> float:
    """What the head costs the rank that holds the most classes: its centres (the classes
    divided over ``ranks``, the first ranks taking one more where they do not divide) times the
    copies kept of each (the weight, its gradient, SGD's momentum: 3)."""
    shape = FaceShape.of(sizes)
    rows = -(-shape.num_classes // ranks)
    return rows * shape.embedding * copies * bytes_each


WORKLOAD = Workload(
    name="insightface",
    unit="samples",
    batch_size={"cuda": 64, "cpu": 32},
    sizes={name: (CUDA_SIZES[name] if CUDA_SIZES[name] == CPU_SIZES[name]
                  else {"cuda": CUDA_SIZES[name], "cpu": CPU_SIZES[name]})
           for name in CUDA_SIZES},
    optimizer=SGD(lr_per_256=0.05, momentum=0.9, weight_decay=5e-4),
    recipes={"torch": "pytest_dlperf.models.insightface.torch:recipe",
             "oneflow": "pytest_dlperf.models.insightface.oneflow:recipe",
             "mxnet": "pytest_dlperf.models.insightface.mxnet:recipe"},
    # pfc: the head split over the ranks by class (pfc2, and Partial FC: pfc2-r0.1)
    layouts=("dp", "pfc"),
)
