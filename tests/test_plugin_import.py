"""Importing the plugin stays cheap: `pytest --help` loads it through the pytest11 entry point
and imports no deep-learning framework."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "torchvision", "tensorflow", "oneflow", "paddle", "jax")

PROBE = f"""
import json, sys
import pytest
code = pytest.main(["--help"])
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
print("PROBE", json.dumps({{"code": int(code), "heavy": heavy,
                           "plugin": "pytest_dlperf.plugin" in sys.modules}}))
"""


def test_pytest_help_shows_dlperf_and_imports_no_framework(tmp_path: Path) -> None:
    # An empty folder: no conftest, so only the installed entry point can load the plugin.
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "deep-learning training throughput (pytest-dlperf):" in proc.stdout
    assert "--dlperf-update-baselines" in proc.stdout
    probe = json.loads(proc.stdout.split("PROBE ", 1)[1])
    assert probe == {"code": 0, "heavy": [], "plugin": True}


def test_entry_point_is_registered() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert eps.get("dlperf") == "pytest_dlperf.plugin"
