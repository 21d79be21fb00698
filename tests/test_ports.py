"""The port contract (tests/ports.py): the table against the code (every model module of every
framework has a row, every check names a test that holds it, marked as the row says), then
the checks it moved here: each port's parameters are torch's by name and shape, with its
model's own facts, and torch's weights give torch's outputs, one job a framework."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from port_references import TINY, torch_reference, torch_shapes
from ports import PORTS, Port
from snippets import run_snippet

TESTS = Path(__file__).resolve().parent
MODELS = TESTS.parent / "pytest_dlperf" / "models"
CHECKS = ("shapes", "outputs", "trains", "amp", "ranks")
STD = 0.02  # BertConfig's initializer_range
STATISTICS = 53_120  # ResNet-50's BatchNorms' running means and variances, torch's buffers


def test_every_port_module_has_a_row() -> None:
    """A new ``models/<model>/<framework>.py`` is a new port: it gets a row, with what it
    checks (or ``None``: no such check, a gap the table shows)."""
    modules = {(path.parent.name, path.stem) for path in MODELS.glob("*/*.py")
               if not path.stem.startswith("_")}
    rows = [(port.model, port.framework) for port in PORTS]
    assert len(set(rows)) == len(rows), "a port has two rows"
    assert modules == set(rows)


def _tests(path: Path) -> dict[str, str]:
    """Each test function of ``path`` by name, with its decorators' source."""
    return {node.name: " ".join(ast.unparse(d) for d in node.decorator_list)
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


@pytest.mark.parametrize("port", PORTS, ids=lambda port: port.id)
def test_every_check_names_a_test_that_holds_it_marked_as_the_row_says(port: Port) -> None:
    """A check's ``test`` (``file::name``) exists; where the row keeps it out of CI, that
    test carries the ``outside_ci`` mark (on itself or on a param), unless the test is the
    contract's own, whose params take their marks from the rows."""
    for check in filter(None, (getattr(port, name) for name in CHECKS)):
        module, name = check.test.split("::")
        tests = _tests(TESTS / module)
        assert name in tests, f"{port.id}: {check.test} names no test"
        if check.outside_ci and not module.startswith("test_ports"):
            assert "outside_ci" in tests[name], f"{port.id}: {check.test} runs in CI"


def moved(check: str) -> list[Port]:
    """The ports whose ``check`` this module runs (the others' still run in their own files)."""
    return [port for port in PORTS
            if (found := getattr(port, check)) and found.test.startswith("test_ports.py::")]


def port_cases(check: str, modes: bool = False) -> list[Any]:
    """The pytest params of a check, ids ``<model>-<framework>[-<mode>]``, as conformance's
    ``cases``; the row's ``outside_ci`` becomes the mark."""
    return [pytest.param(port, *([mode] if modes else []),
                         id=f"{port.id}-{mode}" if modes else port.id,
                         marks=[pytest.mark.outside_ci(why)] if (
                             why := getattr(port, check).outside_ci) else [])
            for port in moved(check)
            for mode in (getattr(port, check).modes if modes else (None,))]


@pytest.fixture(scope="module")
def static(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Port], dict[str, Any]]:
    """Each framework's static job (tests/port_job.py), run once for all its ports that
    this module checks: one interpreter start, torch's references made once."""
    done: dict[str, dict[str, Any]] = {}

    def figures(port: Port) -> dict[str, Any]:
        if port.framework not in done:
            python = port.record().python()
            for needed in NEEDS.values():
                pytest.importorskip(needed)
            models = sorted({p.model for p in moved("shapes") + moved("outputs")
                             if p.framework == port.framework}, key=MODELS_FIRST.index)
            spec = {"framework": port.framework,
                    "ports": {model: {"reference": str(torch_reference(model)),
                                      "shape": dataclasses.asdict(TINY)} for model in models}}
            folder = tmp_path_factory.mktemp(port.framework)
            done[port.framework] = run_snippet(python, job(spec, folder))
        found = done[port.framework][port.model]
        assert "error" not in found, found["error"]
        return found

    return figures


NEEDS = {"bert": "transformers", "resnet50": "torchvision", "gpt": "torch",
         "wide_deep": "torch", "insightface": "torch"}  # torch's side
