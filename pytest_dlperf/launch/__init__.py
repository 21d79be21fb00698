"""How worker processes start. One module per launch mode, all behind one protocol.

A launcher (``protocol.LauncherProtocol``; ``base.Launcher`` gives its defaults) takes the plain
JSON spec and a topology and runs one launch in four phases: ``rendezvous`` (where the ranks
meet), ``start`` (every rank: ``python -m pytest_dlperf.rank.worker`` through an existing engine,
torchrun's elastic agents here, Slurm's srun, a Ray actor per rank, or pytest itself already
launched), ``collect``
(every rank's JSON result, through the channel the launcher chose) and ``stop``; it raises
``LaunchError`` naming the ranks that failed or hung and what they said.

The built-in launchers are made here (``make_builtin``), each by its module's ``make``; the
plugin offers them through its own ``pytest_dlperf_make_launcher`` hook, beside which a
conftest or plugin adds its own (docs/adding-a-launcher.md).

The modules: the protocol (``protocol``), its defaults and the cluster a test sees (``base``),
what the launchers that start their own agents share (``processes``), how results come back
(``results``), where ranks import the plugin from (``importpath``), and external mode
(``external``: pytest itself launched on every rank). A folder per engine: ``local/`` (torchrun's
elastic agents on this host; its private namespace, ``local/netns.py``), ``slurm/`` (srun inside an
allocation; a real Slurm cluster on this machine: ``cluster``, its files ``conf``, its ``keeper``),
``ray/`` (an actor per rank: the launcher, its view of the nodes ``nodes``, its wait ``collect``,
the actor's side ``rank``; a real Ray cluster on this machine: ``cluster``, ``keeper``). What a
cluster on one machine is made of, whichever engine runs on it, is ``onehost/``: nodes as network
hosts (``fabric``, ``userhosts``, ``linkprobe``), the clusters' shared shape, daemons and keeper.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from .base import Cluster, Launcher, LaunchError, Watch
from .protocol import LauncherProtocol, Rendezvous, run_launch

__all__ = ["BUILTIN_LAUNCHERS", "Cluster", "LaunchError", "Launcher", "LauncherProtocol",
           "Rendezvous", "Watch", "detect", "hook_modules", "make_builtin", "run_launch"]

# Each name is a module of this package with ``make(environ) -> Launcher``.
BUILTIN_LAUNCHERS = ("local", "slurm", "ray", "external")


def detect(environ: dict[str, str]) -> str:
    """The launch mode this environment calls for: pytest already running as one rank of a
    launched job -> external; inside a Slurm allocation -> slurm; else local."""
    from .external import launched_externally
    from .slurm import SlurmAllocation

    if launched_externally(environ):
        return "external"
    return "slurm" if SlurmAllocation.from_environ(environ) is not None else "local"


def make_builtin(name: str, environ: dict[str, str]) -> Launcher | None:
    """The built-in launcher ``name`` (None: not a built-in name); ``LookupError`` saying why
    where this environment cannot host it (slurm outside an allocation)."""
    if name not in BUILTIN_LAUNCHERS:
        return None
    launcher: Launcher = importlib.import_module(f"{__name__}.{name}").make(environ)
    return launcher


def hook_modules() -> list[ModuleType]:
    """The built-in launchers' own pytest hooks (``launch/<name>/hooks.py``: Ray's option and the
    maker that reads it), which the plugin registers beside itself, as a user's launcher's
    plugin or conftest is registered. Only those launchers are imported."""
    here = Path(__file__).parent
    return [importlib.import_module(f"{__name__}.{name}.hooks") for name in BUILTIN_LAUNCHERS
            if (here / name / "hooks.py").is_file()]
