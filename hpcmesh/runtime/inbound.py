"""A node's reading side: what a connection read, turned into messages for the node.

Apart from ``Node`` because none of it routes: the frames of each read decoded (a batch
frame into its messages), in order, each message handed to the node's dispatch and each
hello to its links; a malformed one closes that connection alone (SPEC §7); the stack of
frames read together and still to handle (a debugger pause takes them over, so they keep
their place ahead of later reads); and the answer to a frame whose buffer could not be
allocated (the one call or result it carried fails; nothing else is lost).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections import deque
from typing import Any, Callable, Iterator

from ..transport import serialization
from ..transport.connection import Connection, ConnectionClosed
from .links import describe_conn
from .messages import (MSG_CALL, MSG_HELLO, MSG_RESULT, BatchShare, Failure,
                       MessageNotReceived, describe_exception, layout_problem)

log = logging.getLogger("hpcmesh.runtime")


class FrameReader:
    """The frames a node's connections read, handled: ``node``'s public face (its links,
    ``reply_to``, ports, ``in_batch``) and ``dispatch(msg, origin, buffers)``, the node's
    routing of one message. On the node's loop."""

    def __init__(self, node: Any, dispatch: Callable[[tuple, str | None, list], None]):
        self.node = node
        self._dispatch = dispatch
        self._unhandled = UnhandledFrames()     # of reads being handled (a debugger pause)

    def handle(self, conn: Connection, frames: list) -> None:
        """Handle the frames of one read from ``conn``, in order."""
        if len(frames) == 1:
            self._handle(conn, frames)
        else:
            with self._unhandled.reading(conn, frames) as rest:
                self._handle(conn, rest)

    def take_unhandled(self) -> list[tuple[Connection, list]]:
        """The frames read with a paused call and not handled yet (``UnhandledFrames``)."""
        return self._unhandled.take()

    def _handle(self, conn: Connection, frames) -> None:
        node = self.node
        dispatch = self._dispatch
        for fr in frames:
            if fr.dropped:
                try:
                    if not self._fail_dropped(conn, fr):
                        return
                except Exception:  # noqa: BLE001 - as dispatch: the other frames go on
                    log.exception("error failing a message dropped from %s", conn.peer)
                continue
            try:
                if fr.count == 1:
                    msgs = (serialization.loads(fr.meta, fr.buffers),)
                else:
                    msgs = serialization.loads_batch(fr.meta, fr.count)
            except Exception as e:  # noqa: BLE001
                log.warning("closing connection from %s: undecodable message (%s: %s)",
                            describe_conn(conn), type(e).__name__, e)
                conn.close(e)
                return
            origin = conn.info.get("peer_id")
            node.in_batch = batch = fr.count > 1
            # a batch carries no buffers; what goes instead tells each message its share of
            # the frame's bytes (the telemetry's ``messages.bytes``: nothing to compute)
            buffers = BatchShare(len(fr.meta) // fr.count) if batch else fr.buffers
            for msg in msgs:
                if type(msg) is not tuple or not msg:
                    log.warning("closing connection from %s: not a protocol message (%s)",
                                describe_conn(conn), type(msg).__name__)
                    conn.close(ConnectionClosed(f"{conn.peer} sent a malformed message"))
                    return
                if msg[0] == MSG_HELLO:
                    if len(msg) != 4 or type(msg[1]) is not str or not isinstance(msg[3], dict):
                        log.warning("closing connection from %s: malformed hello", conn.peer)
                        conn.close(ConnectionClosed(f"{conn.peer} sent a malformed hello"))
                        return
                    node.links.on_hello(conn, msg)
                    origin = conn.info.get("peer_id")
                    continue
                try:
                    dispatch(msg, origin, buffers)
                except Exception as e:  # noqa: BLE001 - a bad message must not kill the node
                    problem = layout_problem(msg)
                    if problem is None:         # a well-formed message: a bug here
                        log.exception("error handling a message from %s", describe_conn(conn))
                        continue
                    # the peer's doing (SPEC §7: a malformed frame closes that connection
                    # only): one line naming it, no traceback of this side's code
                    log.warning("closing connection from %s: malformed message (%s; %s)",
                                describe_conn(conn), problem, describe_exception(e))
                    conn.close(ConnectionClosed(f"{conn.peer} sent a malformed message"))
                    return

    def _fail_dropped(self, conn: Connection, fr) -> bool:
        """A frame whose buffer could not be allocated here: fail the one call or result it
        carried (``dropped_frame``), else close the connection. False if closed."""
        node = self.node
        origin = conn.info.get("peer_id")
        here = f"{node.name or node.role} (host {socket.gethostname()}, pid {os.getpid()})"
        answer = dropped_frame(fr, here, node.links.peer_name(origin))
        if answer is None:
            err = ConnectionClosed(f"out of memory reading from {conn.peer}: a buffer of "
                                   f"{fr.dropped} bytes could not be allocated on {here}; the "
                                   f"connection is closed")
            log.warning("%s", err)
            conn.close(err)
            return False
        kind, port_id, failure = answer
        log.warning("%s", failure.exc)
        if kind == MSG_CALL:
            node.reply_to(origin, port_id, failure)
        else:
            node.ports.deliver(port_id, failure)
        return True


class UnhandledFrames:
    """The frames of each read being handled, not handled yet: a stack, because a handler
    that pauses (a breakpoint) turns the loop, which may handle more reads inside it."""

    def __init__(self) -> None:
        self._stack: list[tuple[object, deque]] = []

    @contextlib.contextmanager
    def reading(self, conn, frames: list) -> Iterator[Iterator]:
        """Handle ``frames`` (read from ``conn``) through the iterator given: each is
        removed as it is handed out, so what is left can be taken over (``take``)."""
        rest = deque(frames)
        self._stack.append((conn, rest))
        try:
            yield _taken(rest)
        finally:
            self._stack.pop()

    def take(self) -> list[tuple[object, list]]:
        """A call paused while its frame was handled (a breakpoint, the loop turning inside
        it): the frames read with it and not handled yet, taken, in order, for the debugger
        to hand to the loop ahead of any later read; else they would wait for the pause to
        end, and run after frames read later."""
        out = []
        for conn, rest in self._stack:
            if rest:
                out.append((conn, list(rest)))
                rest.clear()
        return out


def _taken(rest: deque):
    while rest:
        yield rest.popleft()


def dropped_frame(fr, here: str, sender: str) -> tuple[str, int, Failure] | None:
    """A frame whose buffer could not be allocated on ``here`` (the decoder read past it):
    ``(MSG_CALL, reply port, failure)`` to answer the call it carried, ``(MSG_RESULT, port,
    failure)`` to deliver here in place of the value, or None when it can be neither
    (the connection must close). Calls and results pickle their payload apart from their
    envelope, so the envelope still says whom to tell."""
    what = f"a buffer of {fr.dropped} bytes could not be allocated on {here}: out of memory"
    try:
        msg = serialization.loads(fr.meta) if fr.count == 1 else None
    except Exception:  # noqa: BLE001 - its envelope needed the buffers: not a call
        return None
    if type(msg) is tuple and len(msg) >= 5 and msg[0] == MSG_CALL:
        return MSG_CALL, msg[4], Failure(MessageNotReceived(
            f"the arguments of {msg[2]} did not arrive: {what}; the call (from {sender}) "
            f"was not run (send smaller pieces, or give that process more memory)"))
    if type(msg) is tuple and len(msg) == 3 and msg[0] == MSG_RESULT:
        return MSG_RESULT, msg[1], Failure(MessageNotReceived(
            f"a value from {sender} (a result, or a message to a port) did not arrive: "
            f"{what} (send smaller pieces, or give this process more memory)"))
    return None
