"""The contract every framework's adapter meets in training, written once and run for each
framework: two ranks average their gradients, its own store takes the launcher's spare port, the
update is the workload's optimizer, its dynamic loss scale is the one policy, the adapter's own
AdamW is torch's. What the meter sees of each (a window against a wall clock, an own model on two
nodes, the step in phases, the largest batch that fits) is tests/test_conformance_measured.py.
What differs by framework is said in one table, ``conformance.FRAMEWORKS``; the work runs in real
processes under the framework's own interpreter (``tests/conformance_rank.py``, or the plugin's
ranks). What only one framework has (its model against torch's weights, its own quirks) stays in
that framework's test file."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conformance import Average, Framework, cases, job, left_by
from snippets import REPO, free_ports, run_snippet, run_together

from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.frameworks._loss_scale import POLICY


def flat(weights: list[list[float]]) -> list[float]:
    return [v for tensor in weights for v in tensor]


# -- two ranks average their gradients -------------------------------------------------------

def averages(framework: Framework) -> Iterator[tuple[str, tuple[Any, ...], str | None]]:
    for average in framework.averages:
        yield average.name, ((framework, average),), average.outside_ci


@pytest.fixture(scope="module", params=cases(averages))
def averaged(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Framework, Average, list[Any], list[Any]]:
    """One step of plain SGD through the adapter by two ranks together, each on data of its
    own, and by each rank's data alone: as the launchers start ranks (MASTER_PORT is torchrun's
    store there, unused here; the framework's own store takes the spare port)."""
    framework, average = request.param
    python = framework.python()
    ports = free_ports(3)
    spec = {"job": "average", "framework": framework.name, "compiler": average.compiler,
            "layout": average.layout}
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports[0]),
           "DLPERF_FRAMEWORK_PORT": str(ports[1])}
    if framework.stray_port:
        env[framework.stray_port] = str(ports[2])
    workers = None
    if not framework.spare_port:
        env, workers = {}, [f"127.0.0.1:{port}" for port in free_ports(2)]
    folder = tmp_path_factory.mktemp(framework.name)
    watched = ["MASTER_PORT", "DLPERF_FRAMEWORK_PORT"] if framework.spare_port else []
    ranks = [job({**spec, "rank": rank, "world": 2, "workers": workers,
                  "ports": watched if rank == 0 else []}, folder) for rank in (0, 1)]
    base = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "GLOG_minloglevel": "2", "TF_CPP_MIN_LOG_LEVEL": "2"}
    together = run_together(python, ranks, {**base, **env})
    # Each rank's data alone, one after the other in one process (a trainer built for each).
    (found,) = run_together(python, [job({**spec, "world": 1, "data_ranks": [0, 1]}, folder)],
                            base)
    alone = found["alone"]  # type: ignore[index]
    return framework, average, together, alone


def test_two_ranks_average_their_gradients(averaged: tuple[Any, ...]) -> None:
    """Both ranks end the step with the same weights, the mean of what each rank's data alone
    gives: summed gradients would give twice the update, a rank training alone its own."""
    _, _, together, alone = averaged
    assert [r["environment"]["data_parallel_ranks"] for r in together] == [2, 2]
    assert together[0]["before"] == together[1]["before"] == alone[0]["before"]
    assert alone[1]["before"] == alone[0]["before"]  # each trainer of one process from the start
    first, second = (flat(r["after"]) for r in together)
    assert first == pytest.approx(second, abs=1e-7)
    each = [flat(r["after"]) for r in alone]
    assert each[0] != pytest.approx(each[1], abs=1e-4)  # the ranks' data differ
    assert first == pytest.approx([(a + b) / 2 for a, b in zip(*each)], abs=1e-6)


def test_the_ranks_report_how_they_trained(averaged: tuple[Any, ...]) -> None:
    _, average, together, alone = averaged
    for ranks, expected in ((together, average.together), (alone, average.alone)):
        for key, value in expected.items():
            assert [r["environment"][key] for r in ranks] == [value] * len(ranks), key
    if average.shards is not None:
        assert [r["shards"] for r in together] == [average.shards] * 2


