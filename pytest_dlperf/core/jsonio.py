"""JSON as pytest-dlperf writes it: sorted keys, indented, trailing newline, atomically."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any


def dumps(data: Any) -> str:
    return json.dumps(data, sort_keys=True, indent=2) + "\n"


def write_json_atomic(path: Path, data: Any) -> None:
    """Temp file in the same folder, fsync, rename: a reader sees the old file or the new one.
    Its mode is what the umask gives a new file (0644 under 022), as any other output file's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_beside(path)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(dumps(data))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _create_beside(path: Path) -> tuple[int, str]:
    """A new temp file beside ``path``, opened for writing. Not ``tempfile.mkstemp``: it
    creates 0600 whatever the umask, and the rename would hand that to the results file; here
    the kernel applies the umask (and a default ACL) to 0666, as for a file opened plainly."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), str(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp file name beside {path}")
