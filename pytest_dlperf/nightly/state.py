"""The runner's state (``nightly.json`` in its folder of the store): the last good night and the
anchor (commit, environment), the night after an accept's re-recording, every night's outcome;
and where a runner keeps it."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

STATE = "nightly.json"


class NightlyError(Exception):
    """Bad input: what was wrong and what to do."""


def state_path(folder: Path) -> Path:
    return folder / STATE


def load_state(folder: Path) -> dict[str, Any]:
    path = state_path(folder)
    if not path.exists():
        return {"last_good": None, "nights": []}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise NightlyError(f"{path}: not a nightly state file ({exc}); move it away to start "
                           "again from night 1") from exc
    if not isinstance(data, dict) or "last_good" not in data:
        raise NightlyError(f"{path}: not a nightly state file (no 'last_good'); move it away to "
                           "start again from night 1")
    return data


def save_state(folder: Path, data: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = state_path(folder)
    scratch = path.with_suffix(".json.tmp")
    scratch.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(scratch, path)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def machine_name() -> str:
    """The runner's name (``DLPERF_MACHINE``, else ``RUNNER_NAME``, else the host's), as a
    baseline folder's name."""
    name = os.environ.get("DLPERF_MACHINE") or os.environ.get("RUNNER_NAME") or os.uname()[1]
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)[:64]


def default_store() -> Path:
    if os.environ.get("DLPERF_NIGHTLY_STORE"):
        return Path(os.environ["DLPERF_NIGHTLY_STORE"])
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "pytest-dlperf" / "nightly"
