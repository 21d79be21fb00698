"""InsightFace (DLPerf's face-recognition special case) on MXNet, whose deepinsight insightface
DLPerf compared OneFlow against: samples/s of a face model whose classifier head is held whole on
every rank (data parallel, its gradients summed through the store), eager and hybridized;
IResNet-100 at batch 64 on a GPU, MobileFaceNet at 32 on a CPU, face_emore's 85,744 classes. The
head split over the ranks by class (pfc) is not run on MXNet: its adapter has no seam for it
(frameworks/mxnet.py says what was measured)."""

FRAMEWORK = "mxnet"


def test_insightface(cluster, amp, compiler, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, "insightface")
    # Every rank holds the whole head and trains the backbone on a batch of its own.
    assert report.environment.data_parallel_ranks == cluster.world_size
    # The head's centres, one embedding-sized row a class, are counted whole on each rank.
    sizes = report.workload.sizes
    assert report.environment.parameters > int(sizes["num_classes"]) * int(sizes["embedding"])
