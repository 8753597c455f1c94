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
each took) is kept by routing, never by waiting. Each member's peer counts the messages
relayed to it (``Peer.relay_sent``, each cast carries the member's count, ``seq``) and the
highest count it is known to have read (``relay_acked``: its answer to a relayed call came
back; a member handles its agent's messages in order, so that answer says it read every
relayed message before it). While the two differ, the member is *relayed*: every later
call to it, a ``call_one`` too (``Node.call_actor``, ``Node.send``), goes through the same
agent. A member with direct calls awaiting replies (``Peer.inflight``) gets its share of a
call() or broadcast straight instead, behind them. A broadcast through an agent needs no
acknowledgement of its own (the member stays relayed until a later relayed call answers);
a broadcast sent straight to a member that is relayable is followed by a ``ping`` whose
reply port keeps the member counted as direct until it read the broadcast.

Failures need nothing new: each relayed reply port is registered with the member's peer
(its exit or its host's loss fails it, as a direct call's) and with the agent's (an agent
whose connection is lost for good fails what it held).

Past ``HPCMESH_RELAY_FANOUT`` (32) hosts a view casts through a tree of its agents that
wide (``tree``, ``cast_tree``): one MSG_CAST_TREE to each head, which forwards the shares
of the agents below it and hands out its own; each agent's answers go up to the agent that
forwarded it the cast (``MSG_CAST_UP``), which folds them with its own, so the sender reads
a frame per head, not per host. A member's route is then its head and the agents down to its own (``relay_via``,
``relay_path``): the rule above holds per route, and a cast routed otherwise sends a
relayed member its share alone along its route (``_detour``). A head lost fails what it
relayed (``fail_relayed``; the controller also fails the members it may have held
messages for, ``ClientRuntime._lost_with_relay``).

