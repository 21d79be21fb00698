"""Live progress of a running case, the pytest side: ``LiveLine`` follows rank 0's progress file
(``rank.progress``) from a thread of the pytest process while the launch runs, and shows:

- on a terminal, one line under the test's own that it rewrites in place: the case, the launch
  and its phase ("launch 2/3: window 1/2 13.21 images/s"), erased when the launch ends;
- elsewhere (a CI log), one plain line per timed window;
- nothing under ``-q``, under xdist, or in external mode (pytest is a rank there itself).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..rank.progress import describe

POLL_S = 0.25  # how often the file is read while a launch runs

class LiveLine:
    """The pytest side: one per session, shown by the reporting process only."""

    def __init__(self, config: Any, enabled: bool = True) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        self._reporter = reporter
        self._capture = config.pluginmanager.get_plugin("capturemanager")
        if not enabled or reporter is None or config.get_verbosity() < 0:
            self.mode: str | None = None
        else:
            self.mode = "terminal" if reporter.isatty else "lines"
        self._lock = threading.Lock()
        self._shown = False
        self._column = 0

    @contextmanager
    def watch(self, path: Path, case: str, label: str, windows: bool = True) -> Iterator[None]:
        """Follow ``path`` (rank 0's events) for the duration of one launch. ``windows``
        False (a memory search's probe, whose figure is no measurement and which may yet run
        out of memory after its window): no window's figure is shown."""
        if self.mode is None:
            yield
            return
        stop = threading.Event()
        follower = threading.Thread(target=self._follow, args=(path, case, label, stop, windows),
                                    name="dlperf-progress", daemon=True)
        # pytest captures the test's output; the test is waiting on its ranks (other processes,
        # writing to their own logs), so the terminal is lent to the progress meanwhile.
        with (self._capture.global_and_fixture_disabled() if self._capture is not None
              else contextlib.nullcontext()):
            self._show(case, label, "launching")
            follower.start()
            try:
                yield
            finally:
                stop.set()
                follower.join()
                self._erase()

    def note(self, case: str, label: str, text: str) -> None:
        """A plain line where lines are written (a CI log): a probe's outcome."""
        if self.mode == "lines":  # the terminal lent as for a launch's lines (``watch``)
            with (self._capture.global_and_fixture_disabled() if self._capture is not None
                  else contextlib.nullcontext()):
                self._line(f"pytest-dlperf: {case} {label}: {text}")

    def _follow(self, path: Path, case: str, label: str, stop: threading.Event,
                windows: bool = True) -> None:
        offset, partial = 0, ""
        while True:
            ended = stop.wait(POLL_S)
            try:
                with open(path, encoding="utf-8") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
                    offset = fh.tell()
            except OSError:
                chunk = ""  # not written yet (the ranks are starting)
            lines = (partial + chunk).split("\n")
            partial = lines.pop()
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                window = event.get("phase") == "window"
                if self.mode == "lines" and window and windows:
                    self._line(f"pytest-dlperf: {case} {label}: {describe(event)}")
                elif self.mode == "terminal":
                    self._show(case, label, describe(event) if windows or not window
                               else "a step at this size")
            if ended:
                return

    # -- output ------------------------------------------------------------------------------

    def _raw(self, text: str) -> None:
        """Straight to the terminal: pytest's writer keeps count of its line's width (for the
        right-aligned percentage), and this line is not part of it."""
        out = self._reporter._tw._file
        out.write(text)
        out.flush()

    def _show(self, case: str, label: str, phase: str) -> None:
        if self.mode != "terminal":
            return
        with self._lock:
            if not self._shown:
                self._column = self._reporter._tw.width_of_current_line
                self._raw("\n")
                self._shown = True
            width = max(20, self._reporter._tw.fullwidth - 1)
            text = f"  [dlperf] {case} {label}: {phase}"
            if len(text) > width:
                text = text[:width - 3] + "..."
            self._raw("\r\x1b[2K" + text)

    def _erase(self) -> None:
        """Back to where pytest left its own line: the live one cleared, the cursor up one line
        and at that line's end."""
        with self._lock:
            if not self._shown:
                return
            self._raw("\r\x1b[2K\x1b[1A" + (f"\x1b[{self._column}C" if self._column else ""))
            self._shown = False

    def _line(self, text: str) -> None:
        with self._lock:
            self._reporter.write_line(text)

