"""JSON as pytest-dlperf writes it: sorted keys, indented, trailing newline, atomically."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def dumps(data: Any) -> str:
    return json.dumps(data, sort_keys=True, indent=2) + "\n"


def write_json_atomic(path: Path, data: Any) -> None:
    """Temp file in the same folder, fsync, rename: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(dumps(data))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