``HPCMESH_RELAY=0`` turns the relay off (every call goes straight to its member).
"""

from __future__ import annotations

import logging
import math
import pickle
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from ..settings import env_flag, env_number
from ..transport import serialization
from .future import FanIn, Future
from .host_share import ALL, HostShare
from .messages import (MSG_CAST_TREE, MSG_CAST_UP, MSG_DELIVER, MSG_FAIL, MSG_RESULT,
                       MSG_RESULTS, MSG_VALUES, PROTOCOL, Failure, NodeRef, call_msg,
                       cast_msg, cast_reply_msg, describe_exception, unreadable_result)
from .errors import HOST_LOST, LOST_STATUS, SupervisionError
from .links import LOST_PEER_REPORT_WAIT
from .peers import Peer, PeerTable

#: the ``runtime.node.Node`` sending or relaying (not imported: node.py imports this module)
Node = Any

log = logging.getLogger("hpcmesh.runtime")

RELAY_VAR = "HPCMESH_RELAY"
#: Past this many hosts a view's casts go through a tree of agents this wide (0: never).
FANOUT_VAR = "HPCMESH_RELAY_FANOUT"
#: The key of a node's hello info that says it relays casts (a host agent's does).
RELAYS = "relays"
#: A result bigger than this (its buffers) leaves the agent at once in a frame of its own
#: rather than folded with others: folding saves frames of small replies, not copies.
FOLD_BYTES = 1 << 20
#: How long an agent holds the answers it has while others of the same sender's casts are
#: still out (once all are in, they leave at once): a slow member costs the others this.
FOLD_WINDOW = env_number("HPCMESH_RELAY_FOLD_US", 200, unit="microseconds") * 1e-6
#: How long an agent in a tree holds what it has once only agents below it still owe
#: answers (they are a hop behind its own members; a call() waits for the last answer
#: anyway): the sender then reads one frame per head, not one per head and per late hop.
FOLD_BELOW = 10 * FOLD_WINDOW
#: How long an agent holds the answers of a call() its sender waits on alone through it
#: (the cast says ``hold``) until the rest are in: the call() ends with its last answer
#: anyway, so the sender reads one frame per head, not one per burst of answers (on a
#: busy machine a call()'s answers spread over a tenth of a second). Short beside the
#: straggler watch's thresholds (seconds), which read the answers that came.
HOLD = max(FOLD_BELOW, 0.2) if FOLD_WINDOW > 0 else 0.0

#: Counts, per process: casts sent and folded answers taken (a caller's), casts relayed
#: and folded answers sent (an agent's). Tests and benchmarks count frames with them.
STATS = {"casts_sent": 0, "replies_taken": 0, "casts": 0, "cast_replies": 0,
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
            g.peers = [node.peers.peer(ref) for ref in g.refs]
            for p, member in zip(g.peers, g.members):
                if not p.relay_name:
                    p.relay_name = member[0]
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
    agent_up = (agent_p is not None and agent_p.conn is not None and not agent_p.conn.closed
                and agent_p.conn.info.get("peer_info", {}).get(RELAYS) is True)
    members, chosen, straight, detours = [], [], [], []
    if not group.peers:         # a node's Peer entries live as long as it (made once)
        group.peers = [peers.peer(ref) for ref in group.refs]
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
    with _SENDING:
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
                                     out, fan, straight, detours)
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
                reply: bool, out: list, fan: FanIn | None, straight: list, detours: list
                ) -> tuple[tuple, list]:
    """Group ``g``'s share of a tree cast, numbered, and its children's: (share,
    subtrees) as MSG_CAST_TREE carries them. Under ``_SENDING``."""
    via, path = g.via, g.path
    skipped = None              # positions in g of members not in this share
    hs = None                   # with a FanIn: the share's one reply port
    if reply:
        ports, seqs = [], []
        if fan is not None:
            hs = HostShare(node.ports, fan, actor_id, endpoint)
        else:
            expect = node.ports.expect_reply
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
        p.relay_sent += 1
        p.relay_via = via
        p.relay_path = path
        if reply:
            seqs.append(p.relay_sent)
            if hs is None:
                slot = g.slots[i]
                out[slot], pid = expect(p, actor_id, endpoint)
                head.inflight.add(pid)
                ports.append(pid)
    if hs is not None and seqs:
        hs.fill(g.slots, g.peers, seqs, skipped)
        ports, seqs = _register(node, hs, node.peers.peer(g.agent), head), None
    if skipped is None:
        share = (g.blob, ports, seqs) if reply else (g.blob, None, None)
    elif len(skipped) == len(g.peers):
        share = (None, None, None)
    else:
        chosen = tuple(m for i, m in enumerate(g.members) if i not in skipped)
        share = (pickle.dumps(chosen, PROTOCOL), ports if reply else None,
                 seqs if reply else None)
    return share, [(c.path[-1].node_id, c.path[-1].addresses,
                    *_tree_share(node, c, head, actor_id, endpoint, reply, out, fan,
                                 straight, detours))
                   for c in g.children]


def _on_route(node: Node, p: Peer, via: NodeRef, path: tuple) -> bool:
    """Whether a message to relayed member ``p`` may go through ``via`` and down
    ``path``: the route its relayed messages took (after ``_mend``), or any once none
    is left unread."""
    _mend(node, p)
    if p.relay_sent == p.relay_acked:
        return True
    return (p.relay_via is not None and p.relay_via.node_id == via.node_id
            and [r.node_id for r in p.relay_path] == [r.node_id for r in path])


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
    p.relay_sent += 1
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
                agent_p: Peer | None, chosen: list, members: list) -> None:
    """The relayed part of ``cast``: numbered and sent under ``_SENDING``. A call() into a
    ``FanIn`` gets one reply port for the whole share (``HostShare``); other calls one
    per member."""
    peers = node.peers
    seqs = [] if reply else None     # each member's number, echoed with its answer
    ports = [] if reply else None
    share = None
    if reply:
        agent_p = agent_p or peers.peer(group.agent)
        if fan is not None:
            share = HostShare(node.ports, fan, actor_id, endpoint)
        else:
            agent_inflight = agent_p.inflight
            expect = node.ports.expect_reply
    for slot, p, _ in chosen:
        p.relay_sent += 1
        p.relay_via = group.agent
        p.relay_path = ()
        if share is not None:
            seqs.append(p.relay_sent)
        elif reply:
            seqs.append(p.relay_sent)
            fut, pid = expect(p, actor_id, endpoint)
            out[slot] = fut
            agent_inflight.add(pid)
            ports.append(pid)
    if chosen[0][1].relay_name == "":
        for (_, p, _), member in zip(chosen, members):
            p.relay_name = member[0]
    hold = share is not None and not agent_p.inflight      # see cast_tree
    if share is not None:
        if len(chosen) == len(group.slots):
            share.fill(group.slots, group.peers, seqs, None)
        else:
            share.fill([c[0] for c in chosen], [c[1] for c in chosen], seqs, None)
        ports, seqs = _register(node, share, agent_p, None), None
    if len(members) == len(group.members):
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
        p.relay_sent += 1
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
_SHAREABLE = (type(None), bool, int, float, str, bytes)


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
    if len(data) <= 64 and type(value) in _SHAREABLE:
        _LAST_SMALL = (data, value)
    return value


# -- the agent's half -------------------------------------------------------------------
#: Plain values that a share's alike answers may share as one (immutable, and equal only
#: to their own kind's values: not float, where -0.0 == 0.0)
_ALIKE_TYPES = (type(None), bool, int, str, bytes)


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
        out = self._out.get(dest)
        if out is None:
            out = self._out[dest] = ([], [], [0, 0], {})
        out[0].extend(entries)
        out[1].extend(bufs)
        out[2][0] += sum(memoryview(b).nbytes for b in bufs) if bufs else 0
        out[2][1] += answers
        if self._hold.get(dest) and any(e[1] != MSG_RESULTS and e[1] != MSG_VALUES
                                        for e in entries):
            self._hold[dest] = False    # a stream's answer, a failure: the short window
        self._held(dest, out)

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
        out = self._out.get(dest)
        if out is None:
            out = self._out[dest] = ([], [], [0, 0], {})
        group = out[3].get((port, kind))
        if group is None:
            group = out[3][(port, kind)] = ([], [])
            out[0].append((port, kind, group[0], 0, group[1]))
        group[0].append(value)
        group[1].append(position)
        if kind == MSG_RESULTS:
            out[2][0] += len(value)
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
                serialization.SerializationError) as e:
            problem = e             # an exception among them that does not pickle
        except Exception as e:  # noqa: BLE001 - the sender is gone: its supervision says so
            if up and entries:      # the agent above is: to the sender straight
                try:
                    node.send(node.ref_of(dest.sender), cast_reply_msg(entries), buffers=bufs)
                    return
                except Exception as e2:  # noqa: BLE001
                    e = e2
            log.debug("cannot return relayed replies to %s: %s", to.node_id[:8], e)
            return
        # one by one, any that does not pickle replaced by what it said (the count of
        # answers they settle goes with the last)
        log.debug("folded replies did not pickle (%s): sent one by one", problem)
        at = 0
        for i, (port, kind, value, nbufs, seq) in enumerate(entries):
            mine = bufs[at:at + nbufs]
            at += nbufs
            if kind == MSG_FAIL:
                try:
                    pickle.dumps(value)
                except Exception:  # noqa: BLE001
                    value = RuntimeError(describe_exception(value))
            try:
                node.send(to, msg([(port, kind, value, nbufs, seq)],
                                  answers if i == len(entries) - 1 else 0), buffers=mine)
            except Exception as e:  # noqa: BLE001
                log.debug("cannot return a relayed reply to %s: %s", to.node_id[:8], e)
