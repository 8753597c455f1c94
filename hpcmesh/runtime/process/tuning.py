"""Process-level tuning for bulk transfers.

glibc serves allocations above 128 KiB-32 MiB (dynamic) with fresh ``mmap``
pages and returns them on free, so every 64 MiB message pays for page faults
on brand-new memory (about 1.3 GB/s on our VMs, against about 8 GB/s for
memory already mapped). Raising the mmap and trim thresholds lets freed
buffers be reused. ``HPCMESH_MALLOC_TUNE=0`` turns this off.

The thresholds only apply to the *main* arena. A thread other than the main
thread gets its own arena, whose heaps are capped at 64 MiB (glibc's
``HEAP_MAX_SIZE``): a 64 MiB request never fits there, so glibc serves it with
a fresh ``mmap`` whatever the thresholds say and pays the page faults again on
every message (measured: ``bytearray(64 MiB)`` takes 1 ms on the main thread,
35 ms on another thread). The client's transport loop runs on such a thread and
allocates every buffer it receives, so the client asks for ``arena_max=1``:
every thread then allocates from the main arena (one malloc lock for all
threads, which the GIL mostly serializes anyway). It must be set before the
loop thread starts: a thread keeps the arena it already has. Worker processes
run their loop on the main thread and keep glibc's default arenas.
``HPCMESH_MALLOC_ARENAS=N`` overrides the limit (0: glibc's default).
"""

from __future__ import annotations

import ctypes
import ctypes.util

from ...settings import env_flag, env_number

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_done = False


def tune_malloc(mmap_threshold: int = 256 * 1024**2, trim_threshold: int = 1024**3,
                arena_max: int = 0) -> bool:
    """Apply once per process; True if glibc accepted it. ``arena_max`` > 0 limits
    glibc's arenas (for a process whose transport loop is not its main thread)."""
    global _done
    if _done or not env_flag("HPCMESH_MALLOC_TUNE", True):
        return False
    _done = True
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False     # not glibc (musl, macOS): nothing to tune
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_THRESHOLD, min(mmap_threshold, 2**31 - 1))
    ok &= mallopt(_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1))
    arena_max = int(env_number("HPCMESH_MALLOC_ARENAS", arena_max, unit="malloc arenas",
                               maximum=4096, integer=True, note="0: glibc's default"))
    if arena_max > 0:
        ok &= mallopt(_M_ARENA_MAX, arena_max)
    return bool(ok)
