"""pytest-dlperf's own hooks, registered with ``pytest_addhooks``: implement them in a
``conftest.py`` (or a plugin) to change what the plugin does there."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec(firstresult=True)
def pytest_dlperf_commit_info(config: pytest.Config) -> dict[str, Any] | None:
    """The commit the measured code is at, as a dict with at least ``id`` (the full hash or
    None), ``dirty`` (bool), ``branch`` (str or None) and ``project`` — what the baselines, the
    history and the results file record. Asked once per session. The plugin's own answer reads
    git (pytest-benchmark's ``get_commit_info``); return a dict to use another source (a CI
    variable, a build stamp), or None to leave it to the next implementation."""
