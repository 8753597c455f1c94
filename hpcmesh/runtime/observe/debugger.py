"""``breakpoint()`` inside an endpoint: a pdb session that a user attaches to from elsewhere.

An actor process installs :func:`breakpoint_hook` as ``sys.breakpointhook``. A breakpoint
pauses that endpoint only: pdb waits for input that comes through a :class:`DebugSession`
instead of the terminal the process does not have, and every other actor goes on. The
session is offered on the node's services (``debug_sessions``, ``debug_send``), which the
controller relays (``hpcmesh debug``, ``debug_controller()``), so the prompt travels over
the job's authenticated transport.

A sync endpoint runs on the actor's own thread: pdb blocks that thread, and the event loop
goes on. An ``async def`` endpoint runs on the event loop's thread, which also carries the
prompt: there pdb's input (:func:`_run_loop_until_line`) keeps the loop turning from inside
the paused endpoint (a nested loop, asyncio's own ``_run_once``) until a line arrives, so
the debugger's services, the other actors and the other calls run while it is paused.
asyncio is not re-entrant; that function says what it takes. Two async endpoints of one
process paused at once nest: the one paused last must continue first (the other's prompt
answers after that). uvloop cannot be run from inside itself: there the breakpoint is
skipped with a message (``HPCMESH_UVLOOP=0`` makes the process use asyncio's loop). pdb
traces one thread: ``step`` in an async endpoint may stop in other code the loop runs.

Detaching (``continue``, ``quit``, ``detach`` or end of input) continues the endpoint: a
debugger attached from afar must never kill the call it stopped.
"""

from __future__ import annotations

import asyncio
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

from .. import asyncio_internals as aio
from ..context import current_context_var

log = logging.getLogger("hpcmesh.debug")

#: How long ``debug_send`` waits for pdb to ask for its next line before it answers with
#: what it printed so far (a command that runs long: the next send picks up the rest).
REPLY_WAIT_S = 10.0

#: Async endpoints paused at once in one process: each pause nests in the one before, about
#: 20 frames deeper (past Python's recursion limit the loop itself would break).
MAX_NESTED = 16
_depth = [0]        # pauses on the loop's thread now

_ids = itertools.count(1)
SESSIONS: dict[int, "DebugSession"] = {}
_node: Any = None


def _nothing() -> None:
    pass


def _run_loop_until_line(loop: asyncio.BaseEventLoop, lines: queue.Queue) -> str | None:
    """The next line for pdb paused on the event loop's thread (None: end of input), the
    loop turning meanwhile, from inside the callback that runs the paused endpoint.

    asyncio is not re-entrant, so: the endpoint's task (if any) is left while the loop
    turns, or every other task's step would find it still running. The callback's own
    ``_run_once`` is in its loop over the handles it found ready, which the turns here run
    and pop: every handle it may still pop is among the ``pending`` ones ready now, so as
    many cancelled handles go in front of the ready queue afterwards, which it pops (and
    skips) instead; the next turns skip what it leaves. The actor is held
    (``ActorHost.hold``), the node's frame handling paused (:func:`_pause_frame_handling`),
    and see ``asyncio_internals.copy_entered_reader_contexts``.

    pdb asks for the line from its trace function, where Python traces nothing: the loop
    turns under ``sys.call_tracing`` and with no trace function, so that a breakpoint in
    another async endpoint stops too (and nests here). That one's pdb leaves the thread
    and its frames untraced when it continues: this one's traces are put back after."""
    task = asyncio.current_task(loop)
    if task is not None:
        aio.leave_task(loop, task)
    held_actor = _hold_actor()
    aio.copy_entered_reader_contexts(loop)
    paused = _pause_frame_handling()
    pending = aio.ready_count(loop)
    trace, frame = sys.gettrace(), sys._getframe()
    frame_traces = []
    while frame is not None:
        frame_traces.append((frame, frame.f_trace))
        frame = frame.f_back
    _depth[0] += 1
    try:
        return sys.call_tracing(_turn_until_line, (loop, lines))
    finally:
        _depth[0] -= 1
        aio.skip_ready(loop, pending)
        sys.settrace(trace)
        for frame, frame_trace in frame_traces:
            frame.f_trace = frame_trace
        if paused is not None:
            _node.resume_frame_handling(paused)
        if task is not None:
            aio.enter_task(loop, task)
        if held_actor is not None:
            held_actor.release()


def _turn_until_line(loop: asyncio.BaseEventLoop, lines: queue.Queue) -> str | None:
    sys.settrace(None)
    while True:
        try:
            return lines.get_nowait()
        except queue.Empty:
            pass
        if not aio.turn_once(loop):
            return None


