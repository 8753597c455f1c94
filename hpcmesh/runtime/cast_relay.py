"""The host agent's half of fan-out and fan-in (``relay.py`` is the sender's): an agent
hands each member of a cast its call and folds the members' answers into one frame per
destination.

A destination is the sender, or, for a cast that came down a tree of agents, the agent
that forwarded it (``Dest``): answers fold up the tree (``MSG_CAST_UP``), so the sender
reads a frame per head of the tree, not one per host. What an agent is owed by the agents
below it is counted per destination (``CastRelay._owed``), and forgotten when one of them
is lost (the sender fails those members itself: their route's agent was lost).

Answers wait at the agent for the rest of what their destination is owed: at most
``FOLD_WINDOW``, ``FOLD_BELOW`` once only agents below still owe, ``HOLD`` for a call()
its sender waits on alone. A call()'s host share travels packed (``MSG_RESULTS`` /
``MSG_VALUES``: one entry per share, alike values once).
"""

from __future__ import annotations

import logging
import pickle
from typing import Any, Callable, NamedTuple

from ..transport import serialization
from ..transport.framing import FrameError
from .errors import HOST_LOST, LOST_STATUS, SupervisionError
from .host_share import ALL
from .links import LOST_PEER_REPORT_WAIT
from .messages import (MSG_CAST_TREE, MSG_CAST_UP, MSG_DELIVER, MSG_FAIL, MSG_RESULT,
                       MSG_RESULTS, MSG_VALUES, NodeRef, call_msg, cast_reply_msg,
                       describe_exception)
from .peers import Peer
from .relay import RELAYS, STATS, Node, RawResult, tree_ports
from .relay_windows import FOLD_BELOW, FOLD_BYTES, FOLD_WINDOW, HOLD

log = logging.getLogger("hpcmesh.runtime")



#: Plain values that a share's alike answers may share as one (immutable, and equal only
#: to their own kind's values: not float, where -0.0 == 0.0)
_ALIKE_TYPES = (type(None), bool, int, str, bytes)


def _size(value: Any) -> int:
    """About how many bytes an answer adds to its frame (a pickle, a plain str or bytes;
    other plain values are small enough to leave out)."""
    return len(value) if type(value) in (bytes, str, bytearray) else 0


def _inband_bytes(entries: list) -> int:
    """About the in-band bytes of answers passed up (their out-of-band buffers counted
    apart)."""
    n = 0
    for _, kind, value, _, _ in entries:
        if kind == MSG_RESULTS or kind == MSG_VALUES:
            n += sum(_size(v) for v in value)
        elif kind == MSG_RESULT or kind == MSG_DELIVER:
            n += _size(value)
    return n


def _fold_alike(values: list) -> None:
    """A share's answers (pickled bytes, or plain values) that are all alike become one,
    in place: the sender unpickles and sets it once (a no-op endpoint's ``None``)."""
    if len(values) < 2:
        return
    first = values[0]
    t = type(first)
    if t not in _ALIKE_TYPES:
        return
    for v in values:
        if type(v) is not t or v != first:
            return
    del values[1:]



class Dest(NamedTuple):
    """Where an agent sends the answers of a cast that came down a tree: up to ``agent``
    (which forwarded it), naming ``sender``'s destination there by ``token``."""
    sender: str
    agent: str
    token: int


class _Answer:
    """Where a member's reply to a relayed call goes on its agent: a reply port's sink
    (a Future's two setters, ``PortTable.expect_into``), no Future made per member."""
    __slots__ = ("relay", "origin", "cport", "seq", "pid", "done", "member", "share")

    def __init__(self, relay: "CastRelay", origin: str, cport: int, seq: int, member: Peer,
                 share: bool = False):
        self.relay = relay
        self.origin = origin
        self.cport = cport
        self.seq = seq              # the member's relayed count, or its position in a share
        self.member = member
        self.share = share          # ``cport`` is a call()'s host share (``host_share.py``)
        self.pid = 0
        self.done = False

    def set_result(self, value: Any) -> None:
        if not self.done:
            self.done = True
            self.relay.answered(self, value, None)

    def set_exception(self, exc: BaseException) -> None:
        if self.done:
            return
        self.done = True
        if self.member.lost is not None and self.relay.node.loop is not None:
            # the member is gone (its exit, its connection): the sender hears of it from
            # its own supervision, naming the process as it knows it; this agent's word
            # follows after the grace a lost peer gets for that report (a slot the sender
            # failed meanwhile is closed: the late answer is dropped there)
            self.relay.node.loop.call_later(LOST_PEER_REPORT_WAIT, self.relay.answered,
                                            self, None, exc)
            return
        self.relay.answered(self, None, exc)


