"""Wide & Deep (DLPerf's click-through-rate special case) on OneFlow: samples/s with each
iteration's latency, and the peak memory per device, across a ladder of vocabulary sizes
(DLPerf's doubling from 3.2M rows on a GPU; 200k..3.2M on a CPU), as OneFlow-Benchmark's Wide &
Deep trains it (docs/sweeps.md). The sweep stops at the first rung that runs out of memory and
names the largest that fit."""

import pytest

from pytest_dlperf.models import wide_deep

FRAMEWORK = "oneflow"


@pytest.mark.sweep(vocab={"cpu": wide_deep.CPU_LADDER, "cuda": wide_deep.CUDA_LADDER})
def test_wide_deep(cluster, sweep, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, "wide_deep")
    # The tables and the tower, by the formula, at this rung's vocabulary.
    assert report.environment.parameters == wide_deep.parameter_count(report.workload.sizes)
    assert report.environment.data_parallel_ranks == cluster.world_size


# The tables split by rows over two ranks (OneFlow-Benchmark's way: global tensors, SBP), the
# tower data parallel; OneFlow runs the rw and dp plans only (eager: its nn.Graph aborts on CPU).
@pytest.mark.layouts("emb-rw")
@pytest.mark.sweep(vocab={"cpu": "800k,3.2M", "cuda": wide_deep.CUDA_LADDER})
def test_wide_deep_sharded(cluster, layout, sweep, throughput_meter):
    if cluster.world_size == 1:
        pytest.skip("one rank: a plan spreads the tables over nothing; test_wide_deep measures "
                    "the unsharded model")
    report = throughput_meter.measure(FRAMEWORK, "wide_deep")
    assert report.environment.parameters == wide_deep.parameter_count(report.workload.sizes)
    assert report.environment.data_parallel_ranks == layout.data_parallel
    tables = report.environment.sharded_modules["emb"]["tables"]
    vocab = report.workload.sizes["vocab"]
    # Half of each table's rows on each rank.
    assert {shards[0][3] + shards[1][3] for shards in tables.values()} == {vocab}, tables
