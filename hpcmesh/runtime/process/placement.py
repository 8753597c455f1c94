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

Children inherit the affinity of the thread that starts them, so the runtime thread
starts processes inside ``spawning()``, which unpins it for that moment.

Measured on a 2-vCPU VM (benchmarks/RESULTS.md): call_one 142-164 -> 121-123 µs, a
call() over 4 actors 252 -> 202 µs; 64 MiB transfers unchanged.
``HPCMESH_FOLLOW_CALLER=0`` turns it off; elsewhere than Linux it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading

from ...settings import env_flag

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

_followers: list["CallerFollower"] = []     # this process's (the client runtime's)


def _forget_in_child() -> None:
    # A forked child has no runtime thread, and the ids it would move are its parent's.
    _followers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def enabled() -> bool:
    """Whether the runtime thread should follow its callers (Linux, not turned off)."""
    return _getcpu is not None and env_flag("HPCMESH_FOLLOW_CALLER", True)


class CallerFollower:
    """Moves one thread (the runtime's) to the core of whichever thread waits for it."""

    __slots__ = ("tid", "cpu", "active", "_cores", "_lock", "_spawning")

    def __init__(self, runtime_tid: int):
        self.tid = runtime_tid      # a native thread id (threading.get_native_id)
        self.cpu = -1               # the core it is pinned to; -1: not pinned
        self.active = _getcpu is not None
        self._cores = os.sched_getaffinity(runtime_tid) if self.active else set()
        self._lock = threading.Lock()    # pinning against spawning (slow paths only)
        self._spawning = 0
        if self.active:
            _followers.append(self)

    def follow(self) -> None:
        """Called by a thread about to wait for the runtime thread."""
        cpu = _getcpu()
        if cpu == self.cpu or not self.active or cpu < 0:
            return
        with self._lock:
            if self._spawning or not self.active:
                return
            self.cpu = cpu
            try:
                os.sched_setaffinity(self.tid, (cpu,))
            except OSError as e:
                # The thread is gone, or a cpuset changed under us: stop following.
                log.debug("the runtime thread no longer follows its callers: %s", e)
                self.active = False
                self._unpin_locked()

    def _unpin_locked(self) -> None:
        if self.cpu != -1:
            self.cpu = -1
            try:
                os.sched_setaffinity(self.tid, self._cores)
            except OSError:
                pass

    def release(self) -> None:
        """Stop following; the runtime thread gets back the cores it had at the start."""
        with self._lock:
            self.active = False
            self._unpin_locked()
        if self in _followers:
            _followers.remove(self)


def _take_cores(cores: set) -> None:
    """A helper thread's first act: every core the process had (best effort: an initializer
    that raised would break the executor for good)."""
    try:
        os.sched_setaffinity(0, cores)
    except OSError:
        pass


async def start_helper_threads_unpinned(loop) -> None:
    """Run on the runtime thread before it is first pinned: the threads its event loop
    starts later must not inherit the pin.

    asyncio's default executor (``run_in_executor(None, ...)``, ``getaddrinfo`` on the
    stock loop) starts its threads lazily: it gets one whose threads take back every
    core as they start. libuv (uvloop) starts all of its pool threads at the first job:
    one ``getaddrinfo`` now starts them while this thread still has every core."""
    if not enabled():
        return
    from concurrent.futures import ThreadPoolExecutor
    cores = os.sched_getaffinity(0)
    loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix="hpcmesh-loop-executor",
                                                 initializer=_take_cores, initargs=(cores,)))
    if type(loop).__module__.startswith("uvloop"):
        try:
            await loop.getaddrinfo("localhost", None)
        except OSError:
            pass    # no resolver here: the pool is started all the same


@contextlib.contextmanager
def spawning():
    """Wrap the start of a child process (or thread) on a runtime thread.

    A child inherits the affinity of the thread that starts it: started from a pinned
    runtime thread, every actor process would be stuck on one core. Inside this block
    the calling thread, if it is a followed runtime thread, is not pinned."""
    me = threading.get_native_id()
    f = next((f for f in _followers if f.tid == me), None)
    if f is None:
        yield
        return
    with f._lock:
        f._spawning += 1
        f._unpin_locked()
    try:
        yield
    finally:
        with f._lock:
            f._spawning -= 1
