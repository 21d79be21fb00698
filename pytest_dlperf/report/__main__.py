"""The old spelling ``python -m pytest_dlperf.report [html] ...``, kept for one release: it says
what replaced it and runs that."""

from __future__ import annotations

import sys

from ..cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    command = args if args[:1] == ["html"] else ["report", *args]
    print(f"pytest-dlperf: `python -m pytest_dlperf.report` is deprecated and goes in the next "
          f"release; use `python -m pytest_dlperf {' '.join(command[:1])} ...` (or `dlperf "
          f"{command[0]} ...`)", file=sys.stderr)
    sys.exit(main(command))
