"""The port job's InsightFace ports (tests/port_job.py): each backbone and margin a port checks,
built at the CPU sizes with ``CLASSES`` classes, its parameters against torch's by name and
shape, then torch's weights (tests/port_references.py's reference) on torch's two faces in
training mode (BatchNorm on the batch's statistics, the margin and scale of ArcFace or
CosFace), under the framework's interpreter: no pytest, the framework imported inside its
function only.

Measured with OneFlow 0.9 and MXNet 1.9.1 on CPU (2026-11-29): the loss equal to torch's in
float32 (MXNet's IResNet-18 eager 1.7e-6 apart, relative), MXNet's head gradient within 3.7e-5
and 2.9e-4 of its largest (through BatchNorm over a batch of two). With no margin the loss is
not torch's (seen failing).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from port_ranks import approx

# What each framework checks, and on what: (backbone-margin, classes). OneFlow's at 100 classes
# on two faces from a seeded generator; MXNet's at 11, as first measured (torch's model from
# seed 0, then the faces, labels 3 and 7): on OneFlow's faces MXNet's MobileFaceNet-ArcFace
# loss read 1.3e-5 from torch's (relative; 2026-12-07), past the bound measured on its own.
CHECKED = {"oneflow": (("mobilefacenet-arcface", 100), ("mobilefacenet-cosface", 100),
                       ("iresnet18-arcface", 100)),
           "mxnet": (("mobilefacenet-arcface", 11), ("iresnet18-cosface", 11))}


# The table's shapes (tests/ports.py's totals, port_references.torch_shapes): this model's.
TABLE = ("mobilefacenet-arcface", 100)


def key(variant: str, classes: int) -> str:
    return f"{variant}-{classes}"


def sizes(variant: str, classes: int) -> dict[str, Any]:
    from pytest_dlperf.models.insightface import CPU_SIZES

    backbone, margin = variant.split("-")
    return {**CPU_SIZES, "num_classes": classes, "backbone": backbone, "margin": margin}


def torchs(ref: Any, variant: str) -> list[list[Any]]:
    """torch's parameters of ``variant`` (a ``key``) by name and shape, in its order."""
    prefix = f"{variant}/param/"
    return [[k[len(prefix):], list(ref[k].shape)] for k in ref.files if k.startswith(prefix)]


def torchs_state(ref: Any, variant: str) -> dict[str, Any]:
    """torch's ``state_dict()`` of ``variant``: parameters and BatchNorm's statistics."""
    return {k.split("/", 2)[2]: ref[k] for k in ref.files
            if k.startswith((f"{variant}/param/", f"{variant}/buffer/"))}


def relative(got: float, variant: str, ref: Any) -> float:
    return float(abs(got - float(ref[f"{variant}/loss"])) / abs(float(ref[f"{variant}/loss"])))


def insightface_oneflow(spec: dict[str, Any]) -> dict[str, Any]:
    """MobileFaceNet with ArcFace and with CosFace, IResNet-18 with ArcFace: torch's parameters
    by name and shape in torch's order (``shapes``: ``TABLE``'s; ``variants``: whether each
    has them), the head normal with std 0.01 (``head``), torch's loss from torch's weights."""
    import oneflow as flow

    from pytest_dlperf.models.insightface import FaceShape
    from pytest_dlperf.models.insightface.oneflow import build

    ref = np.load(spec["reference"])
    out: dict[str, Any] = {"probes": {"variants": {}, "head": {}}, "once": {}}
    losses = []
    for name, classes in CHECKED["oneflow"]:
        variant = key(name, classes)
        images, labels = (flow.tensor(ref[f"{variant}/{k}"]) for k in ("images", "labels"))
        model = build(FaceShape.of(sizes(name, classes)))
        head = model.head.weight.numpy().copy()
        shapes = [[n, list(p.shape)] for n, p in model.named_parameters()]
        if (name, classes) == TABLE:
            out["shapes"] = dict(shapes)
        out["probes"]["variants"][variant] = shapes == torchs(ref, variant)
        out["probes"]["head"][variant] = [float(head.std()), float(head.mean())]
        model.load_state_dict({n: flow.tensor(a) for n, a in torchs_state(ref, variant).items()},
                              strict=False)
        with flow.no_grad():
            losses.append(relative(float(model(images, labels)), variant, ref))
    out["outputs"] = {"eager": {"loss": max(losses)}}
    return out


