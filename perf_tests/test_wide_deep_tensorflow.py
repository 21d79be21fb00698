"""Wide & Deep (DLPerf's click-through-rate special case) on TensorFlow: samples/s with each
iteration's latency, and the peak memory per device, across a ladder of vocabulary sizes
(DLPerf's doubling from 3.2M rows on a GPU; 200k..3.2M on a CPU). The sweep stops at the first
rung that runs out of memory and names the largest that fit (docs/sweeps.md)."""

import pytest

from pytest_dlperf.models import wide_deep

FRAMEWORK = "tensorflow"


@pytest.mark.sweep(vocab={"cpu": wide_deep.CPU_LADDER, "cuda": wide_deep.CUDA_LADDER})
def test_wide_deep(cluster, sweep, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, "wide_deep")
    # The tables and the tower, by the formula, at this rung's vocabulary.
    assert report.environment.parameters == wide_deep.parameter_count(report.workload.sizes)
    assert report.environment.data_parallel_ranks == cluster.world_size
    # No assertion on what a row costs: the tables' gradients are IndexedSlices (the looked-up
    # rows only), and what Keras' Adam allocates for them beside the weight and its two
    # moments is TensorFlow's business, not a count of copies (sweep.memory_fit() still
    # records the figure).
