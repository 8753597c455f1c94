"""The controller's runtime thread runs on the core of the thread that waits for it.

Every round trip on the controller is a hand-off between two threads: the caller sends
and waits; the runtime thread reads the reply and wakes the caller. They share the GIL,
so they never run Python at the same time and lose no parallelism on one core. On two
cores each hand-off is a cross-core wake-up instead: an inter-processor interrupt, and
a core that went idle has to come back from its sleep state (on a VM, a vCPU that
halted). On one core it is a plain context switch and the reply is still in its cache.

So when a thread starts to wait (``Future.get()``, ``await`` on another loop), the
runtime thread is moved to the core that thread is running on, with one
``sched_setaffinity`` call made only when that core changed since the last wait.
The waiting thread itself is never pinned: threads it starts (OpenMP, torch) inherit
its affinity, and it keeps all of its cores.

Measured on a 2-vCPU VM (benchmarks/RESULTS.md): call_one 145 -> 122 µs, a call()
over 4 actors 250 -> 185 µs. ``HPCMESH_FOLLOW_CALLER=0`` turns it off; elsewhere than
Linux it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger("hpcmesh.placement")


def _sched_getcpu():
    """libc's sched_getcpu (a vDSO read, no system call); None where there is none."""
    if not sys.platform.startswith("linux") or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        fn = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = ()
    return fn


_getcpu = _sched_getcpu()


def enabled() -> bool:
    """Whether the runtime thread should follow its callers (Linux, not turned off)."""
    return _getcpu is not None and os.environ.get("HPCMESH_FOLLOW_CALLER", "1") != "0"


class CallerFollower:
    """Moves one thread (the runtime's) to the core of whichever thread waits for it."""

    __slots__ = ("tid", "cpu", "active", "_cores")

    def __init__(self, runtime_tid: int):
        self.tid = runtime_tid      # a native thread id (threading.get_native_id)
        self.cpu = -1               # the core it was last moved to
        self.active = _getcpu is not None
        self._cores = os.sched_getaffinity(runtime_tid) if self.active else set()

    def follow(self) -> None:
        """Called by a thread about to wait for the runtime thread."""
        cpu = _getcpu()
        if cpu == self.cpu or not self.active or cpu < 0:
            return
        self.cpu = cpu
        try:
            os.sched_setaffinity(self.tid, (cpu,))
        except OSError as e:
            # The thread is gone, or a cpuset changed under us: stop following.
            log.debug("the runtime thread no longer follows its callers: %s", e)
            self.release()

    def release(self) -> None:
        """Stop following; the runtime thread gets back the cores it had at the start."""
        if self.active:
            self.active = False
            try:
                os.sched_setaffinity(self.tid, self._cores)
            except OSError:
                pass
