"""Channels: a sendable Port and the PortReceiver that gets what is sent to it."""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from ..runtime.client import current_or_client_node
from ..runtime.future import Future
from ..runtime.messages import Failure, fail_msg
from ..runtime.node import PortRef

T = TypeVar("T")


class Port(Generic[T]):
    """Send end of a channel (``Port[T]`` sends Ts); picklable, works from any process
    of the job.

    Also the response port of an ``explicit_response_port`` endpoint; there it has no
    ``ref`` when the call was a ``broadcast()`` (nobody waits), and drops what it is sent."""
    __slots__ = ("ref",)

    def __init__(self, ref: PortRef | None):
        self.ref = ref

    def send(self, value: T) -> None:
        """Deliver ``value`` to the receiver (in send order); one that cannot be pickled
        raises here, one the receiver cannot unpickle fails only that message there."""
        if self.ref is not None:
            current_or_client_node().send_value(self.ref, value, "port message")

    def exception(self, exc: BaseException) -> None:
        """Fail the receiving end with ``exc`` (a caller waiting on a response port gets it
        raised)."""
        if not isinstance(exc, BaseException):
            raise TypeError(f"Port.exception() takes an exception, got {type(exc).__name__}")
        if self.ref is not None:
            current_or_client_node().send(self.ref.node, fail_msg(self.ref.port_id, exc), "port error")

    def __reduce__(self):
        return Port, (self.ref,)

    def __repr__(self) -> str:
        if self.ref is None:
            return "Port(nobody waits)"
        return f"Port({self.ref.node.node_id[:8]}:{self.ref.port_id})"


class PortReceiver(Generic[T]):
    """Receive end; ``recv()`` returns a Future of the next value."""

    def __init__(self):
        self._values: deque = deque()
        self._waiters: deque[Future] = deque()
        self.port = Port(current_or_client_node().open_port(self._deliver))

    def _deliver(self, value) -> None:
        if self._waiters:
            _settle(self._waiters.popleft(), value)
        else:
            self._values.append(value)

    def recv(self) -> Future[T]:
        f = Future()
        node = current_or_client_node()
        if node.on_loop_thread():
            self._recv_into(f)
        else:
            node.call_soon(self._recv_into, f)
        return f

    def _recv_into(self, f: Future) -> None:
        if self._values:
            _settle(f, self._values.popleft())
        else:
            self._waiters.append(f)

    def close(self) -> None:
        current_or_client_node().close_port(self.port.ref)


class Channel(Generic[T]):
    """``Channel[int].open()``: a connected Port and PortReceiver (the parameter is for
    type checkers only)."""

    @staticmethod
    def open() -> tuple[Port[T], PortReceiver[T]]:
        r = PortReceiver()
        return r.port, r


def _settle(f: Future, value) -> None:
    """A value that came to the port, or the error that came instead (a value sent to it
    that could not be unpickled or received here): ``recv()`` raises that."""
    if type(value) is Failure:
        f.set_exception(value.exc)
    else:
        f.set_result(value)