def _unreachable(nid: str, node, why) -> SupervisionError:
    """What the calls of a subtree get when the agent this one relays them to cannot be
    reached: that host is lost to them, as the controller says when it sees it lost."""
    return SupervisionError(
        f"host agent {nid[:8]} cannot be reached from the host agent "
        f"{node.name or node.node_id[:8]} relaying to it: {why}", None, None, None, None,
        LOST_STATUS, HOST_LOST)


class CastRelay:
    """On a host agent's node: hands each member of a cast its call and folds their
    answers into one frame per destination: it leaves once every answer that destination
    is owed is in, or ``FOLD_WINDOW`` after the first answer it holds (``FOLD_BELOW``
    once only agents below it still owe answers; ``HOLD`` for a call() the sender waits on
    alone through this agent, its cast says ``hold``; a result over ``FOLD_BYTES`` leaves
    at once).

    A destination (``Dest``) is the sender itself, or, for a cast that came down a tree,
    the agent that forwarded it (the answers go up the tree, ``MSG_CAST_UP``, and that
    agent folds them with its own: the sender reads a frame per head, not per host). An
    agent that forwards a subtree is owed that subtree's answers; if the agent below is
    lost, what it still owed is forgotten (the sender fails those members itself: their
    route's agent was lost).

    ``member_secret(proc_name, node_id)`` is the secret to dial a member with (None: this
    node's own); the host agent also learns the member's node there (to fail what it
    awaits from it as soon as it exits)."""

    def __init__(self, node: Node,
                 member_secret: Callable[[str, str], bytes | None] | None = None):
        self.node = node
        self.member_secret = member_secret
        # per destination: the entries, their buffers, [their bytes, the answers they
        # settle], and the host shares' results among them ({port: (values, positions)},
        # one MSG_RESULTS entry each)
        self._out: dict[Any, tuple[list, list, list, dict]] = {}
        self._waiting: dict[Any, int] = {}      # destination -> answers still out
        # destination -> (its fold window's timer, how long: FOLD_WINDOW, FOLD_BELOW, HOLD)
        self._timers: dict[Any, tuple] = {}
        # destination -> whether its answers are held for a lone call() (``HOLD``)
        self._hold: dict[Any, bool] = {}
        self._known: dict[bytes, list] = {}     # pickled members -> _members' answer
        self._counts: dict[bytes, int] = {}     # pickled members (of a subtree) -> how many
        # the destinations agents below this one name by a token (MSG_CAST_UP), both ways
        self._tokens: dict[Any, int] = {}
        self._dests: dict[int, Any] = {}
        # agent below -> {destination: answers it still owes there}, and their sum per
        # destination
        self._owed: dict[str, dict[Any, int]] = {}
        self._below: dict[Any, int] = {}
        node.cast_handler = self.on_cast
        node.info[RELAYS] = True        # said in its hellos: senders may cast to it
        node.on_peer_closed.append(self._on_peer_closed)

    def on_cast(self, msg: tuple, origin: str | None, buffers: list) -> None:
        if origin is None:
            return
        if msg[0] == MSG_CAST_TREE:
            self.on_tree_cast(msg, buffers)
            return
        if msg[0] == MSG_CAST_UP:
            self.on_cast_up(msg, origin, buffers)
            return
        _, actor_id, endpoint, payload, ext, members, ports, seqs, hold = msg
        STATS["casts"] += 1
        self._cast_in(origin, hold)
        self._hand_out(origin, actor_id, endpoint, payload, ext, members, ports, seqs,
                       list(buffers) if type(payload) is not tuple else [])

    def on_tree_cast(self, msg: tuple, buffers: list) -> None:
        """A cast through a tree: each subtree forwarded to its agent first (the payload
        as it came, its buffers unread), then this host's share handed out; the answers
        go up to the agent that forwarded this cast, or, at a head, to the sender. A
        subtree whose agent cannot be reached from here fails its members' calls, naming
        it."""
        _, reply_to, actor_id, endpoint, payload, ext, share, subtrees, up, hold = msg
        node = self.node
        STATS["casts"] += 1
        bufs = list(buffers) if type(payload) is not tuple else []
        origin = reply_to[0]
        node.peers.peer(NodeRef(*reply_to))     # how to answer a sender never met
        if up is None:
            dest = origin
        else:
            dest = Dest(origin, up[0], up[2])
            node.peers.peer(NodeRef(up[0], tuple(up[1])))
        self._cast_in(dest, hold)
        sent = []
        if subtrees:
            token = self._tokens.get(dest)
            if token is None:
                token = self._tokens[dest] = len(self._tokens) + 1
                self._dests[token] = dest
            mine = (node.node_id, node.addresses, token)
        for nid, addresses, child_share, child_sub in subtrees:
            ref = NodeRef(nid, tuple(addresses))
            owed = self._answers_in(child_share, child_sub)
            if owed:
                self._waiting[dest] = self._waiting.get(dest, 0) + owed
                self._below[dest] = self._below.get(dest, 0) + owed
                by_dest = self._owed.setdefault(nid, {})
                by_dest[dest] = by_dest.get(dest, 0) + owed
            try:
                node.send(ref, (MSG_CAST_TREE, reply_to, actor_id, endpoint, payload, ext,
                                child_share, child_sub, mine, hold), buffers=bufs)
                STATS["forwards"] += 1
                sent.append(nid)
                p = node.peers.by_id.get(nid)
                if p is None or p.conn is None or p.conn.closed:    # queued: being dialed
                    node.loop.call_soon(self._watch_dial, nid, dest, child_share, child_sub)
            except Exception as e:  # noqa: BLE001 - that subtree's calls fail, named
                self._fail_subtree(nid, dest, child_share, child_sub,
                                   _unreachable(nid, node, e))
        by_id = node.peers.by_id
        for nid in sent:
            p = by_id.get(nid)
            if p is not None and p.conn is not None and not p.conn.closed:
                p.conn.flush_now()
        members, ports, seqs = share
        if members:
            self._hand_out(dest, actor_id, endpoint, payload, ext, members, ports, seqs,
                           bufs)

    def on_cast_up(self, msg: tuple, origin: str, buffers: list) -> None:
        """Answers an agent below this one folded: folded again with this agent's own,
        toward where this one's go (its token says)."""
        _, _, token, entries, answers = msg
        dest = self._dests.get(token)
        if dest is None:
            log.debug("answers passed up from %s for an unknown destination", origin[:8])
            return
        self._add(dest, entries, list(buffers), self._paid(origin, dest, answers))

    def _answers_in(self, share: tuple, subtrees: list) -> int:
        """How many members' answers a subtree of a tree cast owes (0: a broadcast)."""
        members, ports, _ = share
        n = 0
        if ports is not None and members:
            if type(ports) is int:          # a host share: one answer per member
                if type(members) is bytes:
                    n = self._counts.get(members)
                    if n is None:
                        if len(self._counts) >= 256:
                            self._counts.clear()
                        n = self._counts[members] = len(pickle.loads(members))
                else:
                    n = len(members)
            else:
                n = len(ports)
        for _, _, sh, sub in subtrees:
            n += self._answers_in(sh, sub)
        return n

    def _fail_subtree(self, nid: str, dest: Any, share: tuple, subtrees: list,
                      exc: BaseException) -> None:
        """The agent ``nid`` a subtree went to cannot be reached from here: its calls
        fail, named, and it owes nothing any more."""
        owed = self._answers_in(share, subtrees)
        self._paid(nid, dest, owed)
        # ALL: a host share's every member (a member's own port: no sequence number)
        self._add(dest, [(port, MSG_FAIL, exc, 0, ALL)
                         for port in tree_ports(share, subtrees)], [], owed)

    def _paid(self, nid: str, dest: Any, answers: int) -> int:
        """Agent ``nid`` below this one settled ``answers`` of what it owed ``dest``: no
        more than it still owes counts (what it owed was forgotten when its connection
        closed; it may come back and still send those answers, which then pass on, late,
        but count for nothing here)."""
        by_dest = self._owed.get(nid)
        held = by_dest.get(dest, 0) if by_dest is not None else 0
        n = min(answers, held)
        if n <= 0:
            return 0
        by_dest[dest] = held - n
        if by_dest[dest] <= 0:
            del by_dest[dest]
        self._waiting[dest] = max(0, self._waiting.get(dest, 0) - n)
        self._below[dest] = max(0, self._below.get(dest, 0) - n)
        return n

    def flush_all(self) -> None:
        """Every answer held here leaves now: a member is about to be reported ended, and
        an answer it gave before must not arrive after that report (which fails its
        slot). A lone call()'s hold goes on for the answers still to come."""
        for dest in list(self._out):
            self._flush_one(dest)

    def _on_peer_closed(self, node, peer_id: str, exc) -> None:
        """An agent below this one lost its connection: the answers it owed are not waited
        for (if its host is lost, the sender fails those members; if it comes back, it
        still sends them, and they pass on late). What this agent holds leaves now if
        nothing else is out, with the forgotten count, so that the agent above stops
        waiting for it too."""
        by_dest = self._owed.get(peer_id)
        for dest, owed in list((by_dest or {}).items()):
            self._paid(peer_id, dest, owed)
            self._add(dest, [], [], owed)

    def _watch_dial(self, nid: str, dest: Any, share: tuple, subtrees: list) -> None:
        """A subtree queued for an agent this one is dialing: if the dial fails (what was
        queued is dropped), its calls fail, named, rather than wait for ever."""
        p = self.node.peers.by_id.get(nid)

        def check(_=None) -> None:
            if p.conn is None or p.conn.closed:
                self._fail_subtree(nid, dest, share, subtrees,
                                   _unreachable(nid, self.node, p.lost or "not connected"))
        if p is None or not any(True for _ in tree_ports(share, subtrees)):
            return
        if p.dialing is not None:
            p.dialing.add_done_callback(check)
        else:
            check()

    def _members(self, members) -> list:
        """A cast's ``members`` (pickled or not) as [(ref, peer, name, rank)]: a view's
        members come pickled alike on every cast, so they are unpickled and looked up
        once (a bounded cache)."""
        if type(members) is bytes:
            known = self._known.get(members)
            if known is not None:
                return known
            blob, members = members, pickle.loads(members)
        else:
            blob = None
        peer = self.node.peers.peer
        out = []
        for name, nid, addrs, rank in members:
            ref = NodeRef(nid, tuple(addrs))
            out.append((ref, peer(ref), name, rank))
        if blob is not None:
            if len(self._known) >= 256:
                self._known.clear()
            self._known[blob] = out
        return out

    def _hand_out(self, dest: Any, actor_id: str, endpoint: str, payload: Any, ext,
                  members, ports: list | None, seqs: list | None, bufs: list) -> None:
        """Each member its MSG_CALL; their answers are owed to ``dest``."""
        node = self.node
        members = self._members(members)
        if ports is not None:
            self._waiting[dest] = self._waiting.get(dest, 0) + len(members)
        share = type(ports) is int
        for i, (ref, p, name, rank) in enumerate(members):
            if p.conn is None and p.secret is None and self.member_secret is not None:
                p.secret = self.member_secret(name, ref.node_id)
            if ports is None:       # a broadcast: nothing comes back (its failure is the
                try:                # actor's fault, reported to the mesh's owner)
                    node.send(ref, call_msg(actor_id, endpoint, payload, None, rank, ext),
                              buffers=bufs, cork=True)
                except Exception as e:  # noqa: BLE001 - its exit reaches the owner
                    log.debug("cannot relay a broadcast to %s: %s", name, e)
                continue
            # one port for a call()'s whole share (its answers say which member they are),
            # or one per member (each answer echoes its number)
            answer = (_Answer(self, dest, ports, i, p, True) if share
                      else _Answer(self, dest, ports[i], seqs[i], p))
            answer.pid = pid = node.ports.expect_into(p, answer)
            if answer.done:         # known lost: failed already, nothing to send
                continue
            node.ports.raw.add(pid)
            try:
                # corked: each member's connection is flushed once, below
                node.send(ref, call_msg(actor_id, endpoint, payload, pid, rank, ext),
                          buffers=bufs, cork=True)
            except Exception as e:  # noqa: BLE001 - this member's call fails, named
                node.close_port(pid)
                answer.set_exception(e)
        # written now, not a loop turn later (the loop batches what it sends in a pass)
        for _, p, _, _ in members:
            conn = p.conn
            if conn is not None and not conn.closed:
                conn.flush_now()

    def answered(self, a: "_Answer", value: Any, exc: BaseException | None) -> None:
        """Member ``a`` answered: its entry joins what ``a.origin`` (its destination) is
        owed."""
        self._waiting[a.origin] = max(0, self._waiting.get(a.origin, 0) - 1)
        self.node.ports.raw.discard(a.pid)
        if exc is not None:
            self._add(a.origin, [(a.cport, MSG_FAIL, exc, 0, a.seq)], (), 1)
        elif type(value) is RawResult:
            if a.share and not value.buffers:
                self._add_result(a.origin, a.cport, MSG_RESULTS, value.data, a.seq)
                return
            self._add(a.origin, [(a.cport, MSG_RESULT, value.data, len(value.buffers), a.seq)],
                      value.buffers, 1)
        elif a.share:
            self._add_result(a.origin, a.cport, MSG_VALUES, value, a.seq)
        else:
            self._add(a.origin, [(a.cport, MSG_DELIVER, value, 0, a.seq)], (), 1)

    def _add(self, dest: Any, entries: list, bufs, answers: int) -> None:
        """``entries`` [(port, kind, value, nbufs, seq)] and their buffers, settling
        ``answers`` of what ``dest`` is owed; they leave with the rest once nothing more
        is out (or the fold window ends)."""
        out = self._unsent(dest)
        out[0].extend(entries)
        out[1].extend(bufs)
        out[2][0] += (sum(memoryview(b).nbytes for b in bufs) if bufs else 0) \
            + _inband_bytes(entries)
        out[2][1] += answers
        if self._hold.get(dest) and any(e[1] != MSG_RESULTS and e[1] != MSG_VALUES
                                        for e in entries):
            self._hold[dest] = False    # a stream's answer, a failure: the short window
        self._held(dest, out)

    def _unsent(self, dest: Any) -> tuple:
        """What ``dest`` is owed and not sent yet: (entries, their buffers, [bytes,
        answers they settle], a host share's packed entry by (port, kind))."""
        out = self._out.get(dest)
        if out is None:
            out = self._out[dest] = ([], [], [0, 0], {})
        return out

    def _cast_in(self, dest: Any, hold: bool) -> None:
        """A cast whose answers go to ``dest`` came: they may be held for the whole call()
        (``HOLD``) only while it is the one thing ``dest`` is owed."""
        lone = hold and not self._waiting.get(dest) and dest not in self._out
        if self._hold.get(dest) and not lone:
            self._hold[dest] = False
            timer = self._timers.get(dest)
            if timer is not None and timer[1] == HOLD:      # what waits leaves soon
                timer[0].cancel()
                self._timers[dest] = (self.node.loop.call_later(
                    FOLD_WINDOW, self._flush_one, dest), FOLD_WINDOW)
        elif lone:
            self._hold[dest] = True

    def _add_result(self, dest: Any, port: int, kind: int, value: Any, position: int) -> None:
        """A host share's member answered ``value`` (``kind`` MSG_RESULTS: pickled, with no
        out-of-band buffers; MSG_VALUES: a plain value): it joins that share's one entry
        of that kind for ``dest`` (the sender reads a share's answers in one loop,
        ``HostShare.take_results``)."""
        out = self._unsent(dest)
        group = out[3].get((port, kind))
        if group is None:
            group = out[3][(port, kind)] = ([], [])
            out[0].append((port, kind, group[0], 0, group[1]))
        group[0].append(value)
        group[1].append(position)
        out[2][0] += _size(value)
        out[2][1] += 1
        self._held(dest, out)

    def _held(self, dest: Any, out: tuple) -> None:
        """What ``dest`` is owed grew: send it now, or (re)arm its fold window."""
        waiting = self._waiting.get(dest)
        if out[2][0] >= FOLD_BYTES or not waiting:
            self._flush_one(dest)
            return
        if self._hold.get(dest):
            wait = HOLD
        else:
            # only agents below still owe answers: they are a hop behind, held for longer
            wait = FOLD_BELOW if waiting <= self._below.get(dest, 0) else FOLD_WINDOW
        timer = self._timers.get(dest)
        if timer is None or (wait == FOLD_BELOW and timer[1] == FOLD_WINDOW) \
                or (timer[1] == HOLD and wait != HOLD):
            if timer is not None:
                timer[0].cancel()
            self._timers[dest] = (self.node.loop.call_later(wait, self._flush_one, dest),
                                  wait)

    def _flush_one(self, dest: Any) -> None:
        timer = self._timers.pop(dest, None)
        if timer is not None:
            timer[0].cancel()
        if not self._waiting.get(dest):
            self._waiting.pop(dest, None)
            self._below.pop(dest, None)
            self._hold.pop(dest, None)
        elif self._hold.get(dest):
            # answers still out after a HOLD (a straggler), too many bytes, a member's exit:
            # the rest go in the short window (an agent above holds them once at most)
            self._hold[dest] = False
        entries, bufs, (_, answers), groups = self._out.pop(dest, ([], [], (0, 0), None))
        if groups:
            for values in groups.values():
                _fold_alike(values[0])
        up = type(dest) is Dest
        if not entries and not (up and answers):
            return
        node = self.node
        if up:
            parent = node.peers.by_id.get(dest.agent)
            if parent is None or parent.conn is None or parent.conn.closed:
                # the agent above is out of reach (its count of these answers is forgotten
                # when its link to us closed): they go to the sender straight
                up = False
                if not entries:
                    return
        to = node.ref_of(dest.agent if up else dest.sender if type(dest) is Dest else dest)

        def msg(entries: list, answers: int) -> tuple:
            return ((MSG_CAST_UP, dest.sender, dest.token, entries, answers) if up
                    else cast_reply_msg(entries))
        STATS["ups" if up else "cast_replies"] += 1
        try:
            node.send(to, msg(entries, answers), buffers=bufs)
            p = node.peers.by_id.get(to.node_id)
            if p is not None and p.conn is not None and not p.conn.closed:
                p.conn.flush_now()      # now, not a loop turn later
            return
        except (pickle.PicklingError, TypeError, AttributeError, ValueError,
                serialization.SerializationError, FrameError) as e:
            problem = e             # an exception among them that does not pickle, or
            #                         answers that fit a frame each but not all together
        except Exception as e:  # noqa: BLE001 - the sender is gone: its supervision says so
            if up and entries:      # the agent above is: to the sender straight
                try:
                    node.send(node.ref_of(dest.sender), cast_reply_msg(entries), buffers=bufs)
                    return
                except Exception as e2:  # noqa: BLE001
                    e = e2
            log.debug("cannot return relayed replies to %s: %s", to.node_id[:8], e)
            return
        # one by one (a share's packed answers each on its own), any that does not pickle
        # or fit a frame replaced by what it said (the count of answers they settle goes
        # with the last)
        log.debug("folded replies could not be sent together (%s): sent one by one", problem)
        at = 0
        alone = []
        for port, kind, value, nbufs, seq in entries:
            mine = bufs[at:at + nbufs]
            at += nbufs
            if kind == MSG_RESULTS or kind == MSG_VALUES:
                one = MSG_RESULT if kind == MSG_RESULTS else MSG_DELIVER
                alone += [((port, one, value[0] if len(value) == 1 else value[k], 0, pos), [])
                          for k, pos in enumerate(seq)]
            else:
                alone.append(((port, kind, value, nbufs, seq), mine))
        for i, (entry, mine) in enumerate(alone):
            port, kind, value, nbufs, seq = entry
            if kind == MSG_FAIL:
                try:
                    pickle.dumps(value)
                except Exception:  # noqa: BLE001
                    entry = (port, kind, RuntimeError(describe_exception(value)), 0, seq)
            settles = answers if i == len(alone) - 1 else 0
            try:
                node.send(to, msg([entry], settles), buffers=mine)
            except Exception as e:  # noqa: BLE001 - that member's call fails, saying why
                log.debug("cannot return a relayed reply to %s: %s", to.node_id[:8], e)
                try:
                    node.send(to, msg([(port, MSG_FAIL, serialization.SerializationError(
                        f"a member's answer could not be passed on by its host agent: "
                        f"{describe_exception(e)}"), 0, seq)], settles))
                except Exception as e2:  # noqa: BLE001 - the sender is gone
                    log.debug("cannot return a relayed reply to %s: %s", to.node_id[:8], e2)
