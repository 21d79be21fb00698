"""tests/gpu: the CUDA paths run for real. Every test here carries the ``gpu`` marker and skips,
saying why, on a host where NVML finds no NVIDIA GPU, so the CPU suite stays green.
``scripts/gpu-check`` runs this folder on a GPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_dlperf.core.topology import detect_hardware


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    folder = Path(__file__).parent
    here = [item for item in items if folder in item.path.parents]
    if not here:
        return
    hardware = detect_hardware()
    skip = None if hardware.gpus else pytest.mark.skip(
        reason="no NVIDIA GPU found through NVML (pynvml): tests/gpu needs a GPU host; "
               "run scripts/gpu-check there")
    for item in here:
        item.add_marker(pytest.mark.gpu)
        if skip is not None:
            item.add_marker(skip)