def insightface_mxnet(spec: dict[str, Any]) -> dict[str, Any]:
    """MobileFaceNet with ArcFace, IResNet-18 with CosFace, eager and hybridized: torch's
    trained parameters by name and shape (``variants``: whether each has them, in MXNet's own
    order; ``shapes``: ``TABLE``'s), torch's loss and head gradient from torch's
    weights."""
    import mxnet as mx
    from mxnet import autograd

    from pytest_dlperf.models.insightface import FaceShape
    from pytest_dlperf.models.insightface.mxnet import build, load_torch_weights, named_parameters

    ref = np.load(spec["reference"])
    out: dict[str, Any] = {"probes": {"variants": {}}, "once": {}, "outputs": {}}
    for mode in ("eager", "hybridized"):
        figures: dict[str, list[float]] = {"loss": [], "head_grad": []}
        for name, classes in CHECKED["mxnet"]:
            variant = key(name, classes)
            images = mx.nd.array(ref[f"{variant}/images"])
            labels = mx.nd.array(ref[f"{variant}/labels"], dtype="int32")
            model = build(FaceShape.of(sizes(name, classes)))
            load_torch_weights(model, torchs_state(ref, variant))
            if mode == "hybridized":
                model.hybridize(static_alloc=True, static_shape=True)
            with autograd.record():  # training mode: BatchNorm on the batch's statistics
                loss = model(images, labels)
            loss.backward()
            params = named_parameters(model)
            trained = {n: list(p.shape) for n, p in params.items() if p.grad_req != "null"}
            # MXNet's own order (Gluon collects the children as it registered them)
            out["probes"]["variants"][variant] = sorted(trained.items()) == sorted(
                (n, s) for n, s in torchs(ref, variant))
            grad, wanted = params["head.weight"].grad().asnumpy(), ref[f"{variant}/head_grad"]
            figures["loss"].append(relative(float(loss.asscalar()), variant, ref))
            figures["head_grad"].append(float(np.abs(grad - wanted).max() / np.abs(wanted).max()))
        out["outputs"][mode] = {name: max(values) for name, values in figures.items()}
    # The table's shapes (a forward first: Gluon infers some shapes from the data)
    model = build(FaceShape.of(sizes(*TABLE)))
    model(images, mx.nd.array([3, 7], dtype="int32"))
    out["shapes"] = {n: list(p.shape) for n, p in named_parameters(model).items()
                     if p.grad_req != "null"}
    return out


# -- two ranks train what one process trains (tests/port_ranks.py, tests/test_ports_ranks.py) --

# torch: the head split over the ranks by class (the ``pfc`` kind, frameworks/torch/classes.py).
# One torchrun job of two processes (tests/insightface_torch_rank.py) trains each run with the
# real ``TorchTrainer``, three SGD steps (momentum, weight decay) in float64; one process trains
# the whole model on the run's global batch. name: (layout, world, options)
TORCH_RUNS: dict[str, tuple[str | None, int, dict[str, Any]]] = {
    "ddp2": (None, 2, {}),
    "pfc1": ("pfc", 1, {}),
    "pfc2": ("pfc", 2, {}),
    "pfc2-r1": ("pfc-r1", 2, {}),  # Partial FC keeping every centre: model parallel again
    "pfc2-r0.5": ("pfc-r0.5", 2, {}),
    # rank 1 reads its labels as if its classes began at 0: the same weights, other targets
    "pfc2-wrong-offset": ("pfc", 2, {"wrong_offset": 1}),
}


def torch_run(name: str, run: Any) -> None:
    result = run.ranks[0]
    assert result["environment"]["data_parallel_ranks"] == TORCH_RUNS[name][1]
    # The last step's loss: the global batch's on every class-parallel rank (the softmax's
    # sums taken over the ranks), each replica's own batch's under DDP; reported in float32.
    losses, reference = result["losses"], run.whole["loss"]
    if name.startswith("pfc"):
        assert losses == approx([reference] * len(losses), 1e-6), (losses, reference)
    else:
        assert sum(losses) / len(losses) == approx(reference, 1e-6), (losses, reference)



def torch_each_rank_holds_its_share_of_the_classes(runs: Any) -> None:
    from insightface_torch_rank import SIZES

    classes = SIZES["num_classes"]
    assert runs["ddp2"].ranks[0]["head_rows"] == [classes, classes]
    assert runs["pfc1"].ranks[0]["head_rows"] == [classes]
    assert runs["pfc2"].ranks[0]["head_rows"] == [6, 5]  # the first rank takes the odd class
    notes = runs["pfc2-r0.5"].ranks[0]["environment"]["sharded_modules"]["pfc"]
    assert notes == {"head": "head", "classes": classes, "sample_ratio": 0.5,
                     "ranks": [[0, 0, 6], [1, 6, 5]]}


def torch_partial_fc_keeps_the_batchs_classes_among_its_sampled_centres(runs: Any) -> None:
    seen = runs["pfc2-r0.5"].ranks[0]["seen"]  # rank 0's: classes 0..5, three kept a step
    assert len(seen) == 3
    for kept, labels in seen:
        mine = {int(c) for c in labels if c < 6}
        kept_set = {int(c) for c in kept}
        assert mine <= kept_set, (mine, kept_set)
        assert len(kept_set) == max(3, len(mine)) and kept_set <= set(range(6))
    assert len({tuple(int(c) for c in kept) for kept, _ in seen}) > 1  # drawn anew each step


