"""One progress line while a job comes up (queue state, hosts attached).

On a terminal the line is rewritten in place (``\\r``), so a long queue wait is one line;
anywhere else (a log file, a CI pipe) a line is written only when what it says changes
(its ``key``), so the log shows each state once instead of a line per poll.
"""

from __future__ import annotations

import sys

__all__ = ["Progress"]


class Progress:
    """``show(key, text)`` while waiting, ``done()`` at the end. ``enabled`` None means on
    (the jobs' ``progress=`` default); ``stream`` defaults to stderr."""

    def __init__(self, enabled: bool | None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = True if enabled is None else bool(enabled)
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self.last_key = None
        self.width = 0

    def show(self, key: tuple, text: str) -> None:
        """Say ``text``; ``key`` is what it says, less what changes every time (seconds)."""
        if not self.enabled:
            return
        if self.tty:
            pad = max(0, self.width - len(text))     # blank out the rest of a longer line
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            self.width = len(text)
        elif key != self.last_key:
            self.stream.write(f"hpcmesh: {text}\n")
            self.stream.flush()
        self.last_key = key

    def done(self) -> None:
        """End the line on a terminal, so what is printed next starts on a line of its own."""
        if self.enabled and self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()
            self.width = 0
