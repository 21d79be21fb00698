"""How worker processes start. One module per launch mode, all behind ``Launcher``.

A launcher takes the plain JSON spec and a topology, starts ``python -m pytest_dlperf.rank.worker`` on
every rank through an existing engine (torchrun's elastic agents here; Slurm's srun and
already-launched jobs in their own modules), and returns every rank's JSON result, or raises
``LaunchError`` naming the ranks that failed or hung and what they said.
"""

from __future__ import annotations

from .base import Cluster, Launcher, LaunchError, Watch

__all__ = ["LAUNCHERS", "Cluster", "LaunchError", "Launcher", "Watch", "detect", "get_launcher"]

LAUNCHERS = ("local", "slurm", "external")


def detect(environ: dict[str, str]) -> str:
    """The launch mode this environment calls for: pytest already running as one rank of a
    launched job -> external; inside a Slurm allocation -> slurm; else local."""
    from .external import launched_externally
    from .slurm import SlurmAllocation

    if launched_externally(environ):
        return "external"
    return "slurm" if SlurmAllocation.from_environ(environ) is not None else "local"


def get_launcher(name: str, environ: dict[str, str]) -> Launcher:
    if name == "local":
        from .local import LocalLauncher

        return LocalLauncher()
    if name == "slurm":
        from .slurm import SlurmAllocation, SlurmLauncher

        allocation = SlurmAllocation.from_environ(environ)
        if allocation is None:
            raise LookupError("--dlperf-launcher=slurm, but this is not inside a Slurm "
                              "allocation (no SLURM_JOB_ID / SLURM_JOB_NODELIST); run under "
                              "salloc or sbatch")
        return SlurmLauncher(allocation)
    if name == "external":
        from .external import REQUIRED, ExternalLauncher, launched_externally

        if not launched_externally(environ):
            raise LookupError("--dlperf-launcher=external, but pytest was not started as a rank "
                              f"of a launched job (needs {', '.join(REQUIRED)}); start it with "
                              "torchrun ... -m pytest")
        return ExternalLauncher(environ)
    raise LookupError(f"unknown launcher {name!r} (known: {', '.join(LAUNCHERS)})")
