"""InsightFace's torch model (models/insightface/__init__.py, models/insightface/torch.py): the backbones
end in the embedding at 112 x 112, the sizes are checked, the labels are drawn afresh each step
and per rank, and the margins do what ArcFace and CosFace say."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from pytest_dlperf.core.workload import BuildContext, WorkloadError  # noqa: E402
from pytest_dlperf.models import insightface  # noqa: E402
from pytest_dlperf.models.insightface.torch import build, recipe  # noqa: E402

SMALL = {**insightface.CPU_SIZES, "num_classes": 100}


@pytest.mark.parametrize("backbone", ["mobilefacenet", "iresnet18", "iresnet100"])
def test_each_backbone_maps_a_face_to_the_embedding(backbone: str) -> None:
    shape = insightface.FaceShape.of({**SMALL, "backbone": backbone})
    with torch.device("meta"):
        model = build(shape)
        embeddings = model.backbone(torch.empty(2, 3, 112, 112))
    assert tuple(embeddings.shape) == (2, 512)
    assert tuple(model.head.weight.shape) == (100, 512)


def test_iresnet100_is_insightfaces_size() -> None:
    with torch.device("meta"):
        model = build(insightface.FaceShape.of({**SMALL, "backbone": "iresnet100"}))
    # arcface_torch's r100 at embedding 512: 65.1M parameters (its model zoo's 249 MB fp32)
    backbone = sum(p.numel() for p in model.backbone.parameters())
    assert 64e6 < backbone < 66e6, backbone


@pytest.mark.parametrize(("sizes", "says"), [
    ({"backbone": "resnet50"}, "backbone 'resnet50' is not one of mobilefacenet, iresnet18"),
    ({"margin": "sphereface"}, "margin 'sphereface' is not one of arcface, cosface"),
    ({"image": 224}, "image 224: the backbones take 112 x 112"),
    ({"num_classes": 0}, "size 'num_classes' must be a positive integer"),
])
def test_bad_sizes_say_which_and_what_is_taken(sizes: dict, says: str) -> None:
    with pytest.raises(WorkloadError, match=says):
        insightface.FaceShape.of({**SMALL, **sizes})


def context(rank: int, **sizes: object) -> BuildContext:
    return BuildContext("torch", "cpu", "cpu", 2, {**SMALL, **sizes}, "fp32", "float32", False,
                        7, rank, 2, rank)


def test_labels_are_drawn_every_step_and_differ_between_ranks() -> None:
    first, second = recipe(context(0)), recipe(context(1))
    a = first.inputs()[1].clone()
    b = first.inputs()[1].clone()
    other = second.inputs()[1].clone()
    assert not torch.equal(a, b) and not torch.equal(a, other)
    assert int(a.min()) >= 0 and int(a.max()) < 100
    # the same weights on every rank
    assert torch.equal(first.model.head.weight, second.model.head.weight)


@pytest.mark.parametrize(("margin", "cosine", "own"), [
    ("cosface", 0.6, 0.6 - 0.4), ("arcface", 0.6, math.cos(math.acos(0.6) + 0.5))])
def test_the_margin_moves_only_the_samples_own_class(margin: str, cosine: float,
                                                       own: float) -> None:
    model = build(insightface.FaceShape.of({**SMALL, "margin": margin, "scale": 2.0}))
    cosines = torch.full((2, 3), cosine, dtype=torch.float64)
    logits = model.head.logits(cosines, torch.tensor([1, -1]))  # row 1's class is elsewhere
    assert logits.flatten().tolist() == pytest.approx([1.2, 2 * own, 1.2, 1.2, 1.2, 1.2])


def test_on_the_meta_device_the_recipe_holds_no_weights() -> None:
    # FLOPs are counted in rank 0 after its windows on the meta device: weights built on the
    # CPU there would add a whole model to what the rank holds at the memory limit's edge.
    ctx = BuildContext("torch", "cpu", "meta", 2, SMALL, "fp32", "float32", False, 7, 0, 1, 0)
    parts = recipe(ctx)
    assert {p.device.type for p in parts.model.parameters()} == {"meta"}
