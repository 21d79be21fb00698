"""pytest-dlperf's own hooks, registered with ``pytest_addhooks``: implement them in a
``conftest.py`` (or a plugin) to change what the plugin does there."""

from __future__ import annotations

from typing import Any

import pytest

from ..launch import Launcher


@pytest.hookspec(firstresult=True)
def pytest_dlperf_commit_info(config: pytest.Config) -> dict[str, Any] | None:
    """The commit the measured code is at, as a dict with at least ``id`` (the full hash or
    None), ``dirty`` (bool), ``branch`` (str or None) and ``project`` — what the baselines, the
    history and the results file record. Asked once per session. The plugin's own answer reads
    git (pytest-benchmark's ``get_commit_info``); return a dict to use another source (a CI
    variable, a build stamp), or None to leave it to the next implementation."""


@pytest.hookspec(firstresult=True)
def pytest_dlperf_make_launcher(config: pytest.Config, name: str,
                                environ: dict[str, str]) -> Launcher | None:
    """The launcher ``--dlperf-launcher NAME`` asks for (``auto`` already resolved to local,
    slurm or external), as pytest-xdist's ``pytest_xdist_make_scheduler`` makes a scheduler.
    Asked once, at the session's start. ``environ``: the environment the session started in.

    Return a launcher (``pytest_dlperf.launch.LauncherProtocol``; subclass
    ``pytest_dlperf.launch.Launcher`` for its defaults and write its four phases) for a name you
    provide, and None for every other name, so that the next implementation is asked; raise
    ``LookupError`` saying what is missing where this environment cannot host yours (it becomes a
    usage error). The plugin's own implementation runs last and makes local, slurm and external;
    a conftest's ``local`` is asked first and so replaces it. A new name must also be listed by
    ``pytest_dlperf_launcher_names``."""


@pytest.hookspec
def pytest_dlperf_launcher_names(config: pytest.Config) -> list[str]:
    """The launcher names this implementation makes (``pytest_dlperf_make_launcher``); every
    implementation's lists are joined, and ``--dlperf-launcher`` accepts ``auto`` and those.

    A hook of its own, and not ``pytest_dlperf_make_launcher`` returning None for a name it
    does not know, because a wrong name must be refused by a message naming the right ones: a
    ``firstresult`` hook can only say that nobody made a launcher, not who could have made
    which. And the names are asked without making anything: making a launcher may have
    effects (a Slurm allocation is read, an engine connected to), which listing must not."""
    return []  # (a specification: pluggy calls the implementations, never this)


@pytest.hookspec(firstresult=True)
def pytest_dlperf_detect_launcher(config: pytest.Config, environ: dict[str, str]) -> str | None:
    """The launcher ``--dlperf-launcher auto`` (the default) picks in this environment: return
    your launcher's name where the environment is yours (an engine's address set, say), else
    None, so that the next implementation is asked. The plugin's own answer runs last: external
    inside a launched job, slurm inside an allocation, else local. The name must be one that
    ``pytest_dlperf_launcher_names`` lists."""
