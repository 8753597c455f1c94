"""Event-loop helpers every hpcmesh process uses: which loop, and how it ends."""

from __future__ import annotations

import asyncio
import os

from ..settings import env_flag


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed and not disabled (HPCMESH_UVLOOP=0), else asyncio's default."""
    if env_flag("HPCMESH_UVLOOP", True):
        try:
            import uvloop
            return uvloop.new_event_loop()
        except ImportError:
            pass
    return asyncio.new_event_loop()


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def finish_leftover_tasks(loop: asyncio.AbstractEventLoop, timeout: float = 1.0) -> None:
    """Cancel the tasks still pending on a stopped loop and let them unwind (as
    ``asyncio.run`` does), so none is destroyed pending: for example the ``stop()`` of a
    script that exits without waiting for it."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not tasks:
        return
    for t in tasks:
        t.cancel()
    loop.run_until_complete(asyncio.wait(tasks, timeout=timeout))


#: Give the core to whatever else is runnable on it (fan-in polling: see Node.poll_for_rest).
yield_core = getattr(os, "sched_yield", lambda: None)
