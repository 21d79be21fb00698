"""A decoder-only transformer's training throughput on JAX in tokens/s and MFU: GPT-2 124M on
GPUs (a small GPT-2 on CPUs), data-parallel, FSDP-sharded and tensor-parallel, against the
baselines."""

import pytest

from pytest_dlperf.models import gpt

FRAMEWORK = "jax"


@pytest.mark.layouts("dp", "fsdp", "tp")
def test_gpt(cluster, layout, amp, compiler, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, "gpt")
    # The whole model, however it is sharded: GPT-2 124M with its vocabulary padded to 50,304
    # and the head tied to the token embedding (counted once) on CUDA, 867,072 on the CPU.
    assert report.environment.parameters == gpt.parameter_count(report.workload.sizes)
    # Every rank is a replica of its own (fsdp shards the model, not the batch); the ranks of
    # a tensor-parallel group are one.
    assert report.environment.data_parallel_ranks == layout.data_parallel


@pytest.mark.multinode
@pytest.mark.layouts("dp", "fsdp")
def test_gpt_scaling(cluster, layout, amp, compiler, throughput_meter):
    # 2n1d-fsdp2: the shards' all-gathers and reduce-scatters cross the nodes' link.
    report = throughput_meter.measure(FRAMEWORK, "gpt")
    assert report.environment.data_parallel_ranks == layout.data_parallel
