"""One host's share of a call(): one reply port for every member a host agent relays to.

A call() over G members of a host used to cost its sender a reply port per member: a
registration, a lookup, a peer's set touched and a slot resolved through a Future's
setters, on the way out and again on the way back. A ``HostShare`` is the sender's one
record of that share: the agent's folded answers name it once, and each entry says which
member it is by its position in the share. What stays per member is only what the
answer itself is: its value (unpickled on its own) and the order bookkeeping of its peer
(``Peer.relay_acked``, see ``relay.py``). A share whose members all answer at once, and
alike or in order, goes into the call's results as one run (``FanIn.put_range``).

Failures keep their grain. The share's port is registered with the agent's peer (and, in
a tree, is in its head's in-flight set too): that agent lost fails every member not yet
answered. A member lost fails its own slot only (``fail_member``, run when its peer's
in-flight calls fail), named as a direct call to it would be.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .messages import Failure
from .relay_windows import HOLD

if TYPE_CHECKING:
    from .future import FanIn
    from .peers import Peer
    from .ports import PortTable

class _Unreadable:
    """A member's value that could not be unpickled (a result may itself be an exception
    object, so the error is told apart by this wrapper)."""
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


#: Values one object of which may stand for several members' alike answers (a list would
#: be one list in every slot: the caller editing one would edit them all).
IMMUTABLE = (type(None), bool, int, float, complex, str, bytes)


def _loaded(loads: Callable[[bytes], Any], data: bytes) -> Any:
    try:
        return loads(data)
    except Exception as e:  # noqa: BLE001 - fails that member's slot, named
        return _Unreadable(e)


#: The position an entry names for "every member of the share" (the agent could not hand
#: the share out at all: an agent below it in a tree cannot be reached).
ALL = -1


class HostShare:
    """The members of one call() that one host agent relays (a reply port's sink)."""
    __slots__ = ("ports", "fan", "slots", "peers", "seq", "pending", "first", "actor_id",
                 "endpoint", "pid", "open", "also")

    def __init__(self, ports: PortTable, fan: FanIn, actor_id: str, endpoint: str):
        self.ports = ports
        self.fan = fan
        self.slots: list[int] = []      # each member's position in the call's results
        self.peers: list[Peer] = []
        self.seq = 0                    # the number the call was relayed to them under
        self.pending = bytearray()      # per member: 1 until it answered (or failed)
        self.first = -1                 # slots[0] where the slots follow on, else -1
        self.actor_id = actor_id
        self.endpoint = endpoint
        self.pid = 0
        self.open = 0                   # members not answered yet
        self.also: Peer | None = None   # a tree's head, which holds the port too

    def fill(self, slots: list, peers: list, seq: int, skipped: set | None = None,
             first: int = -1) -> None:
        """The members: those of ``slots``/``peers`` (a view's lists, read only here) not in
        ``skipped``, relayed the call as number ``seq``; ``first``: ``slots[0]`` where
        the slots follow on one from another (their answers then fill a run of the
        results at once), else -1."""
        if skipped:
            keep = [i for i in range(len(slots)) if i not in skipped]
            slots = [slots[i] for i in keep]
            peers = [peers[i] for i in keep]
            first = -1
        self.slots, self.peers, self.seq, self.first = slots, peers, seq, first
        self.pending = bytearray(b"\x01") * len(peers)

    def take(self, i: int, value: Any) -> None:
        """The answer of member ``i`` (a ``Failure`` for an error; ``ALL``: every member
        still open gets it). A second answer of a member (its loss raced its reply) is
        dropped."""
        if i == ALL:
            self.set_exception(value.exc)
            return
        self.take_results([i], [value], None, None)

    def take_results(self, positions: list, values: list,
                     loads: Callable[[bytes], Any] | None,
                     unreadable: Callable[[Peer, BaseException], Failure]) -> None:
        """The answers of the members at ``positions`` (a MSG_RESULTS or MSG_VALUES
        entry): ``values`` one per position, or one for them all (alike: unpickled once).
        ``loads`` unpickles a MSG_RESULTS value (None: plain values, or a ``Failure``); one
        that cannot be unpickled fails that member's slot alone (``unreadable(peer,
        error)``). A member's answer that came already (its loss raced its reply) is
        dropped. The whole share answering at once, each as it should (most call()s), is
        a few steps whatever its size (``_take_all``); else one loop over its members."""
        alike = len(values) == 1
        if alike:
            value = values[0] if loads is None else _loaded(loads, values[0])
            if loads is not None and len(positions) > 1 and type(value) not in IMMUTABLE:
                alike = False       # equal pickles, but each member gets its own object
                values = values * len(positions)
        if not alike and loads is not None:
            values = [_loaded(loads, v) for v in values]
        k = len(positions)
        if (self.first >= 0 and k == self.open == len(self.pending)
                and self._take_all(positions, value if alike else None,
                                   None if alike else values)):
            return
        pending, peers, slots, put = self.pending, self.peers, self.slots, self.fan.put
        seq = self.seq
        taken = 0
        for j, i in enumerate(positions):
            if not pending[i]:
                continue            # answered already (its loss raced its reply)
            pending[i] = 0
            p = peers[i]
            if seq > p.relay_acked:
                p.relay_acked = seq
            if not alike:
                value = values[j]
            taken += 1
            if type(value) is _Unreadable:
                value = unreadable(p, value.exc)
            if type(value) is Failure:
                self._fail(i, self.ports.failed_call(value.exc, self.actor_id, self.endpoint,
                                                     p))
            else:
                put(slots[i], value)
        if taken:
            self.open -= taken
            if self.open <= 0:
                self._close()

    def _take_all(self, positions: list, value: Any, values: list | None) -> bool:
        """Every member's answer, none in yet (``value`` for all, or ``values`` one each,
        unpickled): into the call's results as one run, and each member's peer told it
        read what was relayed to it before. False (nothing done): a value is an error, or
        could not be unpickled, or the positions are out of order for ``values``."""
        k = len(positions)
        if values is None:
            if type(value) is _Unreadable or type(value) is Failure:
                return False
        else:
            if positions != list(range(k)):
                return False
            if any(type(v) is _Unreadable or type(v) is Failure for v in values):
                return False
        self.pending = bytearray(k)
        self.open = 0
        seq = self.seq
        for p in self.peers:
            if seq > p.relay_acked:
                p.relay_acked = seq
        self.fan.put_range(self.first, k, value, values)
        self._close()
        return True

    def fail_member(self, p: Peer, exc: BaseException) -> None:
        """Member ``p`` is lost: its slot fails (the others still come)."""
        for i, q in enumerate(self.peers):
            if q is p and self.pending[i]:
                self.pending[i] = 0
                self._fail(i, self.ports.failed_call(exc, self.actor_id, self.endpoint, p))
                self._answered()

    # a reply port's sink: the agent lost (``PortTable.deliver`` hands over ``exc`` as it
    # is: the port is registered with no actor id, so each member's slot names it here)
    def set_exception(self, exc: BaseException) -> None:
        for i, left in enumerate(self.pending):
            if left:
                self.pending[i] = 0
                self._fail(i, self.ports.failed_call(exc, self.actor_id, self.endpoint,
                                                     self.peers[i]))
        self.open = 0
        self._close()

    def set_result(self, value: Any) -> None:       # never: answers come through take()
        raise TypeError("a host share's answers come one member at a time (take)")

    def _fail(self, i: int, exc: BaseException) -> None:
        self.fan.fail_slot(self.slots[i], exc)

    def _answered(self) -> None:
        self.open -= 1
        if self.open <= 0:
            self._close()

    def _close(self) -> None:
        self.ports.close(self.pid)
        if self.also is not None:
            self.also.inflight.discard(self.pid)


def fail_member(node: Any, p: Peer, exc: BaseException) -> None:
    """Member ``p`` is lost: its slot in each call() whose share went through its route's
    first agent (``p.relay_via``) fails. Only a member with relayed calls unanswered can
    be in one, and all of those went that way (relay.py's routing rule).

    Below the head of a tree (``p.relay_path``) an answer the member gave before it ended
    may still be on its way up, held by an agent above for a lone call()
    (``relay_windows.HOLD``, once per agent above its own, which sends what it holds before
    it reports the exit): the slot fails only once that is over, if the answer has not
    come. (HOLD is read from this process's setting; the agents are started with it.)"""
    if p.relay_sent == p.relay_acked or p.relay_via is None:
        return
    if p.relay_path and getattr(node, "loop", None) is not None:
        # each agent above its own may hold it once (a HOLD that runs out ends the hold)
        node.loop.call_later((len(p.relay_path) + 1) * HOLD, _fail_member_now, node, p, exc)
        return
    _fail_member_now(node, p, exc)


def _fail_member_now(node: Any, p: Peer, exc: BaseException) -> None:
    if p.relay_sent == p.relay_acked or p.relay_via is None:
        return
    via = node.peers.by_id.get(p.relay_via.node_id)
    if via is None:
        return
    replies = node.ports.replies
    for pid in list(via.inflight):
        entry = replies.get(pid)
        if entry is not None and type(entry[0]) is HostShare:
            entry[0].fail_member(p, exc)
