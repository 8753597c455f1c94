"""The bookkeeping of answers folding up a tree of host agents (``relay.CastRelay``), on a
node with no I/O: what one agent is owed by the agent below it, when that agent's link
drops and it comes back, and where answers go when the agent above is out of reach.
(The end-to-end behaviour is ``test_relay_tree.py``'s, on real processes and the memory
twin.)"""
from __future__ import annotations

import pickle

from hpcmesh.runtime.messages import (MSG_CAST_REPLY, MSG_CAST_TREE, MSG_CAST_UP,
                                      MSG_DELIVER, PROTOCOL, NodeRef)
from hpcmesh.runtime.peers import PeerTable
from hpcmesh.runtime.ports import PortTable
from hpcmesh.runtime.relay import CastRelay

SENDER, PARENT, CHILD = "S" * 16, "P" * 16, "Y" * 16


class _Conn:
    closed = False

    def flush_now(self) -> None:
        pass

    def send_msg(self, meta, cork=False) -> None:
        pass

    def send_frame(self, meta, bufs, cork=False) -> None:
        pass


class _Loop:
    def call_later(self, delay, fn, *args):
        return _Timer()

    def call_soon(self, fn, *args) -> None:
        pass


class _Timer:
    def cancel(self) -> None:
        pass


class _Node:
    """What CastRelay uses of a node; ``sent`` records (to, message)."""
    node_id, name, addresses = "X" * 16, "X", ("tcp://x:1",)

    def __init__(self):
        self.info, self.on_peer_closed, self.loop = {}, [], _Loop()
        self.peers, self.ports, self.sent = PeerTable(), PortTable(), []

    def send(self, ref, msg, buffers=None, cork=None) -> None:
        self.sent.append((ref.node_id, msg))

    def ref_of(self, nid: str) -> NodeRef:
        return self.peers.ref_of(nid)

    def close_port(self, pid: int) -> None:
        self.ports.close(pid)


def _members(*names: str) -> bytes:
    return pickle.dumps(tuple((n, n, (f"tcp://{n}",), i) for i, n in enumerate(names)),
                        PROTOCOL)


def _agent_below_a_head(connected=(SENDER, PARENT, CHILD, "m1", "m2", "m3", "m4", "m5")):
    """Agent X under head P: a call's share of 2 members of its own and a subtree of 3
    below it (agent Y), its answers owed up to P."""
    node = _Node()
    relay = CastRelay(node)
    for nid in connected:
        node.peers.peer(NodeRef(nid, (f"tcp://{nid}",))).conn = _Conn()
    msg = (MSG_CAST_TREE, (SENDER, ("tcp://s",)), "actor", "ep", b"payload", (),
           (_members("m1", "m2"), 7, None), [(CHILD, ("tcp://y",), (_members("m3", "m4", "m5"),
                                                                   8, None), [])],
           (PARENT, ("tcp://p",), 1))
    relay.on_cast(msg, PARENT, [])
    own = [entry[0] for entry in node.ports.replies.values()]     # the members' answers
    return node, relay, own


def _link_drops(node, peer_id: str) -> None:
    """The node's last connection to ``peer_id`` closed (its peer-closed hooks run)."""
    for cb in node.on_peer_closed:
        cb(node, peer_id, None)


def _ups(node) -> list:
    return [m for to, m in node.sent if to == PARENT and m[0] == MSG_CAST_UP]


def test_a_child_whose_link_dropped_and_came_back_loses_nobody_s_answers():
    node, relay, own = _agent_below_a_head()
    # the token X named its destination by, in the cast it forwarded to Y
    token = next(m[8][2] for to, m in node.sent if to == CHILD and m[0] == MSG_CAST_TREE)
    node.sent.clear()
    _link_drops(node, CHILD)                        # X's link to Y drops: not waited for
    # Y comes back and passes its answers up (late: they count for nothing here)
    relay.on_cast((MSG_CAST_UP, SENDER, token,
                   [(8, MSG_DELIVER, "y", 0, i) for i in range(3)], 3), CHILD, [])
    for a in own:                                   # then X's own members answer
        a.set_result("x")
    entries = [e for m in _ups(node) for e in m[3]]
    assert sorted(e[2] for e in entries) == ["x", "x", "y", "y", "y"], node.sent
    # the agent above counted 5 answers from X: it hears of 5, Y's late ones not twice
    assert sum(m[4] for m in _ups(node)) == 5, node.sent


def test_answers_go_to_the_sender_when_the_agent_above_is_out_of_reach():
    node, relay, own = _agent_below_a_head()
    node.peers.by_id[PARENT].conn = None            # P is gone (or being redialed)
    _link_drops(node, CHILD)
    node.sent.clear()
    for a in own:
        a.set_result("x")
    replies = [m for to, m in node.sent if to == SENDER and m[0] == MSG_CAST_REPLY]
    assert [e[2] for m in replies for e in m[1]] == ["x", "x"], node.sent
    assert not _ups(node)
