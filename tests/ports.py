"""What the port contract checks of each (model, framework) port, in one table, ``PORTS``, as
tests/conformance.py's ``FRAMEWORKS`` holds what the adapter contract checks of each framework.
A port equals torch's: torch's parameters by name and shape (``Shapes``), torch's weights give
torch's outputs (``Outputs``), the recipe trains (``Trains``), under AMP it computes in bf16 on
float32 parameters (``Amp``), two ranks train what one process trains and a wrong split is seen
(``Ranks``). A port missing a check has ``None`` there: the table shows the gaps.

Each check names the test that holds it (``test``, ``file::name``) and carries its bounds as
that test asserts them, so that a move keeps them; ``tests/test_ports.py`` proves every named
test exists and every model module has a row. A check that stays out of CI says why in
``outside_ci``, as the test's mark does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from conformance import FRAMEWORKS, Framework

from pytest_dlperf.models import wide_deep

Bounds = Mapping[str, tuple[str, float]]  # what is measured -> ("<" or ">", bound)


@dataclass(frozen=True)
class Shapes:
    """Its parameters are torch's by name and shape: in torch's order (``order``), ``total``
    of them, and the model's own facts (``probes``: a tied decoder, BN strides, ...)."""

    test: str
    order: bool = True
    total: int | None = None
    probes: tuple[str, ...] = ()
    outside_ci: str | None = None


@dataclass(frozen=True)
class Outputs:
    """torch's weights give torch's outputs in each mode, within ``bounds`` (absolute, or
    relative to the reference's largest value where ``relative``)."""

    test: str
    modes: tuple[str, ...]
    bounds: Bounds
    relative: bool = False
    outside_ci: str | None = None


@dataclass(frozen=True)
class Trains:
    """The recipe trains ``steps`` per compiler, through the adapter's trainer (``adapter``)
    or a loop written in the test (which then checks the model's internals; its ``bounds``
    say what it asserts). Through the adapter (tests/test_ports_trained.py): ``workload`` (a
    name in ``pytest_dlperf.models``) at ``batch`` and ``sizes``; every loss finite, the first
    of each compiler within ``first`` = (expected, within), each within ``every`` (the
    same) and strictly inside ``band`` = (low, high), all ``distinct`` (a fresh batch every step); the trainer counts ``parameters``
    (exactly, or more than ``more_than``); Paddle's to_static built ``programs``; the
    compiled first loss is the eager one within ``same_first`` (relative)."""

    test: str
    compilers: tuple[str, ...]
    steps: tuple[int, ...]
    adapter: bool
    bounds: Bounds = field(default_factory=dict)
    workload: str = ""
    batch: int | None = None
    sizes: Mapping[str, object] = field(default_factory=dict)
    first: tuple[float, float] | None = None
    every: tuple[float, float] | None = None
    band: tuple[float, float] | None = None
    distinct: bool = False
    parameters: int | None = None
    more_than: int | None = None
    programs: int | None = None
    same_first: float | None = None
    outside_ci: str | None = None


@dataclass(frozen=True)
class Amp:
    """Under AMP the logits are ``logits`` on float32 parameters, and the loss is finite."""

    test: str
    logits: str = "bfloat16"
    outside_ci: str | None = None


@dataclass(frozen=True)
class Ranks:
    """Two ranks of ``launcher`` train what one process trains (``same``: run -> bound on the
    largest difference over the largest move), and a wrong split is seen (``wrong``)."""

    test: str
    launcher: str  # "torchrun", "gloo" (two processes), "oneflow", "mxnet" or "jax"
    same: Mapping[str, float]
    wrong: tuple[str, float] | None = None  # (run, lower bound)
    outside_ci: str | None = None


@dataclass(frozen=True)
class Port:
    """One (model, framework) port and the checks it has."""

    model: str
    framework: str
    shapes: Shapes | None = None
    outputs: Outputs | None = None
    trains: Trains | None = None
    amp: Amp | None = None
    ranks: Ranks | None = None

    @property
    def id(self) -> str:
        return f"{self.model}-{self.framework}"

    def record(self) -> Framework:
        """conformance's record of its framework: its interpreter, and how to get it."""
        return next(f for f in FRAMEWORKS if f.name == self.framework)


