"""The environments the nightly compares: what changes between a framework team's nights is often
no commit but the environment (a torch, CUDA or NCCL build, a package upgraded or added).

Each night locks pytest's interpreter's environment (``core.installs.lock``: every package's
version and build, every ``.pth`` file). A night that passes keeps a copy of its environment in
the runner's folder (``envs/<digest>``; hard links where the store shares the environment's
filesystem, so a copy costs ~1.4 s and no data for an 8.7 GB, 98,880-file torch environment
here; a full copy elsewhere), so that a later night whose environment differs runs A/B with the
base side's ranks under the kept copy's interpreter (``--dlperf-ab-python``), naming the
packages that changed. Only the last good night's and the anchor's copies are kept.

The plugin itself is left out of the comparison: both sides' ranks import the head's plugin.
Environments of other interpreters (``--dlperf-python``) are compared by their frameworks'
versions only.
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


def digest(lock: dict[str, Any]) -> str:
    """The environment's identity: its packages and .pth files, the plugin left out."""
    packages = {k: v for k, v in lock.get("packages", {}).items() if k not in NOT_COMPARED}
    text = json.dumps({"packages": packages, "pth": _compared_pth(lock)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _compared_pth(lock: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in lock.get("pth", {}).items() if "pytest_dlperf" not in k}


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs from environment ``old`` to ``new``, the plugin left out."""
    def compared(lock: dict[str, Any]) -> dict[str, Any]:
        return {"packages": {k: v for k, v in lock.get("packages", {}).items()
                             if k not in NOT_COMPARED}, "pth": _compared_pth(lock)}
    return lock_changes(compared(old), compared(new))


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed: a copy
        shutil.copy2(source, target)


def keep(folder: Path, lock: dict[str, Any]) -> dict[str, Any]:
    """A copy of the locked environment in the runner's folder (``envs/<digest>``), made once;
    what the state records of it: its digest, its interpreter, how long the copy took. A
    system interpreter (not a virtual environment) is not copied: its changes are named, not
    judged by A/B."""
    record: dict[str, Any] = {"digest": digest(lock), "lock": lock}
    if not lock.get("venv"):
        record["why_not_kept"] = (f"{lock.get('prefix')} is not a virtual environment: the "
                                  "nightly keeps copies of virtual environments only")
        return record
    prefix = Path(lock["prefix"])
    target = folder / ENVS / record["digest"]
    relative = Path(lock["python"]).relative_to(prefix) if Path(lock["python"]).is_relative_to(
        prefix) else Path("bin") / "python"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        linked = os.stat(prefix).st_dev == os.stat(target.parent).st_dev
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