# OneFlow: the head's centres split by class over two ranks (``pfc2``, oneflow_face's way: global
# tensors, SBP); Partial FC written here (OneFlow 0.9's sampling op has no CPU kernel). One job of
# two ranks (tests/insightface_oneflow_rank.py, OneFlow's own launcher) trains every run, three
# SGD steps (momentum, weight decay); measured 2026-11-29, of how far the parameters moved
# (37.6): pfc2 in float64 3.8e-16, pfc2 under nn.Graph in float32 3.1e-7 (the graph refuses
# float64: 'InferDataType Failed. Expected kDouble, but got kFloat'), DDP in float32 2.2e-6
# (OneFlow's DDP takes float32 only), a wrong split 1.3. name: (layout, compiler, options)
ONEFLOW_RUNS: dict[str, tuple[str | None, str, dict[str, Any]]] = {
    "ddp2": (None, "eager", {"dtype": "float32"}),
    "pfc2": ("pfc", "eager", {}),
    "pfc2-graph": ("pfc", "compiled", {"dtype": "float32"}),
    "pfc2-r0.5": ("pfc-r0.5", "eager", {}),
    # every centre moved one class on before training: the centres on the wrong classes (and,
    # at the split's edge, the wrong rank)
    "pfc2-wrong-split": ("pfc", "eager", {"wrong_split": 1}),
    "pfc2-r0.5-graph": ("pfc-r0.5", "compiled", {"dtype": "float32"}),
}
ONEFLOW_CLASSES = 23  # tests/insightface_oneflow_rank.py's SIZES: ranks hold 12 and 11


def oneflow_run(name: str, run: Any) -> None:
    ranks = run.ranks
    assert ranks[0]["environment"]["data_parallel_ranks"] == 2  # a batch of each rank's own
    assert ranks[0]["environment"]["compiled"] == (ONEFLOW_RUNS[name][1] == "compiled")
    if name.startswith("pfc"):
        # Every step's loss: the global batch's on both ranks (the partial sums made whole).
        for rank in ranks:
            assert rank["losses"] == approx(run.whole["losses"], 1e-6)
        assert ranks[0]["environment"]["layout"] == "pfc2"


def oneflow_each_rank_holds_half_the_classes(runs: Any) -> None:
    assert [rank["head_rows"] for rank in runs["ddp2"].ranks] == [ONEFLOW_CLASSES] * 2
    for name in ("pfc2", "pfc2-graph", "pfc2-r0.5"):
        assert [rank["head_rows"] for rank in runs[name].ranks] == [12, 11], name
    notes = runs["pfc2-r0.5"].ranks[0]["environment"]["sharded_modules"]["pfc"]
    assert notes == {"head": "head", "classes": ONEFLOW_CLASSES, "sample_ratio": 0.5,
                     "ranks": [[0, 0, 12], [1, 12, 11]]}


def oneflow_partial_fc_keeps_the_batchs_classes_and_softmaxes_over_its_kept_centres(
        runs: Any) -> None:
    ranges = ((0, 12), (12, 11))
    partial = runs["pfc2-r0.5"]
    for rank, (start, count) in enumerate(ranges):
        seen = partial.ranks[rank]["seen"]
        assert len(seen) == 3
        for step in seen:
            held = [{c for c in step["labels"] if s <= c < s + n} for s, n in ranges]
            kept = set(step["kept"])
            assert held[rank] <= kept, (held[rank], kept)
            # As many on each rank (OneFlow's split stays balanced): half the larger rank's 12,
            # or as many as the classes of the batch some rank holds, at most all its own.
            assert len(kept) == min(max(6, *map(len, held)), count), (kept, held)
            assert kept <= set(range(start, start + count))
            assert step["every"] == sorted(step["every"]) and kept <= set(step["every"])
        assert len({tuple(step["kept"]) for step in seen}) > 1  # drawn anew each step
    # The first step's loss, before any update: one process's softmax over the kept centres.
    losses = [rank["losses"][0] for rank in partial.ranks]
    expected = partial.whole["partial_first_loss"]["pfc2-r0.5"]
    assert losses == approx([expected] * 2, 1e-6)
    assert abs(expected - partial.whole["losses"][0]) > 1e-3  # not the whole head's softmax


def oneflow_refuses_what_it_does_not_run_saying_why(runs: Any) -> None:
    for rank in runs["pfc2-r0.5-graph"].ranks:
        assert "Partial FC under nn.Graph" in rank["error"], rank
        assert "global_tensor.to_local() is not supported within nn.Graph" in rank["error"]


