"""Is a process still there, and waiting until some are gone (tests that count pids)."""

from __future__ import annotations

import time


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_gone(pids, timeout: float = 5.0) -> list[int]:
    """The pids still alive after waiting up to ``timeout`` for all to go."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]