BERT_W = {"mlm_logits": ("<", 1e-6), "nsp_logits": ("<", 1e-6), "loss": ("<", 1e-5),
          "gelu": ("<", 1e-5)}
BERT_PROBES = ("tied", "padding_row")
BERT_FIRST = {"first - (lnV + ln2)": ("<", 1.0)}
TRAINED = "test_ports_trained.py::test_the_recipe_trains_through_the_adapter"
# An untrained BERT is near uniform over both heads' classes: ln(30522) + ln(2).
BERT_CHANCE = (math.log(30522) + math.log(2), 1.0)
BERT_SMALL = {"seq_length": 16, "max_predictions_per_seq": 3}


def wide_deep_count(vocab: int, hidden_size: int) -> int:
    return wide_deep.parameter_count({**wide_deep.CPU_SIZES, "vocab": vocab,
                                      "hidden_size": hidden_size})



RESNET_W = {"scale": (">", 0.1), "eval": ("<", 1e-5), "train": ("<", 5e-4)}
RESNET_FIRST = {"first - ln1000": ("<", 1.0), "largest / ln1000": ("<", 2)}
RANKS = "test_ports_ranks.py::test_two_ranks_train_what_one_process_trains"
PORTS = (
    # bert: torch's is the reference (models/bert/torch.py, tests/port_references.py).
    Port("bert", "torch"),
    Port("bert", "jax", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", total=110_106_428,
        probes=("held", "padding_row", "lookup_grad", "init")),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs", ("eager", "jit"),
                {"mlm_logits": ("<", 3e-6), "nsp_logits": ("<", 3e-6), "loss": ("<", 1e-5),
                 "gelu": ("<", 1e-5), "gelu_grad": ("<", 1e-5)}, relative=True),
        Trains("test_bert_jax.py::test_the_recipe_trains_under_jit_with_dropout", ("jit",),
               (3,), adapter=False, bounds={"first - (lnV + ln2)": ("<", 0.5)}),
        amp=Amp("test_bert_jax.py::test_the_recipe_trains_under_jit_with_dropout")),
    Port("bert", "tensorflow", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", order=False,
        total=110_106_428, probes=("held",)),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs",
                ("eager",),  {"mlm_logits": ("<", 1e-6), "nsp_logits": ("<", 1e-6),
                             "loss": ("<", 1e-6), "gelu": ("<", 2e-6)}),
        amp=Amp("test_bert_tensorflow.py::test_recipe_trains_in_mixed_bfloat16_with_a_float32_"
                "loss_at_chance")),
    Port("bert", "oneflow", Shapes("test_ports.py::test_params_are_torchs_by_name_and_shape", total=110_106_428,
                                   probes=BERT_PROBES),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs", ("eager",), BERT_W),
        Trains(TRAINED, ("eager", "compiled"), (2, 2), adapter=True, workload="BERT_BASE",
               sizes=BERT_SMALL, first=BERT_CHANCE)),
    Port("bert", "paddle", Shapes("test_ports.py::test_params_are_torchs_by_name_and_shape", total=110_106_428,
                                  probes=BERT_PROBES),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs", ("eager",), BERT_W),
        Trains(TRAINED, ("eager", "compiled"), (2, 2), adapter=True, workload="BERT_BASE",
               sizes=BERT_SMALL, first=BERT_CHANCE, programs=1, same_first=1e-5)),
    Port("bert", "mindspore", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", total=110_106_428,
        probes=(*BERT_PROBES, "lookup_grad")),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs", ("pynative", "graph"), BERT_W),
        Trains("test_bert_mindspore.py::test_the_recipe_trains_in_pynative_and_in_graph_mode",
               ("pynative", "graph"), (1, 2), adapter=False,
               bounds={**BERT_FIRST, "largest / (lnV + ln2)": ("<", 2)})),
    Port("bert", "mxnet", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", total=110_106_428,
        probes=(*BERT_PROBES, "lookup_grad")),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs", ("eager", "hybridized"), BERT_W),
        Trains("test_bert_mxnet.py::test_the_recipe_trains_eager_and_hybridized",
               ("eager", "hybridized"), (1, 2), adapter=False,
               bounds={**BERT_FIRST, "largest / (lnV + ln2)": ("<", 2)}),
        amp=Amp("test_bert_mxnet.py::test_the_recipe_trains_eager_and_hybridized")),
    # resnet50: torchvision's is the reference; oneflow's is flowvision's (counted only).
    Port("resnet50", "jax", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", total=25_557_032,
        probes=("strides", "init")),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs", ("jit",), {**RESNET_W, "means": ("<", 5e-4), "variances": ("<", 5e-4),
                                         "variances_vs_torch": (">", 1e-2)}, relative=True),
        Trains("test_resnet50_jax.py::test_the_recipe_trains_with_a_finite_loss", ("jit",),
               (3,), adapter=False, bounds=RESNET_FIRST),
        amp=Amp("test_resnet50_jax.py::test_under_amp_the_recipe_computes_in_bfloat16_on_"
                "float32_parameters")),
    Port("resnet50", "tensorflow", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", order=False,
        total=25_557_032, probes=("strides", "counted"))),
    Port("resnet50", "oneflow", Shapes(  # flowvision's: its count, in a case's environment
        "test_oneflow.py::test_cases_run_under_their_own_interpreter_and_skip_without_one",
        order=False, total=25_557_032)),
    Port("resnet50", "paddle", Shapes(
        "test_paddle.py::test_paddle_vision_resnet50_is_torchvisions_layer_for_layer",
        total=25_557_032, probes=("strides",)),
        Outputs("test_paddle.py::test_torchvisions_weights_give_torchvisions_logits",
                ("eager",), {"scale": (">", 0.1), "eval": ("<", 1e-5)}, relative=True)),
    Port("resnet50", "mindspore", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", total=25_557_032,
        probes=("strides", "training")),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs", ("pynative",), {**RESNET_W, "statistics": ("<", 5e-4)}, relative=True),
        Trains("test_resnet50_mindspore.py::test_the_recipe_trains_with_a_finite_loss_in_"
               "pynative_and_in_graph_mode", ("pynative", "graph"), (1, 4), adapter=False,
               bounds=RESNET_FIRST)),
    Port("resnet50", "mxnet", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", total=25_557_032,
        probes=("strides", "init", "deferred")),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs", ("eager", "hybridized"),
                {**RESNET_W, "gradients": ("<", 0.1), "means": ("<", 5e-4),
                 "variances": ("<", 5e-4), "variances_vs_torch": (">", 1e-2)}, relative=True),
        Trains("test_resnet50_mxnet.py::test_the_recipe_trains_with_a_finite_loss_eager_and_"
               "hybridized", ("eager", "hybridized"), (3, 5), adapter=False,
               bounds=RESNET_FIRST)),
    Port("resnet50", "torch"),  # the reference
    # wide_deep: torch's is the reference.
    Port("wide_deep", "torch", ranks=Ranks(  # float32 (TorchRec's tables have no float64)
        RANKS, "torchrun", {run: 1e-4 for run in (
            "ddp2", "emb1-tw", "emb2-dp", "emb2-tw", "emb2-cw", "emb2-twcw", "emb2-rw",
            "emb1-sparse", "emb2-sparse")}, ("emb2-rw-wrong-split", 0.05))),
    Port("wide_deep", "tensorflow", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", order=False,
        total=4_890_945, probes=("trainable",)),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs",
                ("eager",), {"logits": ("<", 1e-6), "loss": ("<", 1e-6)}),
        Trains(TRAINED, ("eager", "compiled"), (3, 3), adapter=True, workload="WIDE_DEEP",
               batch=64, sizes={"vocab": 5000, "hidden_size": 64}, every=(0.693, 0.2),
               parameters=wide_deep_count(5000, 64))),
    Port("wide_deep", "paddle", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", total=4_890_945,
        probes=("trainable",)),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs",
                ("eager",), {"logits": ("<", 1e-6), "loss": ("<", 1e-6)}),
        Trains(TRAINED, ("eager", "compiled"), (3, 3), adapter=True, workload="WIDE_DEEP",
               batch=64, sizes={"vocab": 5000, "hidden_size": 64}, every=(0.693, 0.2),
               parameters=wide_deep_count(5000, 64), programs=1)),
    Port("wide_deep", "oneflow", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", total=4_890_945,
        probes=("uniform", "ids")),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs",
                ("eager",), {"logits": ("<", 1e-5), "loss": ("<", 1e-6)}),
        Trains(TRAINED, ("eager", "compiled"), (3, 3), adapter=True, workload="WIDE_DEEP",
               batch=16, sizes={"vocab": 3000, "hidden_size": 32}, band=(0.3, 1.5),
               distinct=True, parameters=wide_deep_count(3000, 32)),
        ranks=Ranks(RANKS, "oneflow", {"ddp2": 1e-5, "emb2-rw": 1e-5, "emb2-dp": 1e-5},
                    ("emb2-rw-wrong-split", 1e-3))),
    # insightface: torch's is the reference.
    Port("insightface", "torch", ranks=Ranks(
        RANKS, "torchrun", {"ddp2": 1e-9, "pfc1": 1e-9, "pfc2": 1e-9, "pfc2-r1": 1e-9},
        ("pfc2-wrong-offset", 0.01))),
    # (MobileFaceNet with ArcFace at 100 classes: 1,251,712 parameters; each backbone and
    # margin's names and shapes: test_ports' InsightFace test, tests/port_insightface.py)
    Port("insightface", "oneflow", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", total=1_251_712,
        probes=("head", "variants")),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs",
                ("eager",), {"loss": ("<", 1e-5)}, relative=True),
        Trains(TRAINED, ("eager",), (3,), adapter=True, workload="INSIGHTFACE", batch=2,
               sizes={"num_classes": 1000}, band=(35, 60), distinct=True,
               more_than=1000 * 512),
        ranks=Ranks(RANKS, "oneflow", {"ddp2": 2e-5, "pfc2": 1e-9, "pfc2-graph": 2e-5},
                    ("pfc2-wrong-split", 0.01))),
    Port("insightface", "mxnet", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", order=False,
        total=1_251_712, probes=("variants",)),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs",
                ("eager", "hybridized"), {"loss": ("<", 1e-5), "head_grad": ("<", 2e-2)},
                relative=True),
        ranks=Ranks(RANKS, "mxnet", {"pfc2": 5e-7, "pfc2-r1": 5e-7},
                    ("pfc2-wrong-offset", 0.01))),
    # gpt: torch's is the reference.
    # float32, two SGD steps: 3.4e-7 (gpt2) and 3.1e-6 (llama) of how far one process moved
    # the parameters (2026-12-07); rank 1 on rolled targets: 0.31 and 0.71
    Port("gpt", "torch", ranks=Ranks(RANKS, "gloo",
                                     {"tp2-gpt2": 1e-4, "tp2-llama": 1e-4})),
    Port("gpt", "jax", Shapes(
        "test_ports.py::test_params_are_torchs_by_name_and_shape", total=867_072),
        Outputs("test_ports.py::test_torchs_weights_give_torchs_outputs", ("jit",),
                {"scale": (">", 1.0), "logits": ("<", 5e-6), "loss": ("<", 5e-6)},
                relative=True),
        Trains("test_gpt_jax.py::test_the_recipe_trains_in_float32_and_computes_in_bfloat16",
               ("jit",), (4,), adapter=False,
               bounds={"first - ln(vocab)": ("<", 0.5), "largest / ln(vocab)": ("<", 2)}),
        Amp("test_gpt_jax.py::test_the_recipe_trains_in_float32_and_computes_in_bfloat16"),
        # float32: 1.2e-5 of how far one process moved the parameters (2026-12-07; before, in
        # absolute terms, 6e-8 against a bound of 2e-6, the largest weight 1.0)
        Ranks(RANKS, "jax", {"tp2": 1e-4})),
)