def test_rank_0s_store_takes_the_launchers_spare_port(averaged: tuple[Any, ...]) -> None:
    framework, _, together, _ = averaged
    if not framework.spare_port:
        pytest.skip(f"{framework.name} names every worker in the spec: it has no store")
    # Listening on the spare port, leaving MASTER_PORT to torchrun's agent store.
    assert together[0]["ports"] == {"MASTER_PORT": False, "DLPERF_FRAMEWORK_PORT": True}


def stores(framework: Framework) -> Iterator[tuple[str, tuple[Any, ...], str | None]]:
    if framework.store:
        yield "", (framework,), None


@pytest.mark.parametrize("framework", cases(stores))
def test_the_store_takes_the_port_the_launcher_leaves_it(framework: Framework) -> None:
    """Where the adapter's variables place the framework's own store, which rank 0 binds and
    the others reach (the test above checks the bind for real)."""
    store = framework.store
    assert store is not None
    agent = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
             "TORCHELASTIC_USE_AGENT_STORE": "True"}
    environ = {**agent, "DLPERF_FRAMEWORK_PORT": "31000"}
    store.prepare(environ, DistEnv(1, 2, 0, 2, 1))
    assert store.address(environ) == ("127.0.0.1", "31000")
    assert environ["MASTER_PORT"] == "29500"  # torchrun's agent store keeps it
    # An agent store on MASTER_PORT and no spare port: the framework's would fail to bind it.
    with pytest.raises(RuntimeError, match="DLPERF_FRAMEWORK_PORT"):
        store.prepare(dict(agent), DistEnv(0, 2, 0, 2, 0))
    # No agent and no spare port (srun, external mode): MASTER_PORT is free for it.
    bare = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    store.prepare(bare, DistEnv(0, 2, 0, 2, 0))
    assert store.address(bare) == ("127.0.0.1", "29500")


def test_what_rank_0_started_leaves_with_the_ranks(
        averaged: tuple[Any, ...], tmp_path_factory: pytest.TempPathFactory) -> None:
    """It leaves once the workers are done, or when its tether to rank 0 ends it, a grace
    period after rank 0 has gone (checked the moment the ranks exit, it races them)."""
    framework = averaged[0]
    if framework.started is None:
        pytest.skip(f"{framework.name}'s rank 0 starts no process beside it")
    assert left_by(framework, tmp_path_factory.getbasetemp()) == []


# -- the update is the workload's optimizer ---------------------------------------------------

def updates(framework: Framework) -> Iterator[tuple[str, tuple[Any, ...], str | None]]:
    for compiler in framework.optimizers:
        yield compiler, ((framework, compiler),), None


Flat = list[float]


@pytest.fixture(scope="module", params=cases(updates))
def stepped(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, Any]:
    """One real step (two for momentum) of the framework's trainer on a linear layer per
    optimizer, in one fresh process: (weight before, weight after, bias before, bias after);
    and the adapter's dynamic loss scale (``loss-scale``)."""
    framework, compiler = request.param
    found: Any = run_snippet(framework.python(), job(
        {"job": "optimizers", "framework": framework.name, "compiler": compiler},
        tmp_path_factory.mktemp(framework.name)))
    out = {"loss-scale": found.pop("loss-scale")}
    for name, run in found.items():
        (w0, b0), (w1, b1) = run["before"], run["after"]
        out[name] = (w0, w1, b0, b1)
    return out


def norm(values: list[float]) -> float:
    return sum(v * v for v in values) ** 0.5


def test_the_update_is_clipped_to_the_global_norm(stepped: dict[str, Any]) -> None:
    w0, w1, b0, b1 = stepped["sgd-clip"]
    delta = [a - b for a, b in zip(w1 + b1, w0 + b0)]
    # Plain SGD at lr 0.5: the update is lr x the clipped gradient, whose norm over weight and
    # bias together is the bound (clipping the two apart would give sqrt(2) x it; no clip, an
    # update 1000x too big).
    assert norm(delta) == pytest.approx(0.5 * 0.01, rel=1e-3)


