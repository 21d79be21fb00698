"""Baseline files doctored the way a test needs them: shared by the tests that judge a real run
against a machine that was faster (or slower) when its baseline was recorded."""

from __future__ import annotations

import json


def scaled(stored: dict, factor: float, efficiency: float = 1.0, **extra: object) -> str:
    """The baseline file with its throughput (and efficiency) samples scaled: a machine that
    was that much faster (or better at scaling) when it was recorded. Peak memory as it was."""
    factors = {"samples_per_s": factor, "scaling_efficiency": efficiency}
    metrics = {name: {**m, "median": m["median"] * f,
                      "launches": [[v * f for v in launch] for launch in m["launches"]]}
               for name, m in stored["metrics"].items() for f in [factors.get(name, 1.0)]}
    return json.dumps({**stored, "metrics": metrics, **extra})
