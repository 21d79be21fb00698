"""What runs inside a training rank: the worker process (``worker``: ``python -m
pytest_dlperf.rank.worker SPEC.json OUT_DIR``), the timing of its windows (``timing``), its
memory (``memory``), its progress events (``progress``), FLOP counting (``flops``), a core's dense GEMM rate
(``gemm``, MFU's peak on a CPU where none is given), the
diagnostic steps cut into phases after the windows (``phases``) and duet A/B's barrier before
each window (``barrier``).

This package must never import pytest, the pytest side (``pytest_dlperf.plugin``) or anything
that does: a rank gets a plain JSON spec and hands back plain JSON, and it may run under another
interpreter with no pytest at all (OneFlow's Python 3.10). It imports only ``core``,
``frameworks``, ``models`` and the standard library (frameworks themselves inside functions).
``tests/test_layout.py`` proves it by importing every rank-side module where ``import pytest``
fails.
"""
