"""BERT-base pretraining throughput on JAX (Flax NNX, Optax, the whole step under jax.jit),
DLPerf's protocol, against the baselines."""

import pytest

FRAMEWORK = "jax"


def test_bert_base(cluster, amp, compiler, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, "bert_base")
    # BERT-base with both pretraining heads, the decoder tied to the word embeddings (counted
    # once): transformers' BertForPreTraining, the model DLPerf measured.
    assert report.environment.parameters == 110_106_428
    # Every rank joined one data-parallel group (a rank training alone would still report).
    assert report.environment.data_parallel_ranks == cluster.world_size


@pytest.mark.multinode
def test_bert_base_scaling(cluster, amp, compiler, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, "bert_base")
    # Every rank joined one data-parallel group (a rank training alone would still report).
    assert report.environment.data_parallel_ranks == cluster.world_size