def test_adamw_decays_matrices_and_not_biases(stepped: dict[str, Any]) -> None:
    w0, w1, b0, b1 = stepped["adamw-decay"]
    # No gradient: Adam's own update is zero, the decoupled decay shrinks the weight by
    # lr x weight_decay = 5%, and the bias (1-D: BERT's "not on biases and LayerNorm") keeps
    # its value.
    assert w1 == pytest.approx([w * (1 - 0.1 * 0.5) for w in w0], rel=1e-5)
    assert b1 == pytest.approx(b0, rel=1e-6)
    assert any(b != 0 for b in b0)  # a zero bias would stay zero under any decay


def test_sgd_momentum_carries_the_coupled_weight_decay(stepped: dict[str, Any]) -> None:
    w0, w2, b0, b2 = stepped["sgd-momentum-decay"]
    # No loss gradient: two steps of lr 0.1, momentum 0.9, L2 decay 0.5 added to the gradient
    # (torch's SGD). Step 1: w1 = 0.95 w0, buffer 0.5 w0. Step 2: buffer 0.45 w0 + 0.5 w1,
    # w2 = w1 - 0.1 x buffer = 0.8575 w0, biases too (every parameter decays). Decoupled
    # decay, or decay kept out of the momentum, would give 0.9025 w0.
    assert w2 + b2 == pytest.approx([v * 0.8575 for v in w0 + b0], rel=1e-5)


def test_the_loss_scale_is_the_one_policy(stepped: dict[str, Any]) -> None:
    """Every framework that scales its loss (fp16) starts, grows, backs off and waits as
    ``_loss_scale.POLICY`` says, read back from its own scaler (Keras's own default starts at
    2^15, the others' at 2^16)."""
    found = stepped["loss-scale"]
    if "skip" in found:
        pytest.skip(found["skip"])
    assert found["initial"] is not None
    policy = dataclasses.asdict(POLICY)
    for key, value in found.items():  # None: fixed by the framework, shown nowhere
        assert value is None or value == policy[key], key


# -- an adapter's own AdamW is torch's -------------------------------------------------------

def own_adamws(framework: Framework) -> Iterator[tuple[str, tuple[Any, ...], str | None]]:
    for mode, clip in framework.adamw:
        yield f"{mode}-{'clipped' if clip else 'unclipped'}", (framework, mode, clip), None


@pytest.mark.parametrize("framework, mode, clip", cases(own_adamws))
def test_adamw_is_torchs_over_three_steps(framework: Framework, mode: str, clip: float | None,
                                          tmp_path: Path) -> None:
    """The adapter's AdamW against torch.optim.AdamW on the same weights and gradients, three
    steps: gradients near epsilon (so its placement shows), a matrix decayed by 0.1 beside an
    undecayed bias. A bias correction off by a step, epsilon where a framework's own kernel
    puts it (MindSpore's fused Adam; MXNet's ``adamw_update`` has no bias correction either)
    or decay not scaled by the rate moves the weights by more than the tolerance. Clipped: the
    gradients' global norm clipped to 0.05 inside the update (the first two steps' norms are
    ~0.04 and ~0.12), torch's clip_grad_norm_ before its step."""
    import numpy as np
    import torch

    rng = np.random.default_rng(3)
    start = [rng.standard_normal((4, 3)), rng.standard_normal(3)]
    grads = [[g * scale for g in (rng.standard_normal((4, 3)), rng.standard_normal(3))]
             for scale in (1e-2, 3e-2, 1e-3)]
    decays, lr, betas, eps = [0.1, 0.0], 0.05, (0.9, 0.999), 1e-2
    got: Any = run_snippet(framework.python(), job({
        "job": "adamw", "framework": framework.name, "compiler": mode, "clip": clip,
        "start": [w.tolist() for w in start], "grads": [[g.tolist() for g in step]
                                                        for step in grads],
        "decays": decays, "lr": lr, "betas": betas, "eps": eps}, tmp_path))
    params = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in start]
    want = torch.optim.AdamW([{"params": [p], "weight_decay": d}
                              for p, d in zip(params, decays)], lr=lr, betas=betas, eps=eps)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = torch.tensor(g, dtype=torch.float64)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        want.step()
    for mine, theirs in zip(got, params):
        assert np.allclose(mine, theirs.detach().numpy(), rtol=0, atol=2e-6), (mine, theirs)
    assert not np.allclose(got[0], start[0], atol=1e-2)  # the steps moved the weights
