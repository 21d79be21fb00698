"""ResNet-50 v1.5 training throughput on JAX (Flax NNX, Optax, the whole step under jax.jit),
DLPerf's protocol, against the baselines."""

import pytest

FRAMEWORK = "jax"


def test_resnet50_v15(cluster, amp, compiler, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, "resnet50")
    # ResNet-50 v1.5 (stride 2 on the 3x3 conv): the model DLPerf measured.
    assert report.environment.parameters == 25_557_032
    # Every rank joined one data-parallel group (a rank training alone would still report).
    assert report.environment.data_parallel_ranks == cluster.world_size


@pytest.mark.multinode
def test_resnet50_v15_scaling(cluster, amp, compiler, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, "resnet50")
    # Every rank joined one data-parallel group (a rank training alone would still report).
    assert report.environment.data_parallel_ranks == cluster.world_size
