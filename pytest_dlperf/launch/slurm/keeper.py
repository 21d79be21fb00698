"""``dlperf slurm``: a local Slurm cluster (``cluster``) kept by ``keeper``, which starts,
holds and stops it; here what the keeper needs of Slurm's kind (``KIND``). Clients run on the
controller's host (the cluster's login node)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ..onehost.keeper import Kind
from .cluster import RECORD, LocalSlurm, LocalSlurmError, stop_recorded

DEFAULT_STATE = Path("/tmp/dlperf-slurm")


def _attach(state: Path, record: dict[str, Any]) -> LocalSlurm:
    nodes = sum(1 for name in record["hosts"] if name != "ctl")
    return LocalSlurm(state, nodes=nodes).attached(record)


def usage(cluster: LocalSlurm) -> str:
    state = "" if cluster.state_dir == DEFAULT_STATE else f" --state {cluster.state_dir}"
    hosts = ", ".join(f"{name} {host.address}" for name, host in cluster.hosts.items())
    return "\n".join([
        f"A Slurm cluster of {cluster.nodes} node(s) on this machine, each its own network host "
        f"({hosts}); state in {cluster.state_dir}.",
        "Clients run on its controller's host (ctl, the login node), e.g.:",
        f"  dlperf slurm run{state} -- sinfo",
        f"  dlperf slurm run{state} -- salloc -N {cluster.nodes} pytest perf_tests -m multinode "
        f"--nodes {cluster.nodes}",
        f"  dlperf slurm run{state} -- sbatch -N {cluster.nodes} --wait --wrap 'pytest ...'",
        f"  (or yourself: {shlex.join(cluster.client(['CMD']))})",
        f"Stop it: dlperf slurm stop{state}",
    ])


def _client(cluster: LocalSlurm, command: list[str]) -> tuple[list[str], dict[str, str]]:
    return cluster.client(command), cluster.environment()


KIND = Kind("slurm", "local Slurm cluster", RECORD,
            make=lambda nodes, state: LocalSlurm(state, nodes=nodes), attach=_attach,
            error=LocalSlurmError, usage=usage, stop_recorded=stop_recorded,
            status=lambda cluster: [f"sinfo: {cluster.sinfo() or 'no answer from slurmctld'}"],
            client=_client)
