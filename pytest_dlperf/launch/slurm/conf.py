"""The files of a local Slurm cluster (``cluster``): its slurm.conf and the /etc/hosts every
one of its hosts sees. Pure text from names and addresses."""

from __future__ import annotations

from pathlib import Path

# The controller's host: where slurmctld runs and clients (salloc, sbatch, srun) start.
CONTROLLER = "ctl"
# Each daemon listens in a network namespace of its own: the usual ports never collide, with
# this machine's own or with another local cluster's.
CTLD_PORT = 6817
SLURMD_PORT = 6818


def hosts_text(addresses: dict[str, str]) -> str:
    """An /etc/hosts: loopback, then each host's name at its address."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{address}\t{name}" for name, address in addresses.items()]
    return "\n".join(lines) + "\n"


def slurm_conf(state: Path, addresses: dict[str, str], nodes: list[str], cpus: int,
               cluster: str) -> str:
    """slurm.conf of ``nodes`` (``cpus`` CPUs each, whatever this machine has:
    ``config_overrides``) and the controller, every file under ``state``."""
    lines = [
        f"ClusterName={cluster}",
        f"SlurmctldHost={CONTROLLER}({addresses[CONTROLLER]})",
        f"SlurmctldPort={CTLD_PORT}", f"SlurmdPort={SLURMD_PORT}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={state / 'munge' / 'munge.socket'}",
        f"StateSaveLocation={state / 'state'}",
        f"SlurmdSpoolDir={state / 'spool'}/%n",
        f"SlurmctldPidFile={state / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={state / 'run'}/slurmd-%n.pid",
        f"SlurmctldLogFile={state / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={state / 'log'}/slurmd-%n.log",
        # No cgroups to lean on (a container's): processes are tracked by group, tasks unbound.
        "ProctrackType=proctrack/pgid", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none", "SwitchType=switch/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        # Nodes may claim more CPUs than the machine has: with 2 a node, back-to-back steps
        # waited 0.4-2.9 s "for resources".
        "SlurmdParameters=config_overrides",
        "ReturnToService=2", "KillWait=2", "MinJobAge=5", "InactiveLimit=0",
        "MailProg=/bin/true",
    ]
    lines += [f"NodeName={name} NodeHostname={name} NodeAddr={addresses[name]} CPUs={cpus} "
              "State=UNKNOWN" for name in nodes]
    lines.append(f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE "
                 "State=UP")
    return "\n".join(lines) + "\n"
