"""The port contract's work (tests/ports.py) inside a framework's own interpreter, one process
for every port of that framework: its parameters by torch's names and shapes, with the model's
own facts (probes), and what torch's weights give it, against torch's references
(tests/port_references.py) (job ``static``); or each model's recipe trained through the
framework's adapter (job ``recipe``). No pytest here: it reads a JSON spec (argv[1]) and prints
one JSON line, ``{model: figures}``, a port that raised holding ``{"error": traceback}``.

Runs under every framework's interpreter: Python 3.10 syntax (OneFlow's), and a framework is
imported inside its ports' functions only (one module a model: tests/port_bert.py,
tests/port_resnet50.py, tests/port_gpt.py, tests/port_wide_deep.py,
tests/port_insightface.py).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its ports' modules beside it
from port_bert import (  # noqa: E402
    bert_jax,
    bert_mindspore,
    bert_mxnet,
    bert_oneflow,
    bert_paddle,
    bert_tensorflow,
)
from port_gpt import gpt_jax  # noqa: E402
from port_insightface import insightface_mxnet, insightface_oneflow  # noqa: E402
from port_resnet50 import (  # noqa: E402
    resnet50_jax,
    resnet50_mindspore,
    resnet50_mxnet,
    resnet50_tensorflow,
)
from port_wide_deep import (  # noqa: E402
    wide_deep_oneflow,
    wide_deep_paddle,
    wide_deep_tensorflow,
)

STATIC: dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("bert", "mxnet"): bert_mxnet,
    ("resnet50", "mxnet"): resnet50_mxnet,
    ("bert", "mindspore"): bert_mindspore,
    ("resnet50", "mindspore"): resnet50_mindspore,
    ("bert", "oneflow"): bert_oneflow,
    ("bert", "paddle"): bert_paddle,
    ("bert", "jax"): bert_jax,
    ("resnet50", "jax"): resnet50_jax,
    ("gpt", "jax"): gpt_jax,
    ("bert", "tensorflow"): bert_tensorflow,
    ("resnet50", "tensorflow"): resnet50_tensorflow,
    ("wide_deep", "tensorflow"): wide_deep_tensorflow,
    ("wide_deep", "paddle"): wide_deep_paddle,
    ("wide_deep", "oneflow"): wide_deep_oneflow,
    ("insightface", "oneflow"): insightface_oneflow,
    ("insightface", "mxnet"): insightface_mxnet,
}


def recipe(framework: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The model's recipe through the framework's adapter (its trainer: optimizer, clip,
    compiler), on one process: ``steps`` steps per compiler, fresh batches, the losses and
    the parameters it counts; under Paddle's to_static, the programs it built."""
    from pytest_dlperf import models
    from pytest_dlperf.core.protocol import QUICK
    from pytest_dlperf.core.recipes import load_recipe
    from pytest_dlperf.core.spec import spec_for
    from pytest_dlperf.frameworks import DistEnv, load

    out: dict[str, Any] = {}
    for mode, steps in zip(spec["compilers"], spec["steps"]):
        case = spec_for(framework, getattr(models, spec["workload"]), protocol=QUICK,
                        device_type="cpu", compiler=mode, batch_size=spec["batch"],
                        sizes=spec["sizes"])
        trainer = load(framework).build_trainer(case, DistEnv(0, 1, 0, 1, 0),
                                                load_recipe(case.recipe))
        losses = []
        for _ in range(steps):
            trainer.step()
            losses.append(trainer.loss())
        out[mode] = {"losses": losses, "parameters": trainer.parameters}
        if framework == "paddle" and mode == "compiled":  # to_static's programs, run
            out["programs"] = len(trainer.model.forward.program_cache)
    return out


def main(spec: dict[str, Any]) -> dict[str, Any]:
    """Each port of ``spec["framework"]`` named in ``spec["ports"]`` (model -> its spec), in
    the job ``spec["job"]``: ``static`` (the default) or ``recipe``."""
    out = {}
    for model, port in spec["ports"].items():
        try:
            if spec.get("job", "static") == "recipe":
                out[model] = recipe(spec["framework"], port)
            else:
                out[model] = STATIC[model, spec["framework"]](port)
        except Exception:  # one port's failure fails its own rows only
            out[model] = {"error": traceback.format_exc()}
    return out


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    print(json.dumps(main(spec)), flush=True)
    if spec["framework"] == "oneflow":  # its teardown can crash once the figures are out
        os._exit(0)
