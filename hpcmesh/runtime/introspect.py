"""What a process can tell about itself for the admin view: its actors and its threads' stacks.

Two ways to get the stacks, because the cheap one needs the event loop:

* the ``admin_stacks`` service (``sys._current_frames()`` + ``traceback``), answered by the
  process's event loop: thread names and full Python frames;
* when the loop does not answer (an ``async def`` endpoint blocking it), the host agent
  sends :data:`STACK_SIGNAL` and reads what ``faulthandler`` wrote into the process's stack
  file (:func:`stack_file`). faulthandler writes from its C signal handler, so it answers
  whatever the Python code is doing. SIGUSR1/SIGUSR2 are not used: they are Slurm's
  time-limit warning (``agent_main.NOTICE_SIGNALS``); a real-time signal nobody sends is.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import traceback
from typing import Any

from .node import runtime_dir

#: The signal a process dumps its stacks on (None where the platform has no real-time
#: signals: then there is no fallback).
STACK_SIGNAL: int | None = (signal.SIGRTMIN + 4) if hasattr(signal, "SIGRTMIN") else None

#: The admin view's URL, exported to processes started after it is up (Monarch's name and
#: ours); ``host_mesh`` passes them on to the agents of other hosts too.
ADMIN_URL_VARS = ("MONARCH_ADMIN_URL", "HPCMESH_ADMIN_URL")

_stack_file_handle = None     # kept open for faulthandler, which writes to its fd


def stack_file(pid: int) -> str:
    """Where process ``pid`` writes its signal-triggered stack dumps: the per-user runtime
    directory (mode 0700), not the log directory, since stacks may show data."""
    return os.path.join(runtime_dir(), f"stacks-{pid}.txt")


def install_stack_dump_handler() -> bool:
    """Make :data:`STACK_SIGNAL` dump every thread's stack into :func:`stack_file` (this
    process); False where it cannot (no such signal, or the file cannot be opened)."""
    global _stack_file_handle
    if STACK_SIGNAL is None:
        return False
    import faulthandler
    try:
        fd = os.open(stack_file(os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        _stack_file_handle = os.fdopen(fd, "a")
        faulthandler.register(STACK_SIGNAL, file=_stack_file_handle, all_threads=True,
                              chain=False)
    except (OSError, RuntimeError, ValueError):
        return False
    return True


def remove_stack_file(pid: int) -> None:
    try:
        os.unlink(stack_file(pid))
    except OSError:
        pass


def thread_stacks() -> list[dict]:
    """Every thread's Python stack now, innermost frame last (as ``traceback`` prints it)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append({"thread": names.get(ident, f"thread {ident}"), "ident": ident,
                    "stack": "".join(traceback.format_stack(frame))})
    return out


def actor_report(node: Any) -> list[dict]:
    """The actors hosted on ``node``: mesh name, class, point, status and last error."""
    out = []
    for actor_id, host in list(node.actors.items()):
        inst = getattr(host, "instance", None)
        fault = getattr(host, "fault", None)
        status = "failed" if fault is not None else \
            "stopped" if getattr(host, "stopped", False) else "running"
        out.append({"actor_id": actor_id,
                    "mesh": getattr(inst, "mesh_name", ""),
                    "class": getattr(inst, "class_name", type(getattr(host, "obj", None)).__name__),
                    "point": _point(getattr(inst, "rank", None)),
                    "status": status,
                    "error": str(fault) if fault is not None else None})
    return out


def _point(point: Any) -> Any:
    """A mesh point as JSON: its coordinates by dimension name when it has them."""
    if point is None:
        return None
    try:
        return dict(point.items()) if hasattr(point, "items") else dict(point)
    except (TypeError, ValueError):
        return str(point)


def install_services(node: Any) -> None:
    """Offer ``admin_actors`` and ``admin_stacks`` on ``node`` (an actor process)."""
    node.services.update({"admin_actors": lambda: actor_report(node),
                          "admin_stacks": thread_stacks})


async def dump_stacks_by_signal(pid: int, timeout: float = 3.0) -> str:
    """Signal ``pid`` to dump its stacks (see :func:`install_stack_dump_handler`) and return
    what it wrote; raises when it cannot be asked or wrote nothing in ``timeout`` s."""
    if STACK_SIGNAL is None:
        raise RuntimeError("this platform has no real-time signals: no stack dump by signal")
    path = stack_file(pid)
    try:
        start = os.path.getsize(path)
    except OSError:
        raise RuntimeError(f"process {pid} has no stack file {path} (it did not install the "
                           f"stack-dump handler)") from None
    os.kill(pid, STACK_SIGNAL)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    size = start
    while loop.time() < deadline:
        await asyncio.sleep(0.1)
        now = os.path.getsize(path)
        if now > start and now == size:     # it wrote, and has stopped writing
            break
        size = now
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read().decode("utf-8", "replace")
    if not text:
        raise TimeoutError(f"process {pid} wrote no stacks within {timeout} s")
    return text
