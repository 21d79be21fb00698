"""A dense GEMM's rate on one CPU core, by precision: what MFU is taken against on a CPU where no
peak is given (``--dlperf-peak-flops``). Run as ``python -m pytest_dlperf.rank.gemm`` in a
subprocess of pytest's interpreter, one thread (torch, and BLAS beneath numpy, read their
thread counts at import), printing one JSON line: ``{"fp32": FLOP/s, "bf16": FLOP/s,
"library": ..., "n": ...}``.

The best of several products of two ``n x n`` matrices, ``2 n^3`` FLOPs each (a multiply-add is
two, as MFU counts): a measured rate of this machine's math library, not the hardware's peak
(turbo, the library's kernels and the matrix size move it). CPU math is synchronous: the clock
around each product is the product.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

# 1024: large enough that a product's time is its arithmetic (fp32 on one core: ~20-60 ms), small
# enough that emulated bf16 (no AMX/AVX512-BF16) stays within the time budget.
N = 1024
BUDGET_S = 1.0  # per precision, after the untimed products
MAX_PRODUCTS = 20
# A product longer than this (bf16 emulated where the CPU has no AVX512-BF16 or AMX: ~2.5 s a
# product on this project's VM, 0.3% apart over five, 2026-12-07) is timed after one untimed
# product, not two, and at least twice, not three times: 7.5 s of a machine's first session
# where it took 12.5.
LONG_S = 0.25


def best_rate(product: Callable[[], Any], flops: float) -> float:
    """FLOP/s of the fastest of the timed products."""
    started = time.perf_counter()
    product()  # untimed: the library's first call sets up what the later ones reuse
    long = time.perf_counter() - started > LONG_S
    if not long:
        product()
    least = 2 if long else 3
    best, started, done = math.inf, time.perf_counter(), 0
    while done < MAX_PRODUCTS and (done < least or time.perf_counter() - started < BUDGET_S):
        t0 = time.perf_counter()
        product()
        best = min(best, time.perf_counter() - t0)
        done += 1
    return flops / best


def measure(n: int = N) -> dict[str, Any]:
    flops = 2.0 * n ** 3
    try:
        import torch
    except ImportError:
        import numpy

        a, b = numpy.random.rand(n, n).astype("float32"), numpy.random.rand(n, n).astype("float32")
        return {"fp32": best_rate(lambda: a @ b, flops), "library": f"numpy {numpy.__version__}",
                "n": n}
    torch.set_num_threads(1)
    rates: dict[str, Any] = {"library": f"torch {torch.__version__}", "n": n}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        left, right = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        rates[name] = best_rate(lambda: torch.mm(left, right), flops)
    return rates


if __name__ == "__main__":
    print(json.dumps(measure()))
