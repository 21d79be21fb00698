"""Running a piece of code inside a framework's own interpreter, as a rank would: shared by the
tests that check what a framework does (OneFlow's asynchrony, CUDA synchronization)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_snippet(python: str, code: str, timeout: float = 300, **env: str) -> object:
    """Run ``code`` under ``python`` (a framework's interpreter) with this checkout importable
    and one thread per op pool; it prints one JSON line last, which is returned."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                "GLOG_minloglevel": "2", "TF_CPP_MIN_LOG_LEVEL": "2", **env}
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=full_env,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def oneflow_interpreter() -> Path:
    """OneFlow's worker interpreter: DLPERF_TEST_ONEFLOW_PYTHON, else scripts/setup-oneflow's."""
    return Path(os.environ.get("DLPERF_TEST_ONEFLOW_PYTHON")
                or REPO / ".venv-oneflow" / "bin" / "dlperf-python")
