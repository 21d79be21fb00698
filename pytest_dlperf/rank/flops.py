"""FLOPs per trained sample, achieved FLOP/s and model FLOPs utilization (MFU).

FLOPs are counted once per workload and size, by torch's ``FlopCounterMode`` over one forward
and backward step of the workload's torch recipe (the reference: the alignment tests guarantee
that every framework trains the same architecture, so a framework without a counter of its own
uses this figure). The count runs in a subprocess of pytest's interpreter
(``python -m pytest_dlperf.rank.flops SPEC.json``) on torch's ``meta`` device, where no tensor holds
data and nothing is computed, so DLPerf's full sizes count in a second on any host; a recipe
that cannot run on ``meta`` (a data-dependent op) is counted on the CPU at batch 1 instead. A
workload may state its figure instead (``Workload(flops_per_sample=...)``: a number, or a
function of the case's sizes such as the GPT's 6N + 12·L·H·Q·T a token), the only way for a
workload without a torch recipe. A recipe is counted as the whole model, called without a
layout or mesh whatever the case's layout.

``FlopCounterMode`` counts the matrix products and convolutions (2 FLOPs a multiply-add),
forward and backward, which is what MFU conventionally counts (PaLM's appendix B, Megatron):
elementwise work, normalization and the optimizer are left out.

MFU = achieved FLOP/s per device / the device's dense peak for the precision the math ran in,
the achieved FLOP/s being the FLOPs of one unit of the throughput (a sample, or a language
model's token: per sample / units per sample) times the units/s per device. Above 100% it is
refused: the peak is wrong (``verdict.mfu.ImpossibleMFU``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Any

# -- the counting subprocess -----------------------------------------------------------------

def _to(value: Any, device: str) -> Any:
    import torch

    if callable(value) and not isinstance(value, torch.nn.Module):
        value = value()
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _count_step(spec: Any, device: str) -> float:
    """FLOPs of one forward and backward step of the spec's torch recipe on ``device``."""
    from torch.utils.flop_counter import FlopCounterMode

    from ..core.recipes import load_recipe
    from ..frameworks.torch import cross_entropy

    recipe = load_recipe(spec.recipe)
    # The whole model, unsharded, whatever the case's layout: no mesh exists here, and model
    # FLOPs are the whole model's (a recipe reads ctx.layout None as "build it plain").
    ctx = replace(spec.context(0, 1, 0, device), layout=None, mesh=None)
    parts = recipe(ctx)
    model = parts.model.to(device)
    if parts.data is not None:
        inputs, targets = next(iter(parts.data))
    else:
        inputs, targets = parts.inputs, parts.targets
    inputs, targets = _to(inputs, device), _to(targets, device)
    # The loss the trainer uses: the recipe's, else the adapter's default (a language model's
    # [B, T, V] logits against [B, T] tokens too).
    criterion = parts.loss or cross_entropy
    with FlopCounterMode(display=False) as counter:
        outputs = model(*inputs) if isinstance(inputs, tuple) else model(inputs)
        criterion(outputs, targets).backward()
    return float(counter.get_total_flops())


def count(spec: Any) -> dict[str, Any]:
    """FLOPs per sample of the spec's torch recipe: on ``meta`` at the case's batch, else on
    the CPU at batch 1."""
    try:
        total = _count_step(spec, "meta")
        return {"flops_per_sample": total / spec.batch_size, "source": "FlopCounterMode (meta)"}
    except Exception as meta_error:  # noqa: BLE001 - any op without a meta kernel
        single = spec.with_(batch_size=1, device_type="cpu")
        total = _count_step(single, "cpu")
        return {"flops_per_sample": total, "source": "FlopCounterMode (cpu, batch 1)",
                "meta_error": f"{type(meta_error).__name__}: {meta_error}"[:500]}


def count_in_rank(spec: Any) -> dict[str, Any]:
    """The count, in a torch rank after its timed windows (torch is imported there anyway);
    a failure is reported, never raised: FLOPs are not what the case measures."""
    try:
        return count(spec)
    except Exception as exc:  # noqa: BLE001
        return {"flops_per_sample": None, "source": "none",
                "problem": f"counting FLOPs failed: {type(exc).__name__}: {exc}"[:500]}


def main(argv: list[str]) -> int:
    from ..core.spec import RankSpec

    if len(argv) != 1:
        print("usage: python -m pytest_dlperf.rank.flops SPEC.json", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    with open(argv[0]) as fh:
        spec = RankSpec.from_json(json.load(fh))
    print(json.dumps(count(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