def _hold_actor() -> Any:
    """An idle actor runs an async call inline (``ActorHost._run_inline``), not marked
    busy: paused there, every later call to it would run inline too, inside this pause,
    and the paused one could lose its place (review: it was never answered). While the
    loop turns here the actor is held (``ActorHost.hold``), so they queue. The host to
    release afterwards; None if there is no actor or a pause around this one holds it."""
    ctx = current_context_var.get()
    inst = getattr(ctx, "actor_instance", None)
    host = getattr(_node, "actors", {}).get(getattr(inst, "actor_id", None))
    return host if host is not None and host.hold() else None


def _pause_frame_handling() -> tuple | None:
    """A node handling frames (the endpoint was called from there) holds back replies
    until it is done, which it is not while the loop turns here: it stops holding them
    (``Node.pause_frame_handling``), and the frames of the same read not handled yet are
    handed to the loop; what to resume afterwards."""
    node = _node
    if node is None:
        return None
    paused = node.pause_frame_handling()
    _hand_over_unhandled_frames(node)
    return paused


def _hand_over_unhandled_frames(node) -> None:
    """Frames read with the paused call's and not handled yet are handled while it waits
    (else a call sent before the paused one, to another actor, waited for the pause):
    first in the loop's queue, so before any read queued meanwhile (a pause inside them
    hands its own rest over in front of them, behind none), each in a copy of its
    connection's reader context (not the paused endpoint's)."""
    loop = node.loop
    for conn, frames in reversed(node.take_unhandled_frames()):
        aio.call_first(loop, node.handle_frames, (conn, frames),
                       aio.reader_context(loop, conn.sock))


class _Input(io.TextIOBase):
    """pdb's stdin: lines put by ``debug_send``; reading one marks the session as waiting.
    ``loop``: the session is on that event loop's thread, which turns while pdb waits."""

    def __init__(self, session: "DebugSession", loop: asyncio.BaseEventLoop | None):
        self.session = session
        self.loop = loop
        self.lines: queue.Queue[str | None] = queue.Queue()

    def put(self, line: str | None) -> None:
        self.lines.put(line)
        if self.loop is not None:       # a loop waiting in select() would not see it
            try:
                self.loop.call_soon_threadsafe(_nothing)
            except RuntimeError:        # closed: it is not waiting
                pass

    def readline(self, size: int = -1) -> str:
        self.session._waiting()
        line = self.lines.get() if self.loop is None else _run_loop_until_line(self.loop,
                                                                              self.lines)
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
    """One paused endpoint: who it is, pdb's streams, and whether pdb waits for input.
    ``loop``: it is paused on that event loop's thread (an async endpoint)."""

    def __init__(self, where: dict[str, Any], loop: asyncio.BaseEventLoop | None = None):
        self.id = next(_ids)
        self.where = where
        self.input = _Input(self, loop)
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
                self.input.put(line)
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
    loop = None
    if node is not None and node.on_loop_thread():
        loop = node.loop
        if not aio.can_turn_inside(loop):
            print(f"hpcmesh: breakpoint() skipped: it was called on the event loop's thread "
                  f"(an async def endpoint), and this process's loop ({type(loop).__name__}) "
                  f"cannot keep running while it is paused there, which the debugger needs. "
                  f"Set HPCMESH_UVLOOP=0 in the job's environment to debug async endpoints "
                  f"(or debug it from a sync def endpoint).", file=sys.stderr, flush=True)
            return
        if _depth[0] >= MAX_NESTED:
            print(f"hpcmesh: breakpoint() skipped: {MAX_NESTED} async endpoints of this "
                  f"process are paused already (each pause nests in the one before; "
                  f"continue one of them first)", file=sys.stderr, flush=True)
            return
    session = DebugSession(_where(), loop)
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
    s = SESSIONS.get(session_id)
    if s is None:
        return {"output": "", "ended": True, "waiting": False,
                "error": f"no session {session_id} in process {getattr(_node, 'name', '')} "
                         f"(it ended; `hpcmesh debug` lists the open ones)"}
    return await asyncio.get_running_loop().run_in_executor(None, s.send, line)


def release_all() -> None:
    """The process stops: every paused endpoint continues (and so can end)."""
    for s in list(SESSIONS.values()):
        s.input.put(None)


def install(node: Any) -> None:
    """Make ``breakpoint()`` in this process's endpoints open a remote session, unless the
    user chose another hook (``PYTHONBREAKPOINT``)."""
    global _node
    _node = node
    node.services.update({"debug_sessions": list_sessions, "debug_send": send})
    node.on_stop.append(release_all)
    if not os.environ.get("PYTHONBREAKPOINT"):
        sys.breakpointhook = breakpoint_hook
