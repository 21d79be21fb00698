"""InsightFace (DLPerf's face-recognition special case) on OneFlow: samples/s of a face model
whose classifier head is held whole on every rank (data parallel), split over the ranks by class
(pfc: model-parallel FC, oneflow_face's way: the centres a global tensor split by class, SBP
inserting the collectives) or split and sampled (pfc-r0.1: Partial FC keeping a tenth of each
rank's centres a step, the sampling written here: OneFlow 0.9's op has no CPU kernel);
IResNet-100 at batch 64 on a GPU, MobileFaceNet at 32 on a CPU, face_emore's 85,744 classes.
The largest number of classes that fits: ``--dlperf-size num_classes=max`` under
``--dlperf-memory-limit`` (docs/sweeps.md)."""

import pytest

FRAMEWORK = "oneflow"


@pytest.mark.layouts("dp", "pfc", "pfc-r0.1")
def test_insightface(cluster, layout, amp, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, "insightface")
    # Every rank trains the backbone on a batch of its own, whichever way the head is held.
    assert report.environment.data_parallel_ranks == cluster.world_size
    if layout.uses("pfc"):
        split = report.environment.sharded_modules["pfc"]
        # Each rank holds its share of the classes: the first ones one more where they do not
        # divide (OneFlow's balanced split).
        classes = int(report.workload.sizes["num_classes"])
        held = [count for _, _, count in split["ranks"]]
        assert sum(held) == classes and max(held) - min(held) <= 1
