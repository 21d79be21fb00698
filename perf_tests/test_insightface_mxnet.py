"""InsightFace (DLPerf's face-recognition special case) on MXNet, whose deepinsight insightface
DLPerf compared OneFlow against: samples/s of a face model whose classifier head is held whole on
every rank (data parallel, its gradients summed through the store), split over the ranks by class
(pfc: model-parallel FC) or split and sampled (pfc-r0.1: Partial FC keeping a tenth of each
rank's centres a step), the split's collectives pushpulls through the store; IResNet-100 at batch
64 on a GPU, MobileFaceNet at 32 on a CPU, face_emore's 85,744 classes. The split head runs
eager only (hybridized, the case is skipped saying why: frameworks/mxnet/classes.py)."""

import pytest

FRAMEWORK = "mxnet"


@pytest.mark.layouts("dp", "pfc", "pfc-r0.1")
def test_insightface(cluster, layout, amp, compiler, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, "insightface")
    # Every rank trains the backbone on a batch of its own, whichever way the head is held.
    assert report.environment.data_parallel_ranks == cluster.world_size
    sizes = report.workload.sizes
    # The head's centres, one embedding-sized row a class, are counted whole.
    assert report.environment.parameters > int(sizes["num_classes"]) * int(sizes["embedding"])
    if layout.uses("pfc"):
        split = report.environment.sharded_modules["pfc"]
        # Each rank holds its share of the classes: the first ones one more where they do not
        # divide.
        classes = int(sizes["num_classes"])
        held = [count for _, _, count in split["ranks"]]
        assert sum(held) == classes and max(held) - min(held) <= 1
