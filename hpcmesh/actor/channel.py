"""Channels: a sendable Port and the PortReceiver that gets what is sent to it."""

from __future__ import annotations

from collections import deque

from ..runtime.future import Future
from ..runtime.node import MSG_DELIVER, PortRef
from .mesh import _node


class Port:
    """Send end of a channel; picklable, works from any process of the job."""
    __slots__ = ("ref",)

    def __init__(self, ref: PortRef):
        self.ref = ref

    def send(self, value) -> None:
        _node().send(self.ref.node, (MSG_DELIVER, self.ref.port_id, value), "port message")

    def __reduce__(self):
        return Port, (self.ref,)

    def __repr__(self) -> str:
        return f"Port({self.ref.node.node_id[:8]}:{self.ref.port_id})"


class PortReceiver:
    """Receive end; ``recv()`` returns a Future of the next value."""

    def __init__(self):
        self._values: deque = deque()
        self._waiters: deque[Future] = deque()
        self.port = Port(_node().open_port(self._deliver))

    def _deliver(self, value) -> None:
        if self._waiters:
            self._waiters.popleft().set_result(value)
        else:
            self._values.append(value)

    def recv(self) -> Future:
        f = Future()
        node = _node()
        if node.on_loop_thread():
            self._recv_into(f)
        else:
            node.call_soon(self._recv_into, f)
        return f

    def _recv_into(self, f: Future) -> None:
        if self._values:
            f.set_result(self._values.popleft())
        else:
            self._waiters.append(f)

    def close(self) -> None:
        _node().close_port(self.port.ref)


class Channel:
    @staticmethod
    def open() -> tuple[Port, PortReceiver]:
        r = PortReceiver()
        return r.port, r
