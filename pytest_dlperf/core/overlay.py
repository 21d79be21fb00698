"""An overlay environment: a virtual environment that sees every package of another
interpreter's (its site folders added after the overlay's own), so that what is installed into
it shadows theirs and nothing else differs. The A/B base side built from its worktree
(``--dlperf-ab-build``: a team's compiled extension) runs under one. Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# Named to sort after the .pth files an install writes into the overlay: site reads a folder's
# .pth files in name order, and the overlay's own path entries must come before the base
# environment's.
CHAIN = "zzz_dlperf_overlay.pth"
_SITES = ("import json, sysconfig; p = sysconfig.get_paths(); "
          "print(json.dumps(list(dict.fromkeys([p['purelib'], p['platlib']]))))")


class OverlayError(RuntimeError):
    """The overlay could not be made, or the command failed in it (its output's tail said)."""


@dataclass(frozen=True)
class Overlay:
    folder: Path
    python: str
    seconds: float  # making the environment and running the command, together
    command: str
    over: str = ""  # the interpreter whose environment it overlays

    def describe(self) -> str:
        return (f"built by `{self.command}` in an overlay of {self.over or 'the'}'s environment "
                f"({self.seconds:.1f} s)")


def _sites(python: str) -> list[str]:
    done = subprocess.run([python, "-c", _SITES], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise OverlayError(f"{python} did not say its site folders: {done.stderr.strip()}")
    return list(json.loads(done.stdout))


def make(python: str, folder: Path, command: str, cwd: Path, timeout_s: float = 3600.0
         ) -> Overlay:
    """An overlay of ``python``'s environment at ``folder``, then ``command`` (a shell command)
    run in ``cwd`` with the overlay first on ``PATH`` (``python`` and ``pip`` there are the
    overlay's)."""
    started = time.monotonic()
    done = subprocess.run([python, "-m", "venv", "--without-pip", str(folder)],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise OverlayError(f"python -m venv failed: {done.stderr.strip()[-500:]}")
    overlay = str(folder / "bin" / "python")
    lines = "; ".join(f"site.addsitedir({site!r})" for site in _sites(python))
    own = _sites(overlay)[0]
    Path(own, CHAIN).write_text(f"import site; {lines}\n")
    pip = folder / "bin" / "pip"
    pip.write_text(f'#!/bin/sh\nexec "{overlay}" -m pip "$@"\n')
    pip.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHOME"}
    env.update(VIRTUAL_ENV=str(folder),
               PATH=os.pathsep.join([str(folder / "bin"), os.environ.get("PATH", "")]))
    built = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    if built.returncode != 0:
        tail = (built.stdout + built.stderr).strip().splitlines()[-12:]
        raise OverlayError(f"`{command}` exited {built.returncode} in {cwd}:\n"
                           + "\n".join(tail))
    return Overlay(folder, overlay, time.monotonic() - started, command, python)
