"""Is a process still there, waiting until some are gone (tests that count pids), and
waiting until anything is true (``wait_until``: what a test uses instead of a fixed sleep)."""

from __future__ import annotations

import os
import time


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    """``predicate()``'s first truthy value, polled until ``timeout`` seconds have passed;
    then an AssertionError that names ``what`` never happened. A fixed sleep guesses how long
    something takes and breaks on a loaded machine; this waits exactly as long as it takes."""
    deadline = time.monotonic() + timeout
    while not (got := predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(interval)
    return got


def wait_gone(pids, timeout: float = 5.0) -> list[int]:
    """The pids still alive after waiting up to ``timeout`` for all to go."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def processes_with_env(mark: str) -> list[int]:
    """Live processes whose environment holds ``mark`` (``NAME=value`` or a part of one):
    how a test finds the processes a run started when it never learnt their pids."""
    return [pid for pid, environ in _read_all("environ") if mark.encode() in environ
            and alive(pid)]


def processes_with_cmdline(marker: str) -> list[tuple[int, str]]:
    """Live processes whose command line holds ``marker``: (pid, its first 200 chars)."""
    out = []
    for pid, raw in _read_all("cmdline"):
        cmd = raw.replace(b"\0", b" ").decode(errors="replace")
        if marker in cmd and alive(pid):
            out.append((pid, cmd[:200]))
    return out


def _read_all(name: str):
    """(pid, /proc/<pid>/<name>) of every process that can be read."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/{name}", "rb") as f:
                    yield int(entry), f.read()
            except OSError:
                continue
