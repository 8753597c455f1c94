"""What a node has read and not yet handled, and what it does with a frame it could not.

Two small pieces of the receiving side, apart from ``Node`` because neither routes:
the stack of frames read together and still to handle (a debugger pause takes them over,
so they keep their place ahead of later reads), and the answer to a frame whose buffer
could not be allocated (the one call or result it carried fails; nothing else is lost).
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Iterator

from ..transport import serialization
from .messages import MSG_CALL, MSG_RESULT, Failure, MessageNotReceived


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
