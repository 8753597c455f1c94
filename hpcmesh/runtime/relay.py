"""Fan-out and fan-in through host agents (SPEC §11: the controller's work per call()
grows with hosts, not processes).

A call() over a mesh whose members sit G to a host costs the sender one ``MSG_CAST`` per
host, to that host's agent: the payload pickled once, the members (pickled once per view),
one reply port for the host's share (``host_share.HostShare``; a stream() one per member).
The agent hands each member an ordinary ``MSG_CALL`` over its Unix socket and folds their
replies into one ``MSG_CAST_REPLY``; the sender unpickles each member's value on its own
(the agent never unpickles a user's value: a result travels as the bytes the member
pickled, ``RawResult``).

Order (messages from one sender to one actor are delivered in send order, whichever path
each took) is kept by routing, never by waiting. Each relayed message takes a number that
only grows (``_number``); each member's peer keeps the number of the last one relayed to
it (``Peer.relay_sent``) and the highest it is known to have read (``relay_acked``: its
answer to a relayed call came back; a member handles its agent's messages in order, so
that answer says it read every relayed message before it). While the two differ, the
member is *relayed*: every later call to it, a ``call_one`` too (``Node.call_actor``,
``Node.send``), goes through the same agent. A member with direct calls awaiting replies (``Peer.inflight``) gets its share of a
call() or broadcast straight instead, behind them. A broadcast through an agent needs no
acknowledgement of its own (the member stays relayed until a later relayed call answers);
a broadcast sent straight to a member that is relayable is followed by a ``ping`` whose
reply port keeps the member counted as direct until it read the broadcast.

A host group whose members a cast found all on its route, with nothing in the way, is
*settled* (``_settled``): until one of them is lost, gets a direct call in flight, or has
its relayed messages take another route (each calls ``peers.unsettle``), the next cast
only numbers them, with no check per member.

Failures need nothing new: each relayed reply port is registered with the member's peer
(its exit or its host's loss fails it, as a direct call's) and with the agent's (an agent
whose connection is lost for good fails what it held).

Past ``HPCMESH_RELAY_FANOUT`` (32) hosts a view casts through a tree of its agents that
wide (``tree``, ``cast_tree``): one MSG_CAST_TREE to each head, which forwards the shares
of the agents below it and hands out its own; each agent's answers go up to the agent that
forwarded it the cast (``MSG_CAST_UP``), which folds them with its own, so the sender reads
a frame per head, not per host. A member's route is then its head and the agents down to
its own (``relay_via``, ``relay_path``): the rule above holds per route, and a cast routed
otherwise sends a
relayed member its share alone along its route (``_detour``). A head lost fails what it
relayed (``fail_relayed``; the controller also fails the members it may have held
messages for, ``ClientRuntime._lost_with_relay``).

``HPCMESH_RELAY=0`` turns the relay off (every call goes straight to its member).

This module is the sender's half; the agent's (``CastRelay``: hand out, forward, fold) is
``cast_relay.py``.
"""

from __future__ import annotations

import logging
import math
import pickle
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..settings import env_flag, env_number
from ..transport import serialization
from .future import FanIn, Future
from .host_share import IMMUTABLE, HostShare
from .messages import (MSG_CAST_TREE, MSG_FAIL, MSG_RESULT, MSG_RESULTS, MSG_VALUES, PROTOCOL,
                       Failure, NodeRef, cast_msg, unreadable_result)
from .peers import Peer, PeerTable, changes, unsettle

#: the ``runtime.node.Node`` sending or relaying (not imported: node.py imports this module)
Node = Any

log = logging.getLogger("hpcmesh.runtime")

RELAY_VAR = "HPCMESH_RELAY"
#: Past this many hosts a view's casts go through a tree of agents this wide (0: never).
FANOUT_VAR = "HPCMESH_RELAY_FANOUT"
#: The key of a node's hello info that says it relays casts (a host agent's does).
RELAYS = "relays"
#: Counts, per process: casts sent, folded answers taken and host shares sent settled
#: (``_settled``: no check per member) by a caller; casts relayed and folded answers sent
#: by an agent. Tests and benchmarks count frames with them.
STATS = {"casts_sent": 0, "replies_taken": 0, "settled": 0, "casts": 0, "cast_replies": 0,
         "forwards": 0, "ups": 0}