# MXNet: the head split by class over two ranks (the ``pfc`` kind, frameworks/mxnet/classes.py),
# the real trainer (tests/insightface_mxnet_rank.py) on MXNet's store, 6 and 5 of 11 classes,
# three SGD steps (momentum, weight decay) in float64; "whole" is one process with the whole head
# on the runs' global batch. MXNet 1.9.1's store (dist_sync) carries float64 arrays as float32
# or not by the environment's contents (measured 2026-12-01 on two CPU ranks: two pushpulls of
# 1/3 summed to float32's 2/3 with an unrelated FOO=1 set, to float64's without it; the plugin's
# and pytest's variables are such): the ranks end 5.0e-8 from one process (of how far any
# parameter moved, 170) under pytest, 5.0e-16 where the store kept float64; a wrong label
# offset 0.25. Two jobs, as many processes at once as the machine bears.
# name: (layout, ranks, options)
MXNET_RUNS: tuple[dict[str, tuple[str, int, dict[str, Any]]], ...] = ({
    "whole": ("none", 1, {}),
    "pfc2": ("pfc", 2, {}),
}, {
    "pfc2-r1": ("pfc-r1", 2, {}),  # Partial FC keeping every centre: model parallel again
    "pfc2-r0.5": ("pfc-r0.5", 2, {}),
    # rank 1 reads its labels as if its classes began at 0: the same code, other targets
    "pfc2-wrong-offset": ("pfc", 2, {"wrong_offset": 1}),
})


def mxnet_run(name: str, run: Any) -> None:
    """Every step's loss is the global batch's on both ranks (1.3e-8 apart seen)."""
    for rank in run.ranks:
        assert rank["losses"] == approx(run.whole["losses"], 1e-7)
        assert rank["environment"]["data_parallel_ranks"] == 2
        assert rank["environment"]["layout"] == name, rank["environment"]["layout"]


def mxnet_each_rank_holds_its_share_of_the_rows(runs: Any) -> None:
    ranks = runs["pfc2"].ranks
    assert [rank["head_rows"] for rank in ranks] == [6, 5]  # the first rank the odd class
    assert runs["pfc2"].whole["head_rows"] == 11
    assert ranks[0]["environment"]["sharded_modules"]["pfc"] == {
        "head": "head", "classes": 11, "sample_ratio": 1.0, "ranks": [[0, 0, 6], [1, 6, 5]]}


def mxnet_partial_fc_keeps_the_batchs_classes_among_its_sampled_centres(runs: Any) -> None:
    ranks = runs["pfc2-r0.5"].ranks
    assert ranks[0]["environment"]["sharded_modules"]["pfc"]["sample_ratio"] == 0.5
    for (start, count), rank in zip(((0, 6), (6, 5)), ranks):
        assert rank["head_rows"] == count and len(rank["seen"]) == 3
        for step in rank["seen"]:
            positives = {c for c in step["labels"] if start <= c < start + count}
            kept = set(step["kept"])
            assert positives <= kept, (positives, kept)
            assert len(kept) == max(count // 2, len(positives)), (kept, positives)
            assert kept <= set(range(start, start + count))
        assert len({tuple(step["kept"]) for step in rank["seen"]}) > 1  # drawn anew each step
        assert rank["losses"] == ranks[0]["losses"]  # the global batch's, on both ranks


def ranks_jobs() -> dict[str, Any]:
    """This model's ranks jobs by port id (tests/port_ranks.py's ``RanksJob``)."""
    from port_ranks import RanksJob, mxnet_job, oneflow_job, torchrun_job

    return {
        "insightface-torch": RanksJob(
            torchrun_job("insightface_torch_rank.py", TORCH_RUNS,
                         lambda run: f"reference-{run['world']}.pt"),
            run_check=torch_run,
            checks=(torch_each_rank_holds_its_share_of_the_classes,
                    torch_partial_fc_keeps_the_batchs_classes_among_its_sampled_centres)),
        "insightface-oneflow": RanksJob(
            oneflow_job("insightface_oneflow_rank.py", ONEFLOW_RUNS, "InsightFace"),
            interpreter="oneflow_python", run_check=oneflow_run, moved=0.01,
            checks=(oneflow_each_rank_holds_half_the_classes,
                    oneflow_partial_fc_keeps_the_batchs_classes_and_softmaxes_over_its_kept_centres,
                    oneflow_refuses_what_it_does_not_run_saying_why)),
        "insightface-mxnet": RanksJob(
            mxnet_job("insightface_mxnet_rank.py", MXNET_RUNS, "whole", ("head.weight",)),
            interpreter="mxnet_python", run_check=mxnet_run, moved=0.01,
            checks=(mxnet_each_rank_holds_its_share_of_the_rows,
                    mxnet_partial_fc_keeps_the_batchs_classes_among_its_sampled_centres)),
    }
