"""The environments the nightly compares: what changes between a framework team's nights is often
no commit but the environment (a torch, CUDA or NCCL build, a package upgraded or added).

Each night locks pytest's interpreter's environment (``core.installs.lock``: the interpreter's
version, every package's version and build, every ``.pth`` file) and keeps a copy of it in the
runner's folder (``envs/<digest>``; hard links where the store shares the environment's
filesystem, so a copy costs 1.0-1.2 s and no data for an 8.7 GB, 98,880-file torch environment
here; a full copy elsewhere, where the disk has room for it), so that a later night whose
environment differs runs A/B with the base side's ranks under the kept copy's interpreter
(``--dlperf-ab-python``), naming the packages that changed. Only the last good night's, the
anchor's and the last night's copies are kept (an accept takes the last night's).

Left out of the comparison: the plugin itself (both sides' ranks import the head's plugin,
except in its own repository, where A/B takes it from the commit) and the packages installed
editable from the tests' repository (their code is the commit's). Environments of other
interpreters (``--dlperf-python``) are not kept: their frameworks' versions are compared, and a
case whose fingerprint changed with them is recorded anew and not judged that night.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from ..core.installs import lock_changes, lock_command
from ..launch.importpath import PACKAGE

ENVS = "envs"
# The measuring tool: the head's on both sides whatever the environment holds.
NOT_COMPARED = ("pytest-dlperf",)


class EnvironmentProblem(RuntimeError):
    """An environment that could not be locked or kept."""


def lock_of(python: str) -> dict[str, Any]:
    """``python``'s environment, locked (``core.installs.lock``)."""
    done = subprocess.run(lock_command(python, str(PACKAGE.parent)), capture_output=True,
                          text=True, cwd="/", timeout=300, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise EnvironmentProblem(f"{python} could not list its packages: "
                                f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return dict(json.loads(done.stdout))


def compared(lock: dict[str, Any], top: Path | None = None) -> dict[str, Any]:
    """What of an environment the nightly compares: its interpreter, packages and .pth files,
    less the plugin (the head's on both sides) and the packages installed editable from the
    tests' repository ``top`` (their code is the commit's, which A/B compares; their records
    name the checkout's path, and a dev version moves with every commit) with their .pth."""
    def ours(info: dict[str, Any]) -> bool:
        folder = info.get("editable")
        return bool(folder and top is not None and Path(folder).resolve().is_relative_to(
            top.resolve()))
    packages = {k: v for k, v in lock.get("packages", {}).items()
                if k not in NOT_COMPARED and not ours(v)}
    owned = {p for k, v in lock.get("packages", {}).items() if k in NOT_COMPARED or ours(v)
             for p in v.get("pth", [])}
    pth = {k: v for k, v in lock.get("pth", {}).items()
           if k not in owned and "pytest_dlperf" not in k}
    return {"version": lock.get("version"),
            "packages": {k: {"version": v["version"], "build": v["build"]}
                         for k, v in packages.items()}, "pth": pth}


def digest(lock: dict[str, Any], top: Path | None = None) -> str:
    """The environment's identity: what the nightly compares of it (``compared``)."""
    text = json.dumps(compared(lock, top), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def changes(old: dict[str, Any], new: dict[str, Any], top: Path | None = None) -> list[str]:
    """What differs from environment ``old`` to ``new``, as compared (``compared``)."""
    return lock_changes(compared(old, top), compared(new, top))


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed: a copy
        shutil.copy2(source, target)


def keep(folder: Path, lock: dict[str, Any], top: Path | None = None) -> dict[str, Any]:
    """A copy of the locked environment in the runner's folder (``envs/<digest>``), made once;
    what the state records of it: its digest, its interpreter, how long the copy took. A
    system interpreter (not a virtual environment) is not copied: its changes are named, not
    judged by A/B."""
    record: dict[str, Any] = {"digest": digest(lock, top), "lock": lock}
    if not lock.get("venv") or lock.get("system_site_packages"):
        record["why_not_kept"] = (
            f"{lock.get('prefix')} is not a virtual environment" if not lock.get("venv") else
            f"{lock.get('prefix')} also sees the system's packages (include-system-site-"
            "packages), which a copy would not keep") + (
            ": the nightly keeps copies of virtual environments of their own only")
        return record
    prefix = Path(lock["prefix"])
    target = folder / ENVS / record["digest"]
    relative = Path(lock["python"]).relative_to(prefix) if Path(lock["python"]).is_relative_to(
        prefix) else Path("bin") / "python"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        linked = _can_link(prefix, target.parent)
        if not linked:  # another filesystem: a full copy, where the disk has room for it
            size = _size(prefix)
            free = shutil.disk_usage(target.parent).free
            if size > free // 2:
                record["why_not_kept"] = (f"{prefix} is on another filesystem than the store, "
                                          f"and a full copy ({size / 1e9:.1f} GB) would take "
                                          f"over half of the {free / 1e9:.1f} GB free there")
                return record
            record["full_copy_bytes"] = size
        started = time.monotonic()
        scratch = target.with_name(target.name + ".partial")
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(prefix, scratch, symlinks=True, copy_function=_link_or_copy)
        os.replace(scratch, target)
        record["copied_s"] = round(time.monotonic() - started, 2)
    record["python"] = str(target / relative)
    return record


def _can_link(prefix: Path, folder: Path) -> bool:
    """Whether files of the environment can be hard-linked into the store: the same
    filesystem, and links allowed (``fs.protected_hardlinks`` refuses links to another user's
    files): tried on one."""
    probe = folder / f".link-probe-{os.getpid()}"
    try:
        os.link(prefix / "pyvenv.cfg", probe)
    except OSError:
        return False
    probe.unlink()
    return True


def _size(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def prune(folder: Path, keep_digests: set[str]) -> None:
    """Remove the kept environments no state entry names."""
    root = folder / ENVS
    if not root.is_dir():
        return
    for entry in root.iterdir():
        if entry.name not in keep_digests:
            shutil.rmtree(entry, ignore_errors=True)


def kept_python(record: dict[str, Any] | None) -> str | None:
    """The kept copy's interpreter, where it is still there."""
    if not record or not record.get("python"):
        return None
    return record["python"] if Path(record["python"]).exists() else None