def relay_enabled() -> bool:
    """``HPCMESH_RELAY`` (on unless 0): whether calls fan out through host agents."""
    return env_flag(RELAY_VAR, True)


def tree_width() -> int:
    """``HPCMESH_RELAY_FANOUT`` (32): a view over more hosts than this casts through a tree
    of host agents no wider than this (``_heads``), so that the sender writes a frame per
    head, not per host; 0 keeps every view's casts flat."""
    return int(env_number(FANOUT_VAR, 32, unit="hosts", integer=True,
                          note="0 or 1 keep casts flat (one per host agent)"))


@dataclass(slots=True)
class RawResult:
    """A member's MSG_RESULT as it arrived at its agent: the value's pickle stream and its
    out-of-band buffers, passed on unread."""
    data: bytes
    buffers: list


# -- the sender's half ------------------------------------------------------------------
@dataclass(slots=True)
class HostGroup:
    """The members of one view that one host agent can reach for its sender."""
    agent: NodeRef
    slots: list[int]            # their positions in the view's member order
    refs: list[NodeRef]         # their nodes
    members: tuple              # ((proc_name, node_id, addresses, rank), ...)
    # In a tree (``tree``): the agent its casts are sent to (its subtree's head) and the
    # agents from there down to its own (a member's route, ``Peer.relay_via`` and
    # ``relay_path``), the groups it forwards to, its members pickled once and their peers.
    via: NodeRef | None = None
    path: tuple = ()
    children: list = field(default_factory=list)
    blob: bytes = b""
    peers: list = field(default_factory=list)
    # ``first``: slots[0] where the slots follow on one from another, else -1 (a share's
    # answers then fill a run of the results at once). ``settled_at``: ``peers.changes()``
    # when a cast last found every member on the route ``settled_via`` (and down
    # ``settled_path``) with nothing in the way (see ``_settled``); -1: never. A group in
    # a tree is cast along the tree, or flat through its own agent where its head's
    # subtree has an agent down: two routes.
    first: int = -1
    settled_at: int = -1
    settled_via: NodeRef | None = None
    settled_path: tuple = ()


def plan(node: Node, members: list[tuple[int, str, NodeRef, NodeRef]]
         ) -> tuple[list[HostGroup], list[int]]:
    """``members`` [(rank, proc_name, node, agent)] of a view, in order: their host groups
    (agents other than this node), and the positions of those that are not in one (an
    agent in this process: ``this_host()``)."""
    groups: dict[str, HostGroup] = {}
    alone: list[int] = []
    for slot, (rank, name, ref, agent) in enumerate(members):
        if agent is None or agent.node_id == node.node_id or ref is None:
            alone.append(slot)
            continue
        g = groups.get(agent.node_id)
        if g is None:
            g = groups[agent.node_id] = HostGroup(agent, [], [], ())
        g.slots.append(slot)
        g.refs.append(ref)
        g.members += ((name, ref.node_id, tuple(ref.addresses), rank),)
    return list(groups.values()), alone


