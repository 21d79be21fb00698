"""The ``pfc`` layout kind: a classifier's head split over the ranks by class (InsightFace's
model-parallel FC, arcface_torch's Partial FC). Each rank trains on a batch of its own (the
backbone data parallel) and holds the centres of 1/N of the classes; ``r<ratio>``
(``pfc2-r0.1``) samples that share of a rank's centres each step, the batch's positives always
among them (Partial FC); none: every centre. Registered here the way a kind of one's own is
(``register_kind``), after ``emb``, so that case ids are unchanged; its strategies are the
frameworks' (``classes.py`` of torch, OneFlow and MXNet).

Standard library only: ranks import it, under any Python 3.10+.
"""

from __future__ import annotations

import re

from .registry import Kind, LayoutError, register_kind


def _sample_ratio_option(option: str) -> str | None:
    why = "a sample ratio r<ratio> in (0, 1] (pfc2-r0.1: a tenth of each rank's centres a step)"
    if not re.fullmatch(r"r(\d+(\.\d*)?|\.\d+)", option):
        return why
    if 0 < float(option[1:]) <= 1:
        return None
    return f"the sample ratio {option[1:]} is outside (0, 1]; {why}"


def sample_ratio(layout_options: list[str]) -> float:
    """The share of its centres a ``pfc`` rank samples a step (``pfc2-r0.1``: 0.1; 1.0 where the
    term names none); a ``LayoutError`` for two ratios."""
    if len(layout_options) > 1:
        raise LayoutError(f"a pfc term names at most one sample ratio (pfc2-r0.1); it has "
                          f"{', '.join(layout_options)}")
    return float(layout_options[0][1:]) if layout_options else 1.0


def class_range(classes: int, rank: int, world: int) -> tuple[int, int]:
    """The first class and the number of classes ``rank`` of ``world`` holds under ``pfc``:
    OneFlow's balanced split, the first ``classes % world`` ranks one more."""
    base, extra = divmod(classes, world)
    return base * rank + min(rank, extra), base + (rank < extra)


# The module is named, as ``emb``'s is: the package is on every rank's path.
register_kind(Kind("pfc", 1.6, True, _sample_ratio_option, module=__name__, max_options=1,
                   help="a classifier's head split over the ranks by class (Partial FC with "
                        "r<ratio>), the backbone data parallel"))
