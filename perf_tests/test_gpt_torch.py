"""A decoder-only transformer's training throughput on PyTorch in tokens/s and MFU: GPT-2 124M
on GPUs (a small GPT-2 on CPUs), under every layout it supports, against the baselines."""

import pytest

from pytest_dlperf.models import gpt

FRAMEWORK = "torch"


@pytest.mark.layouts("dp", "fsdp", "tp", "pp")
def test_gpt(cluster, layout, amp, compiler, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, "gpt")
    # The whole model, however it is sharded: GPT-2 124M with its vocabulary padded to 50,304
    # and the head tied to the token embedding (counted once) on CUDA, 867,072 on the CPU.
    assert report.environment.parameters == gpt.parameter_count(report.workload.sizes)
    if cluster.device_type == "cuda":
        assert report.environment.parameters == 124_475_904
    # Every replica joined the data-parallel group (tensor- and pipeline-parallel ranks of one
    # replica share its batch).
    assert report.environment.data_parallel_ranks == layout.data_parallel


@pytest.mark.multinode
@pytest.mark.layouts("dp", "fsdp", "tp", "pp")
def test_gpt_scaling(cluster, layout, amp, compiler, throughput_meter):
    # 2n1d-fsdp2: the shards' all-gathers and reduce-scatters cross the nodes' link.
    report = throughput_meter.measure(FRAMEWORK, "gpt")
    assert report.environment.data_parallel_ranks == layout.data_parallel
