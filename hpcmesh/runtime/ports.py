"""The ports of one node: where delivered values go, by port id. No I/O, no threads of its own.

A port is an integer id on a node. Two kinds share the id space: callback ports
(``open``: channels, event streams; every delivery calls the callback, or only the first
with ``once``) and one-shot reply ports (``expect_reply``: a call's reply resolves its
Future). A reply port may name the peer expected to answer; the peer table then fails it
when that peer is lost (``peers.Peer.inflight``). Called from any thread: each step is a
single dict operation, atomic under the GIL, and the order of the steps is what keeps a
reply and a loss from both resolving one Future (see ``expect_reply``).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Callable

from .future import Future
from .messages import Failure
from .peers import unsettle

if TYPE_CHECKING:
    from .peers import Peer


class PortTable:
    def __init__(self) -> None:
        self.callbacks: dict[int, tuple[Callable[[Any], None], bool]] = {}
        #: pid -> (Future or a FanInSlot, the peer expected to answer, and, for an endpoint
        #: call, its actor id and endpoint: what a failure that is not the endpoint's is told)
        self.replies: dict[int, tuple[Any, Peer | None, str | None, str | None]] = {}
        self.ids = itertools.count(1)
        #: ``name_call(exc, actor_id, endpoint, peer)``: the error a call fails with when its
        #: peer is lost with ``exc`` (the runtime's owner names the call in it, as
        #: Monarch's "Endpoint call m.ep() failed, ..."); None: ``exc`` as it is
        self.name_call: Callable[[BaseException, str, str, Any], BaseException] | None = None
        #: reply ports whose MSG_RESULT is delivered still pickled (a ``RawResult``): a
        #: host agent relaying a member's reply never unpickles the user's value
        self.raw: set[int] = set()

    def failed_call(self, exc: BaseException, actor_id: str | None,
                    endpoint: str | None, peer=None) -> BaseException:
        """``exc`` as the call (``actor_id``, ``endpoint``) to ``peer``, if known, that it
        fails should raise it."""
        if actor_id is None or self.name_call is None:
            return exc
        return self.name_call(exc, actor_id, endpoint, peer)

    def open(self, callback: Callable[[Any], None], once: bool = False) -> int:
        pid = next(self.ids)
        self.callbacks[pid] = (callback, once)
        return pid

    def close(self, pid: int) -> None:
        self.callbacks.pop(pid, None)
        reply = self.replies.pop(pid, None)
        if reply is not None and reply[1] is not None:
            reply[1].inflight.discard(pid)

    def expect_reply(self, peer: Peer | None, actor_id: str | None = None,
                     endpoint: str | None = None) -> tuple[Future, int]:
        """A one-shot reply port and the Future its first delivery resolves; the Future
        fails at once if ``peer`` is known lost already. ``actor_id``, ``endpoint``: the
        endpoint call it is for, named in the error of a lost peer (``failed_call``)."""
        fut = Future()
        pid = next(self.ids)
        self.replies[pid] = (fut, peer, actor_id, endpoint)
        if peer is not None:
            peer.inflight.add(pid)
            if peer.settled:
                unsettle()      # a call to it (sent straight, or relayed now but straight if
                                # its relayed calls are answered first): casts check it
            # Checked after registering: either the loop's fail_inflight sees this port, or
            # this check sees the loss it recorded first. Nothing can slip between the two.
            if peer.lost is not None and peer.conn is None:
                peer.inflight.discard(pid)
                if self.replies.pop(pid, None) is not None:
                    fut.set_exception(self.failed_call(peer.lost, actor_id, endpoint))
        return fut, pid

    def expect_into(self, peer: Peer, sink: Any, actor_id: str | None = None,
                    endpoint: str | None = None) -> int:
        """``expect_reply`` resolving ``sink`` (an object with a Future's ``set_result``
        and ``set_exception``: a ``FanInSlot``) instead of a new Future; the port id."""
        pid = next(self.ids)
        self.replies[pid] = (sink, peer, actor_id, endpoint)
        peer.inflight.add(pid)
        if peer.settled:
            unsettle()          # as in expect_reply
        if peer.lost is not None and peer.conn is None:     # as in expect_reply
            peer.inflight.discard(pid)
            if self.replies.pop(pid, None) is not None:
                sink.set_exception(self.failed_call(peer.lost, actor_id, endpoint))
        return pid

    def deliver(self, port_id: int, value: Any) -> None:
        """Hand ``value`` (a ``Failure`` for an error) to port ``port_id``; a port that is
        closed already drops it (a late reply: nobody waits any more)."""
        reply = self.replies.pop(port_id, None)
        if reply is not None:
            fut, p, actor_id, endpoint = reply
            if p is not None:
                p.inflight.discard(port_id)
            if type(value) is Failure:
                fut.set_exception(value.exc if actor_id is None else
                                  self.failed_call(value.exc, actor_id, endpoint, p))
            else:
                fut.set_result(value)
            return
        entry = self.callbacks.get(port_id)
        if entry is None:
            return
        cb, once = entry
        if once and self.callbacks.pop(port_id, None) is None:
            return   # another thread failed this port meanwhile
        cb(value)
