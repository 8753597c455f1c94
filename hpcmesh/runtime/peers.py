"""What a node knows about each other node: how to reach it, its connection, what waits on it.

Plain state with no I/O: the node (``node.py``) dials, reads and writes; this table says
which connection a message to a node goes on, which frames wait for one, and which reply
ports must fail when that node is lost. Safe to touch from any thread for the operations
the node does off its loop (``peer``, ``get``, ``load``): each is one dict operation.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .messages import Failure, NodeRef

if TYPE_CHECKING:
    from ..transport.connection import Connection


#: The load of a lost node: more than any number of calls in flight to a live one.
LOST_LOAD = 1 << 40

#: How many times a settled member (``Peer.settled``) changed in a way that a cast must
#: check for: a host group found clean at one value of it is still clean while it holds
#: (``relay.py``). One for the process, as the tests run several nodes in one: a change
#: on any of them costs each group no more than the checks of its next cast.
_changes = 0


def changes() -> int:
    """The count of changes to settled members so far (``unsettle``)."""
    return _changes


def unsettle() -> None:
    """A settled member was lost, got a direct call in flight, or its relayed messages
    took another route: every host group has to check its members again."""
    global _changes
    _changes += 1


@dataclass(slots=True)
class Peer:
    ref: NodeRef | None
    conn: Connection | None = None
    dialing: asyncio.Future | None = None
    lost: BaseException | None = None
    inflight: set = field(default_factory=set)   # one-shot reply port ids awaiting this peer
    extras: list = field(default_factory=list)   # further connections, read but not sent on
    # Frames waiting for a connection, in send order. While it is not empty every sender
    # appends here too, so a message sent once the connection is up cannot overtake one
    # that was queued while it was being dialed.
    backlog: deque = field(default_factory=deque)
    # Messages to this node sent through its host agent (``runtime/relay.py``): the number
    # of the last one, and the highest it is known to have read (its answer to that one
    # came back). While they differ, later calls to it go that way too (order: SPEC §11),
    # through ``relay_via`` (that agent, or the head of a tree of agents, and then down
    # ``relay_path``, the agents below it to the member's own), naming it ``relay_name``.
    relay_sent: int = 0
    relay_acked: int = 0
    relay_via: NodeRef | None = None
    relay_path: tuple = ()
    relay_name: str = ""
    #: the secret to dial it with, where not this node's own (a host agent relaying to a
    #: process started under another secret than its own)
    secret: bytes | None = None
    #: a member of a host group that casts may reach unchecked while nothing changed
    #: (``relay.py``'s settled groups): its loss, a direct call to it, or another route for
    #: its relayed messages calls ``unsettle()``
    settled: bool = False

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.closed


class PeerTable:
    def __init__(self) -> None:
        self.by_id: dict[str, Peer] = {}
        #: the number of the last message relayed through a host agent (``relay.py``:
        #: each cast takes the next, under its lock, for every member it reaches)
        self.relay_clock = 0

    @staticmethod
    def set_lost(p: Peer, exc: BaseException) -> None:
        """``p`` is lost with ``exc`` (a settled member: casts must check it again)."""
        p.lost = exc
        if p.settled:
            unsettle()

    def peer(self, ref: NodeRef) -> Peer:
        """The entry for ``ref``'s node, made on first meeting; learns its addresses."""
        p = self.by_id.get(ref.node_id)
        if p is None:
            # setdefault: two threads meeting a new node at once must share one Peer
            p = self.by_id.setdefault(ref.node_id, Peer(ref))
        if p.ref is None or (ref.addresses and not p.ref.addresses):
            p.ref = ref
        return p

    def get(self, node_id: str) -> Peer | None:
        return self.by_id.get(node_id)

    def ref_of(self, node_id: str) -> NodeRef:
        """How to reach ``node_id``: its addresses when known, else its id alone (a node
        that has not said hello yet: what is sent to it waits for it)."""
        p = self.by_id.get(node_id)
        return p.ref if p is not None and p.ref is not None else NodeRef(node_id, ())

    def load(self, node_id: str) -> int:
        """Replies still awaited from ``node_id``; a node known to be lost weighs more than
        any live one (``choose()`` then picks it only when every member is lost, and fails
        with why)."""
        p = self.by_id.get(node_id)
        if p is None:
            return 0
        if p.lost is not None and not p.connected:
            return LOST_LOAD
        return len(p.inflight)

    def connected(self, node_id: str) -> bool:
        p = self.by_id.get(node_id)
        return p is not None and p.connected

    def values(self) -> list[Peer]:
        return list(self.by_id.values())

    @staticmethod
    def fail_inflight(p: Peer, exc: BaseException, deliver: Callable[[int, Any], None]) -> None:
        """Fail every reply port waiting on ``p`` (``p.lost`` already set).

        The set is drained in place rather than swapped, so a port another thread adds
        meanwhile is either drained here or sees ``p.lost`` in ``PortTable.expect_reply``."""
        inflight = p.inflight
        failed = Failure(exc)
        while inflight:
            try:
                pid = inflight.pop()
            except KeyError:
                break
            deliver(pid, failed)