MODELS_FIRST = ["bert", "resnet50", "gpt", "wide_deep", "insightface"]  # BERT first: Gluon names a process's first BERT as torch
JOB = TESTS / "port_job.py"


def job(spec: dict[str, Any], folder: Path) -> str:
    """Code that runs tests/port_job.py on ``spec`` in ``folder``, for ``run_snippet``: from
    its file (MindSpore's GRAPH mode reads the source of what it compiles), in a folder of
    its own (where a failed MindSpore compile writes its dump)."""
    return (f"import os, runpy, sys; os.chdir({str(folder)!r}); "
            f"sys.argv[1:] = [{json.dumps(spec)!r}]; "
            f"runpy.run_path({str(JOB)!r}, run_name='__main__')")


@pytest.mark.parametrize("port", port_cases("shapes"))
def test_params_are_torchs_by_name_and_shape(static: Any, port: Port) -> None:
    """Built only: every parameter under torch's name with torch's shape (torch's layout),
    in torch's order where the row says so, and as many in all as torch's model has."""
    assert port.shapes is not None
    shapes = {name: tuple(shape) for name, shape in static(port)["shapes"].items()}
    torchs = torch_shapes(port.model)
    assert {n: (shapes.get(n), torchs.get(n)) for n in {*shapes, *torchs}
            if shapes.get(n) != torchs.get(n)} == {}
    if port.shapes.order:
        assert list(shapes) == list(torchs)
    if port.shapes.total is not None:
        assert sum(math.prod(shape) for shape in shapes.values()) == port.shapes.total
    if "trainable" in port.shapes.probes:  # what its framework trains: these, no more
        assert static(port)["probes"]["trainable"] == port.shapes.total


@pytest.mark.parametrize("port, mode", port_cases("outputs", modes=True))
def test_torchs_weights_give_torchs_outputs(static: Any, port: Port, mode: str) -> None:
    """torch's weights, loaded by name, give torch's outputs on torch's batch, within the
    row's bounds (a figure measured once per port, as the GELU's, is checked in each mode)."""
    assert port.outputs is not None
    found = static(port)
    figures = {**found["once"], **found["outputs"][mode]}
    for name, (side, bound) in port.outputs.bounds.items():
        value = figures[name]
        assert (value < bound) if side == "<" else (value > bound), (name, value, side, bound)


@pytest.mark.parametrize("port", [p for p in port_cases("shapes")
                                  if p.values[0].model == "bert"])
def test_bert_ties_its_decoder_and_pads_as_transformers(static: Any, port: Port) -> None:
    """One array for the embeddings and the masked-LM decoder (the padding row, never looked
    up, gets a gradient through the decoder, eager and compiled; or, ``held``, the model
    holds torch's arrays and no more); the padding row zero, as transformers initializes its
    padding_idx; the lookup itself sends it no gradient; the rest initialized as transformers
    (``init``): N(0, 0.02), not truncated (BERT-base's smallest matrix has 1,536 values),
    LayerNorm's weights 1, biases 0."""
    assert port.shapes is not None
    probes = static(port)["probes"]
    if "names" in probes:  # the framework's own parameter names are torch's, all trained
        assert probes["names"] == list(torch_shapes("bert"))
    if "tied" in port.shapes.probes:
        if "embeddings" in probes:  # the decoder holds no copy
            assert probes["embeddings"] == 1
        if "arrays" in probes:  # nor a copy of its array (MXNet's parameters hold one each)
            assert probes["arrays"] == 1
        assert all(grad > 0 for grad in probes["decoder_grad"]), probes["decoder_grad"]
    if "held" in port.shapes.probes:  # arrays and elements: the decoder has none of its own
        assert probes["held"] == [len(torch_shapes("bert")), port.shapes.total]
        if "embeddings" in probes:  # and holds the embeddings once
            assert probes["embeddings"] == 1
    if "padding_row" in port.shapes.probes:
        assert probes["padding_row"] == 0.0
    if "lookup_grad" in port.shapes.probes:
        padding, looked_up = probes["lookup_grad"]
        assert padding == 0.0 and looked_up > 0
    if "init" in port.shapes.probes:
        for name, (mean, std, largest, smallest) in probes["init"].items():
            if name.endswith("LayerNorm.weight"):
                assert mean == smallest == 1.0, name
            elif name.endswith("bias"):
                assert largest == 0.0, name
            else:
                assert abs(mean) < 0.003 and abs(std - STD) < 0.05 * STD, (name, mean, std)
                assert largest > 3 * STD, (name, largest)


