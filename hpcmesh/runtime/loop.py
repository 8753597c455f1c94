"""Event-loop helpers every hpcmesh process uses: which loop, and how it ends."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Callable, TypeVar

from ..settings import env_flag
from .future import register_loop_thread, unregister_loop_thread

T = TypeVar("T")


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


def start_loop_thread(build: Callable[[asyncio.AbstractEventLoop], T], name: str
                      ) -> tuple[T, threading.Thread]:
    """A new event loop running on a daemon thread, and what ``build(loop)`` made on that
    thread before the loop started (a controller's node). An error of ``build`` (a bad TLS
    setting, a port in use) is raised here, to the caller, who would otherwise wait for a
    loop that never runs."""
    ready = threading.Event()
    box: dict = {}

    def main() -> None:
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        register_loop_thread(loop)
        try:
            box["made"] = build(loop)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
            ready.set()
            unregister_loop_thread(loop)
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
            finish_leftover_tasks(loop)
        finally:
            unregister_loop_thread(loop)
            loop.close()

    thread = threading.Thread(target=main, name=name, daemon=True)
    thread.start()
    ready.wait()
    if "error" in box:
        raise box["error"]
    return box["made"], thread
