from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_dlperf import topology

pytest_plugins = "pytester"

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_hardware(monkeypatch: pytest.MonkeyPatch) -> Callable[..., topology.Hardware]:
    """The one hardware fake: replaces every detection source topology reads (NVML devices,
    CPU model, usable cores), for in-process pytester runs and direct calls alike."""

    def install(gpus: tuple[str, ...] = (), cpu_model: str = "Fake CPU 9000", cpu_count: int = 2,
                driver: str | None = None) -> topology.Hardware:
        monkeypatch.setattr(topology, "_nvml_devices", lambda: (tuple(gpus), driver))
        monkeypatch.setattr(topology, "_cpu_model", lambda: cpu_model)
        monkeypatch.setattr(topology, "_cpu_count", lambda: cpu_count)
        return topology.detect_hardware()

    return install


@pytest.fixture
def subprocess_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Environment for runpytest_subprocess: this interpreter's venv first, no stray DLPERF_*."""
    for key in [k for k in os.environ if k.startswith("DLPERF_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    yield
