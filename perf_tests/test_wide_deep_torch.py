"""Wide & Deep (DLPerf's click-through-rate special case) on PyTorch: samples/s with each
iteration's latency, and the peak memory per device, across a ladder of vocabulary sizes
(DLPerf's doubling from 3.2M rows on a GPU; 200k..3.2M on a CPU). The sweep stops at the first
rung that runs out of memory and names the largest that fit (docs/sweeps.md)."""

import pytest

from pytest_dlperf.models import wide_deep

FRAMEWORK = "torch"


@pytest.mark.sweep(vocab={"cpu": wide_deep.CPU_LADDER, "cuda": wide_deep.CUDA_LADDER})
def test_wide_deep(cluster, sweep, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, "wide_deep")
    # The tables and the tower, by the formula, at this rung's vocabulary.
    assert report.environment.parameters == wide_deep.parameter_count(report.workload.sizes)
    assert report.environment.data_parallel_ranks == cluster.world_size
    if sweep.is_last and len(sweep.points) >= 3:
        # What a row costs a device, fitted over the rungs: its deep and wide entries (17
        # numbers) as a weight, its dense gradient and Adam's two moments, and on more than one
        # rank DDP's gradient buckets, a fifth copy (272 and 340 bytes; 274.6 and 339.4 measured
        # on a CPU, 2026-11-29).
        memory = sweep.memory_fit()
        assert memory is not None
        copies = 4 if cluster.world_size == 1 else 5
        expected = wide_deep.bytes_per_row(report.workload.sizes, copies=copies)
        assert memory.per_unit == pytest.approx(expected, rel=0.1), memory


# Two rungs on a CPU (a line through them is what a row costs), DLPerf's ladder on a GPU.
@pytest.mark.layouts("emb-tw", "emb-cw", "emb-rw", "emb-sparse")
@pytest.mark.sweep(vocab={"cpu": "800k,3.2M", "cuda": wide_deep.CUDA_LADDER})
def test_wide_deep_sharded(cluster, layout, sweep, throughput_meter):
    # The tables sharded over the ranks by TorchRec's plans, or replicated with sparse
    # gradients and lazy Adam (emb-sparse; docs/layouts.md), the tower data parallel. emb-dp
    # and emb-twcw (cw on one node) are checked in tests/.
    if cluster.world_size == 1:
        pytest.skip("one rank: a plan spreads the tables over nothing; test_wide_deep measures "
                    "the unsharded model")
    report = throughput_meter.measure(FRAMEWORK, "wide_deep")
    assert report.environment.parameters == wide_deep.parameter_count(report.workload.sizes)
    assert report.environment.data_parallel_ranks == layout.data_parallel
    plan = report.environment.sharded_modules["emb"]
    if sweep.is_last and len(sweep.points) >= 2:
        # A row costs the fullest rank the share of its 17 numbers that rank holds (all of them
        # under emb2-dp, half under emb2-rw), four copies of each: weight, gradient, Adam's two
        # moments; three under emb-sparse, whose gradient holds the rows looked up only.
        memory = sweep.memory_fit()
        assert memory is not None
        expected = wide_deep.bytes_per_row_held(report.workload.sizes, plan["tables"],
                                                copies=3 if plan["plan"] == "sparse" else 4)
        assert memory.per_unit == pytest.approx(expected, rel=0.15), memory
