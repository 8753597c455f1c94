"""The actor process's lease, kept by a thread: it holds even while the event loop is blocked.

The loop enforces the lease itself (``proc.ProcRuntime``: the controller's connection closes,
a timer of ``grace`` seconds starts, a reconnect cancels it). But an async endpoint that
never yields (a CPU-bound step, ``time.sleep``) blocks that loop, and with it the timer: the
process would outlive its controller for as long as the endpoint runs, for ever if it never
returns. This thread watches the controller's socket without reading it (``poll`` for a hang-up
while the loop keeps reading), so a blocked loop cannot hide a lost controller. When the
controller has been gone for the grace period and a margin (the loop, when it is free, exits
cleanly first), it kills what the process started (its process group) and exits with 3, as
the loop's lease does. It does the same at once when the process's parent (its host agent,
or the agent's fork server) is gone: nothing could stop or reap the process any more.

``LeaseClock`` is the decision alone, fed with observations, testable without a thread.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

#: The watchdog acts this long after the loop's own lease would have: a free loop wins.
MARGIN_S = 1.0
POLL_INTERVAL_S = 0.5      # 2 wake-ups a second: nothing next to an endpoint
_HANGUP = select.POLLHUP | select.POLLERR | select.POLLNVAL | getattr(select, "POLLRDHUP", 0)


class LeaseClock:
    """When a process whose controller is gone must end: ``grace`` seconds of it being gone
    without a break (a reconnect starts the count again)."""

    def __init__(self, grace: float):
        self.grace = grace
        self.gone_since: float | None = None

    def observe(self, now: float, controller_up: bool | None) -> bool:
        """True once the lease has run out. ``None``: not connected yet (the connect has
        its own timeout), which neither starts nor stops the count."""
        if controller_up is None:
            return False
        if controller_up:
            self.gone_since = None
            return False
        if self.gone_since is None:
            self.gone_since = now
        return now - self.gone_since >= self.grace


def controller_up(fd: int | None) -> bool | None:
    """Is the controller's connection (socket ``fd``; -1: closed; None: none yet) still up?"""
    if fd is None:
        return None
    if fd < 0:
        return False
    poller = select.poll()
    poller.register(fd, _HANGUP)
    try:
        events = poller.poll(0)
    except OSError:
        return False
    return not any(ev & _HANGUP for _, ev in events)


def kill_own_group_except_self() -> int:
    """SIGKILL every other process in this process's group (what its actors started); how
    many. Read from /proc: the kernel has no "kill my group but me"."""
    me, group = os.getpid(), os.getpgrp()
    n = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
            fields = stat[stat.rindex(b")") + 2:].split()
            if int(fields[2]) == group:
                os.kill(int(name), signal.SIGKILL)
                n += 1
        except (OSError, ValueError, IndexError):
            continue
    return n


class LeaseWatchdog:
    """The thread. ``fd_of()`` gives the controller connection's socket fd as the loop last
    saw it (None before the first hello, -1 after it closed)."""

    def __init__(self, grace: float, fd_of, *, what: str = "hpcmesh proc",
                 parent: int | None = None):
        self.clock = LeaseClock(grace + MARGIN_S)
        self.fd_of = fd_of
        self.what = what
        self.parent = parent            # the host agent (or its fork server): our owner
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hpcmesh-lease", daemon=True)

    def start(self) -> "LeaseWatchdog":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        while not self.stopped.wait(POLL_INTERVAL_S):
            if self.parent is not None and os.getppid() != self.parent:
                # nobody is left to stop, supervise or reap this process (the agent was
                # killed, its node is going away): end with it, as a Slurm step's tasks do
                self._expire(f"its host agent (pid {self.parent}) is gone")
                return
            if self.clock.observe(time.monotonic(), controller_up(self.fd_of())):
                grace = self.clock.grace - MARGIN_S
                self._expire(f"controller gone for {grace:g} s while the event loop was "
                             f"blocked")
                return

    def _expire(self, why: str) -> None:
        try:       # os.write: no lock a blocked thread could hold; stderr may be a dead pipe
            os.write(2, f"{self.what}: {why}; exiting\n".encode())
        except OSError:
            pass
        kill_own_group_except_self()
        os._exit(3)