def tree(node: Node, groups: list[HostGroup], width: int | None = None
         ) -> list[HostGroup] | None:
    """The heads of a tree over ``groups`` (each with its ``children``, its ``via`` and
    ``path`` set), or None where casts stay flat: no more groups than ``width``
    (``tree_width()``), or an agent the others could not dial (no address known here, or
    another secret than this node's: a head dials its children with its own)."""
    width = tree_width() if width is None else width
    if width < 2 or len(groups) <= width:
        return None
    by_id = node.peers.by_id
    refs = []
    for g in groups:
        p = by_id.get(g.agent.node_id)
        if p is None or p.ref is None or not p.ref.addresses or p.secret is not None:
            return None
        refs.append(p.ref)

    def build(chunk: list[int], via: NodeRef | None, path: tuple) -> list[HostGroup]:
        heads = []
        k = _heads(len(chunk), width)
        for i in range(k):
            part = chunk[i * len(chunk) // k:(i + 1) * len(chunk) // k]
            g = groups[part[0]]
            g.via = via or g.agent
            g.path = path + (refs[part[0]],) if via is not None else ()
            g.children = build(part[1:], g.via, g.path)
            g.blob = pickle.dumps(g.members, PROTOCOL)
            _meet(node, g)
            heads.append(g)
        return heads
    return build(list(range(len(groups))), None, ())


def _heads(n: int, width: int) -> int:
    """How many heads ``n`` host groups split into: each its own where there are no more
    than ``width``; else about their square root (no more than ``width``), so that the
    sender's frames and each head's are about alike (64 hosts: 8 heads of 8, not 32 of 2;
    1,024: 32 of 32)."""
    if n <= width:
        return n
    return min(width, max(2, math.isqrt(n - 1) + 1))


def _meet(node: Node, g: HostGroup) -> None:
    """``g``'s members' peers, named and marked settled (made once: a node's Peer entries
    live as long as it)."""
    g.peers = [node.peers.peer(ref) for ref in g.refs]
    for p, member in zip(g.peers, g.members):
        if not p.relay_name:
            p.relay_name = member[0]
        p.settled = True
    if g.slots == list(range(g.slots[0], g.slots[0] + len(g.slots))):
        g.first = g.slots[0]


def _settled(g: HostGroup, via: NodeRef, path: tuple) -> bool:
    """Whether a cast may reach every member of ``g`` through ``via`` and down ``path``
    without checking each: an earlier cast found them all on that route (relayed that
    way, or not relayed and with no direct call in flight, and not lost), and no member of
    any group changed since (``peers.unsettle``). What each member then needs is only its
    number."""
    return g.settled_at == changes() and g.settled_via is via and g.settled_path is path


def _settle(g: HostGroup, seen: int, via: NodeRef, path: tuple) -> None:
    """A cast found every member of ``g`` on this route when ``changes()`` was ``seen``."""
    g.settled_at, g.settled_via, g.settled_path = seen, via, path


def _number(node: Node) -> int:
    """The next number of a relayed message (under ``_SENDING``): one for every member a
    cast reaches. A member's numbers only grow, so its answer to number n says it read
    every message relayed to it up to n (``Peer.relay_acked``)."""
    peers = node.peers
    peers.relay_clock += 1
    return peers.relay_clock


def _same_route(p: Peer, via: NodeRef, path: tuple) -> bool:
    """Whether ``p``'s route (``relay_via``, ``relay_path``) names the agents ``via`` and
    ``path`` do (other NodeRef objects, maybe: each view makes its own)."""
    return (p.relay_via is not None and p.relay_via.node_id == via.node_id
            and len(p.relay_path) == len(path)
            and all(a.node_id == b.node_id for a, b in zip(p.relay_path, path)))


def _route(p: Peer, via: NodeRef, path: tuple) -> None:
    """``p``'s relayed messages go through ``via`` and down ``path`` from now on."""
    if p.relay_via is not via or p.relay_path is not path:
        if p.settled and p.relay_via is not None and not _same_route(p, via, path):
            unsettle()      # a group settled on its old route
        p.relay_via = via
        p.relay_path = path


def _walk(g: HostGroup):
    yield g
    for c in g.children:
        yield from _walk(c)


#: Held while a member's relayed messages are numbered and sent, so that their numbers are
#: in the order they leave, whichever threads send (a member's answer to number n then
#: says it read every one before). Reentrant: a call that fails at once runs its callbacks,
#: which may send.
_SENDING = threading.RLock()


def relayed(p: Peer) -> bool:
    """Whether messages sent to ``p`` through its agent may not have reached it yet."""
    return p.relay_sent != p.relay_acked


def cast(node: Node, group: HostGroup, actor_id: str, endpoint: str, payload: Any,
         bufs: list, ext: tuple, reply: bool, out: list,
         direct: Callable[[int], Future | None], min_members: int = 2,
         fan: FanIn | None = None) -> None:
    """Send ``group``'s share of one call (``reply``) or broadcast: through its agent for
    members it may go to (see the module's doc on order), ``direct(slot)`` for the rest;
    each slot's Future (None for a broadcast's) goes to ``out[slot]``, or, with ``fan``,
    a relayed member's reply resolves ``fan``'s slot (no Future) and ``out[slot]`` stays
    None. Below ``min_members`` relayable members the share goes direct (the relay only
    pays from 2)."""
    peers = node.peers
    by_id = peers.by_id
    agent_p = by_id.get(group.agent.node_id)
    agent_up = _relays(agent_p)
    if not group.peers:
        _meet(node, group)
    if agent_up and (fan is not None or not reply) and _settled(group, group.agent, ()) \
            and len(group.peers) >= min_members:
        STATS["settled"] += 1
        with _SENDING:
            _cast_share(node, group, actor_id, endpoint, payload, bufs, ext, reply, out,
                        fan, agent_p, None, None)
        return
    seen = changes()
    members, chosen, straight, detours = [], [], [], []
    for slot, ref, member, p in zip(group.slots, group.refs, group.members, group.peers):
        if p.lost is not None and p.conn is None:
            straight.append((slot, ref))        # gone: the direct path says why
        elif p.relay_sent != p.relay_acked:
            if (p.relay_path or p.relay_via is None
                    or p.relay_via.node_id != group.agent.node_id) \
                    and not _on_route(node, p, group.agent, ()):
                detours.append((slot, p, ref, member))    # relayed through a tree
            else:
                members.append(member)
                chosen.append((slot, p, ref))
        elif agent_up and not p.inflight:
            members.append(member)
            chosen.append((slot, p, ref))
        else:
            straight.append((slot, ref))        # direct calls in flight, or no agent
    if len(members) < min_members and not any(relayed(p) for _, p, _ in chosen):
        straight += [(slot, ref) for slot, _, ref in chosen]
        members = []
    if members or detours:
        with _SENDING:
            if members:
                _cast_share(node, group, actor_id, endpoint, payload, bufs, ext, reply, out,
                            fan, agent_p, chosen, members)
                if len(chosen) == len(group.peers):     # the next cast need not check
                    _settle(group, seen, group.agent, ())
            for d in detours:
                _detour(node, *d, actor_id, endpoint, payload, bufs, ext, reply, out, fan)
    for slot, ref in straight:
        out[slot] = _direct(node, direct, slot, ref, reply)


def cast_tree(node: Node, heads: list[HostGroup], actor_id: str, endpoint: str,
              payload: Any, bufs: list, ext: tuple, reply: bool, out: list,
              direct: Callable[[int], Future | None], fan: FanIn | None = None) -> None:
    """``cast`` for a view whose host groups form a tree (``tree``): one MSG_CAST_TREE to
    each head, which forwards its subtree's shares down and hands out its own; every
    agent answers the sender straight. Each member's reply port is also registered with
    its head (its loss fails the subtree's slots; the agent's own supervision names the
    host, ``fail_relayed``). The same choice per member as ``cast``: straight where it
    has direct calls in flight or is lost, on its own route where relayed messages took
    another. A head whose subtree has an agent that is not up casts flat instead."""
    by_id = node.peers.by_id
    straight: list = []
    detours: list = []
    flat: list = []
    reply_to = _reply_to(node)
    seen = changes()
    with _SENDING:
        n = _number(node)
        for head in heads:
            hp = by_id.get(head.agent.node_id)
            if not _relays(hp) or not all(_up(by_id.get(g.agent.node_id))
                                          for c in head.children for g in _walk(c)):
                flat.append(head)
                continue
            # nothing else of ours in flight through this head: its tree may hold the
            # answers until they are all in (``HOLD``)
            hold = fan is not None and not hp.inflight
            share, sub = _tree_share(node, head, hp, actor_id, endpoint, reply,
                                     out, fan, straight, detours, n, seen)
            _send_tree(node, head.agent, (MSG_CAST_TREE, reply_to, actor_id, endpoint,
                                          payload, ext, share, sub, None, hold), bufs)
        for d in detours:
            _detour(node, *d, actor_id, endpoint, payload, bufs, ext, reply, out, fan)
    for head in flat:
        for g in _walk(head):
            cast(node, g, actor_id, endpoint, payload, bufs, ext, reply, out, direct,
                 2 if reply else 1, fan)
    for slot, ref in straight:
        out[slot] = _direct(node, direct, slot, ref, reply)


def _up(p: Peer | None) -> bool:
    return p is not None and p.conn is not None and not p.conn.closed


def _relays(p: Peer | None) -> bool:
    return _up(p) and p.conn.info.get("peer_info", {}).get(RELAYS) is True


def _tree_share(node: Node, g: HostGroup, head: Peer, actor_id: str, endpoint: str,
                reply: bool, out: list, fan: FanIn | None, straight: list, detours: list,
                n: int, seen: int) -> tuple[tuple, list]:
    """Group ``g``'s share of a tree cast, numbered ``n`` (the cast's one number), and its
    children's: (share, subtrees) as MSG_CAST_TREE carries them. ``seen``:
    ``peers.changes()`` before the cast began (a group whose members all go this cast's
    way is settled at it). Under ``_SENDING``."""
    ports = seqs = hs = None
    if reply:
        if fan is not None:
            hs = HostShare(node.ports, fan, actor_id, endpoint)
        else:
            ports, seqs = [], []
            expect = node.ports.expect_reply
    if hs is not None or not reply:
        if _settled(g, g.via, g.path):
            STATS["settled"] += 1
            for p in g.peers:
                p.relay_sent = n
            skipped = None
        else:
            skipped = _tree_members(node, g, n, straight, detours)
            if skipped is None:
                _settle(g, seen, g.via, g.path)
    else:
        skipped = _tree_members(node, g, n, straight, detours)
        for i, p in enumerate(g.peers):
            if skipped is None or i not in skipped:
                out[g.slots[i]], pid = expect(p, actor_id, endpoint)
                head.inflight.add(pid)
                ports.append(pid)
                seqs.append(n)
    if hs is not None and (skipped is None or len(skipped) < len(g.peers)):
        hs.fill(g.slots, g.peers, n, skipped, g.first)
        ports = _register(node, hs, node.peers.peer(g.agent), head)
    if skipped is None:
        share = (g.blob, ports, seqs)
    elif len(skipped) == len(g.peers):
        share = (None, None, None)
    else:
        chosen = tuple(m for i, m in enumerate(g.members) if i not in skipped)
        share = (pickle.dumps(chosen, PROTOCOL), ports, seqs)
    return share, [(c.path[-1].node_id, c.path[-1].addresses,
                    *_tree_share(node, c, head, actor_id, endpoint, reply, out, fan,
                                 straight, detours, n, seen))
                   for c in g.children]


def _tree_members(node: Node, g: HostGroup, n: int, straight: list, detours: list
                  ) -> set | None:
    """Each member of ``g`` checked (``cast``'s choice): numbered ``n`` on ``g``'s route,
    or sent straight, or on its own route; the positions of those not in the share (None:
    none)."""
    via, path = g.via, g.path
    skipped = None
    for i, p in enumerate(g.peers):
        if p.lost is not None and p.conn is None:
            straight.append((g.slots[i], g.refs[i]))    # gone: the direct path says why
            skipped = (skipped or set()) | {i}
            continue
        if p.relay_sent != p.relay_acked:
            if (p.relay_via is not via or p.relay_path is not path) \
                    and not _on_route(node, p, via, path):
                detours.append((g.slots[i], p, g.refs[i], g.members[i]))
                skipped = (skipped or set()) | {i}
                continue
        elif p.inflight:
            straight.append((g.slots[i], g.refs[i]))    # behind its direct calls in flight
            skipped = (skipped or set()) | {i}
            continue
        p.relay_sent = n
        _route(p, via, path)
    return skipped


def _on_route(node: Node, p: Peer, via: NodeRef, path: tuple) -> bool:
    """Whether a message to relayed member ``p`` may go through ``via`` and down
    ``path``: the route its relayed messages took (after ``_mend``), or any once none
    is left unread."""
    _mend(node, p)
    return p.relay_sent == p.relay_acked or _same_route(p, via, path)


def _mend(node: Node, p: Peer) -> None:
    """A relayed member whose route's first agent is lost: what that agent forwarded went
    on to the next agent down the route already (or was lost with it), so later messages
    go from that next one; with none left, straight (nothing relayed is left to overtake).
    """
    while p.relay_sent != p.relay_acked and p.relay_via is not None:
        vp = node.peers.by_id.get(p.relay_via.node_id)
        if vp is None or vp.lost is None or vp.conn is not None:
            return
        if p.relay_path:
            p.relay_via, p.relay_path = p.relay_path[0], p.relay_path[1:]
        else:
            p.relay_acked = p.relay_sent
        if p.settled:
            unsettle()


def _detour(node: Node, slot: int, p: Peer, ref: NodeRef, member: tuple, actor_id: str,
            endpoint: str, payload: Any, bufs: list, ext: tuple, reply: bool, out: list,
            fan: FanIn | None) -> None:
    """One member's share alone, on the route its relayed messages took (a cast routed
    otherwise could overtake them). Under ``_SENDING``."""
    port = None
    if reply:
        if fan is not None:
            port = node.ports.expect_into(p, fan.slot(slot), actor_id, endpoint)
        else:
            out[slot], port = node.ports.expect_reply(p, actor_id, endpoint)
        node.peers.peer(p.relay_via).inflight.add(port)
    p.relay_sent = _number(node)
    _send_route(node, p, (member,), None if port is None else [port], [p.relay_sent],
                actor_id, endpoint, payload, ext, bufs)


def _send_route(node: Node, p: Peer, members: tuple, ports: list | None, seqs: list,
                actor_id: str, endpoint: str, payload: Any, ext: tuple, bufs: list) -> None:
    """A cast to ``members`` (of ``p``'s host) along ``p``'s route: to its agent, or to
    the head of its tree with the share nested down the path."""
    if not p.relay_path:
        _send_cast(node, p.relay_via, cast_msg(actor_id, endpoint, payload, ext, members,
                                               ports, seqs), bufs)
        return
    share, sub = (members, ports, seqs), []
    for hop in reversed(p.relay_path):
        sub = [(hop.node_id, hop.addresses, share, sub)]
        share = (None, None, None)
    _send_tree(node, p.relay_via, (MSG_CAST_TREE, _reply_to(node), actor_id, endpoint,
                                   payload, ext, share, sub, None, False), bufs)


def _reply_to(node: Node) -> tuple:
    """This node as a tree cast names where answers go (a plain tuple: a dataclass
    pickles slowly)."""
    return (node.node_id, tuple(node.addresses))


def tree_ports(share: tuple, subtrees: list):
    """Every reply port of a MSG_CAST_TREE's ``share`` and ``subtrees``."""
    if type(share[1]) is int:
        yield share[1]
    elif share[1]:
        yield from share[1]
    for _, _, sh, sub in subtrees:
        yield from tree_ports(sh, sub)


def _send_tree(node: Node, head: NodeRef, msg: tuple, bufs: list) -> None:
    """Send a tree cast; if it cannot leave, fail every port it carried."""
    STATS["casts_sent"] += 1
    try:
        node.send(head, msg, buffers=bufs or [], cork=False)
    except Exception as e:  # noqa: BLE001 - those calls fail, named; the others go on
        for pid in tree_ports(msg[6], msg[7]):
            node.ports.deliver(pid, Failure(e))


def fail_relayed(node: Node, agent_id: str, exc: BaseException) -> None:
    """Host agent ``agent_id`` is lost: every call relayed through it that is still
    awaited fails with ``exc`` now (the members of a subtree it headed, whose own hosts
    may be fine, among them)."""
    p = node.peers.by_id.get(agent_id)
    if p is not None:
        PeerTable.fail_inflight(p, exc, node.ports.deliver)


def _cast_share(node: Node, group: HostGroup, actor_id: str, endpoint: str, payload: Any,
                bufs: list, ext: tuple, reply: bool, out: list, fan: FanIn | None,
                agent_p: Peer | None, chosen: list | None, members: list | None) -> None:
    """The relayed part of ``cast``: numbered and sent under ``_SENDING``, to ``chosen``
    [(slot, peer, ref)] (``members`` theirs), or None: the whole group, settled
    (``_settled``; a call() into a ``FanIn`` or a broadcast). A call() into a ``FanIn``
    gets one reply port for the whole share (``HostShare``); other calls one per member."""
    peers = node.peers
    n = _number(node)
    ports = seqs = share = None
    if reply:
        agent_p = agent_p or peers.peer(group.agent)
        if fan is not None:
            share = HostShare(node.ports, fan, actor_id, endpoint)
    if chosen is None:
        for p in group.peers:
            p.relay_sent = n
        chosen_peers = group.peers
    else:
        via = group.agent
        for _, p, _ in chosen:
            p.relay_sent = n
            _route(p, via, ())
        chosen_peers = None
        if reply and share is None:     # a port per member, each echoing the number
            agent_inflight = agent_p.inflight
            expect = node.ports.expect_reply
            ports, seqs = [], [n] * len(chosen)
            for slot, p, _ in chosen:
                out[slot], pid = expect(p, actor_id, endpoint)
                agent_inflight.add(pid)
                ports.append(pid)
    hold = share is not None and not agent_p.inflight      # see cast_tree
    if share is not None:
        if chosen_peers is not None or len(chosen) == len(group.slots):
            share.fill(group.slots, group.peers, n, None, group.first)
        else:
            share.fill([c[0] for c in chosen], [c[1] for c in chosen], n)
        ports = _register(node, share, agent_p, None)
    if members is None or len(members) == len(group.members):
        if not group.blob:
            group.blob = pickle.dumps(group.members, PROTOCOL)
        members = group.blob
    else:
        members = tuple(members)
    _send_cast(node, group.agent, cast_msg(actor_id, endpoint, payload, ext, members, ports,
                                           seqs, hold), bufs)


def _register(node: Node, share: HostShare, agent_p: Peer, head: Peer | None) -> int:
    """``share``'s one reply port, registered with its agent (its loss fails the share)
    and held by ``head`` too where a tree's head forwards it."""
    share.open = len(share.peers)
    share.pid = pid = node.ports.expect_into(agent_p, share)
    if head is not None and head is not agent_p and share.open:
        share.also = head
        head.inflight.add(pid)
    return pid


def _direct(node: Node, direct: Callable[[int], Future | None], slot: int, ref: NodeRef,
            reply: bool) -> Future | None:
    """A member's share sent straight. A broadcast's is followed by a ping, whose reply
    port keeps the member counted as direct (a call in flight) until it read the broadcast:
    a later cast cannot overtake it. (Only where the member had direct calls in flight or
    its agent cannot relay: a broadcast otherwise goes through the agent.)"""
    fut = direct(slot)
    if not reply:
        node.rpc(ref, "ping")
    return fut


def _send_cast(node: Node, agent: NodeRef, msg: tuple, bufs: list) -> None:
    """Send a cast; if it cannot leave, fail the ports it carried (their calls)."""
    STATS["casts_sent"] += 1
    try:
        # one cast per agent and call: written now, not handed to the loop to batch (a
        # wake-up of the loop thread per agent)
        node.send(agent, msg, buffers=bufs or [], cork=False)
    except Exception as e:  # noqa: BLE001 - those calls fail, named; the others go on
        ports = msg[6]
        for pid in (ports,) if type(ports) is int else ports or ():
            node.ports.deliver(pid, Failure(e))


def relay_one(node: Node, p: Peer, target: NodeRef, msg: tuple, bufs: list) -> bool:
    """A MSG_CALL to a member that relayed messages may not have reached yet: along the
    same route, so that it cannot overtake them. A call's port is registered with the
    member already (as a direct call's); the route's first agent learns it too. False:
    not sent (nothing relayed is left on the way: the caller sends it straight)."""
    _, actor_id, endpoint, payload, port, rank, ext = msg
    if p.lost is not None and p.conn is None:
        raise p.lost
    member = ((p.relay_name, target.node_id, tuple(target.addresses), rank),)
    with _SENDING:
        _mend(node, p)
        if p.relay_sent == p.relay_acked:
            return False        # its route is gone with what it held: straight
        if port is not None:
            node.peers.peer(p.relay_via).inflight.add(port)
        p.relay_sent = _number(node)
        _send_route(node, p, member, None if port is None else [port], [p.relay_sent],
                    actor_id, endpoint, payload, ext, bufs)
    return True


def on_cast_reply(node: Node, origin: str | None, entries: list, buffers: list) -> None:
    """A host agent's folded answers: each member's value unpickled on its own (one that
    cannot be fails its call alone) and delivered to its port. A member's answer to its
    relayed message ``seq`` says it read every message relayed to it before."""
    STATS["replies_taken"] += 1
    agent_p = node.peers.by_id.get(origin) if origin is not None else None
    agent_inflight = agent_p.inflight if agent_p is not None else set()
    replies = node.ports.replies
    deliver = node.ports.deliver
    at = 0
    by_id = node.peers.by_id
    for port, kind, value, nbufs, seq in entries:
        rep = replies.get(port)
        if kind == MSG_RESULTS or kind == MSG_VALUES:
            # members of a host share (``seq``: their positions); a share closed already
            # (failed whole: its agent was lost) drops them
            if rep is not None and type(sink := rep[0]) is HostShare:
                sink.take_results(seq, value, _loads_alone if kind == MSG_RESULTS else None,
                                  lambda p, e: unreadable_result(
                                      f"{node.links.peer_name(p.ref.node_id if p.ref else None)}"
                                      f" through its host agent", e))
            continue
        if rep is not None and type(sink := rep[0]) is HostShare:
            # one call()'s share: ``seq`` is the member's position in it
            if kind == MSG_RESULT:
                bufs = buffers[at:at + nbufs]
                at += nbufs
                try:
                    value = _loads(value, bufs)
                except Exception as e:  # noqa: BLE001 - fails this one member's slot
                    member = sink.peers[seq].ref.node_id if seq >= 0 else None
                    value = unreadable_result(f"{node.links.peer_name(member)} through its "
                                              f"host agent", e)
            elif kind == MSG_FAIL:
                value = Failure(value)
            sink.take(seq, value)
            continue
        agent_inflight.discard(port)
        if rep is not None and (p := rep[1]) is not None:
            if seq > p.relay_acked:
                p.relay_acked = seq
            via = p.relay_via
            if via is not None and via.node_id != origin and (vp := by_id.get(via.node_id)):
                vp.inflight.discard(port)       # its tree's head held it too
        if kind == MSG_RESULT:
            bufs = buffers[at:at + nbufs]
            at += nbufs
            try:
                value = serialization.loads(value, bufs)
            except Exception as e:  # noqa: BLE001 - fails this one call
                member = rep[1].ref.node_id if rep is not None and rep[1] is not None \
                    and rep[1].ref is not None else None
                value = unreadable_result(f"{node.links.peer_name(member)} through its host "
                                          f"agent", e)
        elif kind == MSG_FAIL:
            value = Failure(value)
        deliver(port, value)


#: Results every member of a call() tends to send alike (None, 0, True, a short str):
#: the last one's pickle and value, reused while the next is the same bytes (an immutable
#: value, so sharing it is unseen). One tuple, swapped whole: safe from any thread.
_LAST_SMALL: tuple = (None, None)


def _loads_alone(data: bytes) -> Any:
    """``_loads`` of a value with no out-of-band buffers."""
    return _loads(data, ())


def _loads(data: bytes, bufs: list) -> Any:
    """``serialization.loads``, skipping the unpickling of a small immutable result that
    is the same as the last one."""
    global _LAST_SMALL
    if bufs:
        return serialization.loads(data, bufs)
    last = _LAST_SMALL
    if last[0] == data:
        return last[1]
    value = serialization.loads(data, bufs)
    if len(data) <= 64 and type(value) in IMMUTABLE:
        _LAST_SMALL = (data, value)
    return value