@pytest.mark.parametrize("port", [p for p in port_cases("shapes")
                                  if p.values[0].model == "resnet50"])
def test_resnet50_is_v1_5_initialized_as_torchvision(static: Any, port: Port) -> None:
    """v1.5: a stage's first block strides on its 3x3 conv, not on its first 1x1 (a count
    cannot see it). torchvision's initialization: He-normal over fan-out (measured
    0.993-1.019 of its std; the smallest conv has 4,096 weights), torch Linear's uniform
    bound, BatchNorm's 1 and 0; every parameter made at construction; built for training;
    where its framework counts BatchNorm's running statistics as weights (Keras), as many as
    torch's buffers."""
    assert port.shapes is not None
    probes = static(port)["probes"]
    if "strides" in port.shapes.probes:
        assert probes["strides"] == [[1, 1], [2, 2], [1, 1]]
    if "deferred" in port.shapes.probes:
        assert probes["deferred"] == []  # none waits for data
    if "counted" in port.shapes.probes:  # trainable; and all, BatchNorm's statistics too
        assert probes["counted"] == [port.shapes.total, port.shapes.total + STATISTICS]
    if "training" in port.shapes.probes:
        assert probes["training"] is True  # out of training, BatchNorm normalizes nothing
    if "init" in port.shapes.probes:
        low, high = probes["conv_std_over_he"]
        assert 0.95 < low <= high < 1.05, probes["conv_std_over_he"]
        assert all(0.99 < ratio <= 1 for ratio in probes["fc_over_bound"]), probes
        assert probes["norms"] == [0.0, 1.0]  # gamma and running var 1, beta and mean 0


@pytest.mark.parametrize("port", [p for p in port_cases("shapes")
                                  if {"uniform", "ids"} & set(p.values[0].shapes.probes)])
def test_wide_deep_draws_torchs_ids_initialized_as_torch(static: Any, port: Port) -> None:
    """Its ids from torch's uniforms are torch's ids (``ids``); initialized as torch's is
    (``uniform``): tables uniform in (-0.05, 0.05), the tower Xavier-uniform, zero biases."""
    assert port.shapes is not None
    probes = static(port)["probes"]
    if "ids" in port.shapes.probes:
        assert probes["ids_differ"] == {"wide": 0, "deep": 0}, probes
    if "uniform" in port.shapes.probes:
        low, high = probes["table_range"]
        # the bound as a float32 table holds it: 0.05000000074505806 (a OneFlow table drew it
        # exactly, in a fresh-clone rehearsal, 2026-12-07)
        bound = struct.unpack("f", struct.pack("f", 0.05))[0]
        assert -bound <= low < -0.049 and 0.049 < high <= bound, probes
        assert probes["table_std"] == pytest.approx(0.05 / 3 ** 0.5, rel=0.02), probes
        assert 0.95 < probes["first_bound"] <= 1.0, probes  # Xavier's bound, nearly reached
        assert probes["biases"] == 0.0, probes


@pytest.mark.parametrize("port", [p for p in port_cases("shapes")
                                  if p.values[0].model == "insightface"])
def test_insightface_is_torchs_in_each_backbone_and_margin_its_head_normal(
        static: Any, port: Port) -> None:
    """Each backbone and margin the port checks (tests/port_insightface.py) has torch's
    parameters by name and shape (``variants``: OneFlow's in torch's order, MXNet's in its
    own); the head starts normal with std 0.01 (``head``), as torch's."""
    assert port.shapes is not None
    probes = static(port)["probes"]
    assert probes["variants"] and all(probes["variants"].values()), probes["variants"]
    if "head" in port.shapes.probes:
        for variant, (std, mean) in probes["head"].items():
            assert std == pytest.approx(0.01, rel=0.05) and abs(mean) < 1e-3, (variant, std, mean)
