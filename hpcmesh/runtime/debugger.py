"""``breakpoint()`` inside an endpoint: a pdb session that a user attaches to from elsewhere.

An actor process installs :func:`breakpoint_hook` as ``sys.breakpointhook``. A breakpoint
in a sync endpoint (which runs on the actor's own thread) pauses that actor only: its
thread waits in pdb, whose input and output go through a :class:`DebugSession` instead of
the terminal the process does not have; the process's event loop, and so every other
actor, goes on. The session is offered on the node's services (``debug_sessions``,
``debug_send``), which the controller relays (``hpcmesh debug``, ``debug_controller()``),
so the prompt travels over the job's authenticated transport.

Detaching (``continue``, ``quit``, ``detach`` or end of input) continues the endpoint: a
debugger attached from afar must never kill the call it stopped. A breakpoint on the
event loop's thread (an ``async def`` endpoint) would stop the loop that carries the
prompt itself: it is skipped, with a message that says how to debug such an endpoint.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import pdb
import queue
import socket
import sys
import threading
from typing import Any

from .context import current_context_var

log = logging.getLogger("hpcmesh.debug")

#: How long ``debug_send`` waits for pdb to ask for its next line before it answers with
#: what it printed so far (a command that runs long: the next send picks up the rest).
REPLY_WAIT_S = 10.0

_ids = itertools.count(1)
SESSIONS: dict[int, "DebugSession"] = {}
_node: Any = None


class _Input(io.TextIOBase):
    """pdb's stdin: lines put by ``debug_send``; reading one marks the session as waiting."""

    def __init__(self, session: "DebugSession"):
        self.session = session
        self.lines: queue.Queue[str | None] = queue.Queue()

    def readline(self, size: int = -1) -> str:
        self.session._waiting()
        line = self.lines.get()
        return "" if line is None else line if line.endswith("\n") else line + "\n"


class _Output(io.TextIOBase):
    """pdb's stdout: kept until the attached user reads it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.parts: list[str] = []

    def write(self, s: str) -> int:
        with self.lock:
            self.parts.append(s)
        return len(s)

    def flush(self) -> None:
        pass

    def take(self) -> str:
        with self.lock:
            out, self.parts = "".join(self.parts), []
        return out


class _RemotePdb(pdb.Pdb):
    """pdb whose ways out all continue the endpoint (a remote user must not kill it)."""

    def __init__(self, session: "DebugSession"):
        super().__init__(stdin=session.input, stdout=session.output, nosigint=True,
                         readrc=False)
        self.use_rawinput = False
        self.prompt = "(hpcmesh-pdb) "
        self.session = session

    def _leave(self) -> int:
        self.clear_all_breaks()
        self.set_continue()
        self.session._ended()
        return 1

    def do_continue(self, arg: str) -> int:
        return self._leave()
    do_c = do_cont = do_continue

    def do_quit(self, arg: str) -> int:
        self.message("detached: the endpoint continues")
        return self._leave()
    do_q = do_exit = do_detach = do_quit

    def do_EOF(self, arg: str) -> int:     # noqa: N802 - pdb's name
        return self.do_quit(arg)


class DebugSession:
    """One paused actor: who it is, pdb's streams, and whether pdb waits for input."""

    def __init__(self, where: dict[str, Any]):
        self.id = next(_ids)
        self.where = where
        self.input = _Input(self)
        self.output = _Output()
        self._cond = threading.Condition()
        self.waiting = False
        self.ended = False
        self.pdb = _RemotePdb(self)

    def _waiting(self) -> None:
        with self._cond:
            self.waiting = True
            self._cond.notify_all()

    def _ended(self) -> None:
        with self._cond:
            self.ended = True
            self._cond.notify_all()
        SESSIONS.pop(self.id, None)

    def describe(self) -> dict[str, Any]:
        return dict(self.where, session=self.id, waiting=self.waiting)

    def send(self, line: str | None, timeout: float = REPLY_WAIT_S) -> dict[str, Any]:
        """Give pdb ``line`` (None: only read what it printed) and wait until it asks for
        the next one or the session ends; what it printed meanwhile."""
        with self._cond:
            if line is not None and not self.ended:
                self.waiting = False
                self.input.lines.put(line)
            self._cond.wait_for(lambda: self.waiting or self.ended, timeout=timeout)
            return {"output": self.output.take(), "ended": self.ended,
                    "waiting": self.waiting}


def _where() -> dict[str, Any]:
    ctx = current_context_var.get()
    inst = getattr(ctx, "actor_instance", None)
    point = getattr(inst, "rank", None)
    coords = dict(point.items()) if hasattr(point, "items") else {}
    return {"process": getattr(_node, "name", ""), "host": socket.gethostname(),
            "pid": os.getpid(), "thread": threading.current_thread().name,
            "mesh": getattr(inst, "mesh_name", None), "actor_class": getattr(inst, "class_name",
                                                                             None),
            "point": coords, "rank": getattr(point, "rank", None)}


def breakpoint_hook(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` of an actor process."""
    node = _node
    if node is not None and node.on_loop_thread():
        msg = ("hpcmesh: breakpoint() skipped: it was called on the event loop's thread (an "
               "async def endpoint), and stopping there would stop the process's "
               "connections, the debugger's included. Debug it from a sync (def) endpoint, "
               "or run the code under test in this process with this_proc().")
        print(msg, file=sys.stderr, flush=True)
        return
    session = DebugSession(_where())
    SESSIONS[session.id] = session
    frame = sys._getframe(1)
    w = session.where
    print(f"hpcmesh: {w['mesh']}[{w['rank']}] paused at a breakpoint (session {session.id} "
          f"on {w['host']} pid {w['pid']}); attach with `hpcmesh debug`", file=sys.stderr,
          flush=True)
    session.pdb.set_trace(frame)


def list_sessions() -> list[dict[str, Any]]:
    return [s.describe() for s in list(SESSIONS.values())]


async def send(session_id: int, line: str | None) -> dict[str, Any]:
    """The ``debug_send`` service: off the loop's thread (it waits for pdb)."""
    import asyncio
    s = SESSIONS.get(session_id)
    if s is None:
        return {"output": "", "ended": True, "waiting": False,
                "error": f"no session {session_id} in process {getattr(_node, 'name', '')} "
                         f"(it ended; `hpcmesh debug` lists the open ones)"}
    return await asyncio.get_running_loop().run_in_executor(None, s.send, line)


def release_all() -> None:
    """The process stops: every paused endpoint continues (and so can end)."""
    for s in list(SESSIONS.values()):
        s.input.lines.put(None)


def install(node: Any) -> None:
    """Make ``breakpoint()`` in this process's endpoints open a remote session, unless the
    user chose another hook (``PYTHONBREAKPOINT``)."""
    global _node
    _node = node
    node.services.update({"debug_sessions": list_sessions, "debug_send": send})
    node.on_stop.append(release_all)
    if not os.environ.get("PYTHONBREAKPOINT"):
        sys.breakpointhook = breakpoint_hook
