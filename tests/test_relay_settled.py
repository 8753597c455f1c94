"""Settled host groups (``relay._settled``): a cast that found every member of a host on its
route lets the next casts only number them, until something about a member changes. Each
test here is a sequence of events after which the old per-member checks would have sent a
member another way than the settled shortcut would: the shortcut must not be taken. On a
node with no I/O (what each cast sends is recorded); the end-to-end order is
``test_relay.py``'s, on real processes and the memory twin."""
from __future__ import annotations

import pytest

from hpcmesh.runtime import relay
from hpcmesh.runtime.future import FanIn
from hpcmesh.runtime.links import Links
from hpcmesh.runtime.messages import MSG_CALL, MSG_CAST, MSG_CAST_TREE, NodeRef
from hpcmesh.runtime.peers import PeerTable
from hpcmesh.runtime.ports import PortTable


class _Conn:
    closed = False

    def __init__(self, on_close=None):
        self.info = {"peer_info": {relay.RELAYS: True}}
        self.on_close = on_close

    def close(self) -> None:
        self.closed = True
        if self.on_close is not None:
            self.on_close()


class _Node:
    node_id = "controller"
    addresses = ("controller",)

    def __init__(self):
        self.peers, self.ports, self.sent = PeerTable(), PortTable(), []

    def send(self, target, msg, buffers=None, cork=None) -> None:
        self.sent.append((target.node_id, msg[0]))

    def rpc(self, *args) -> None:
        pass


def _mesh(hosts: int, per_host: int = 2):
    """A node connected to ``hosts`` agents, and the host groups of a view over
    ``per_host`` members on each."""
    node = _Node()
    agents = [NodeRef(f"A{h}", (f"a{h}",)) for h in range(hosts)]
    for a in agents:
        node.peers.peer(a).conn = _Conn()
    members = [(h * per_host + g, f"p{h}{g}", NodeRef(f"m{h}{g}", (f"m{h}{g}",)), agents[h])
               for h in range(hosts) for g in range(per_host)]
    groups, _ = relay.plan(node, members)
    return node, groups


def _call(node, cast) -> tuple[list, list]:
    """One call() through ``cast(out, straight, fan)``: (what was sent, the slots sent
    straight)."""
    n = sum(len(g.slots) for g in node.groups)
    fan, out, straight = FanIn(n), [None] * n, []
    node.sent.clear()
    cast(out, lambda slot: straight.append(slot), fan)
    return list(node.sent), straight


def _flat(node, group):
    return lambda out, straight, fan: relay.cast(node, group, "actor", "ep", ((), {}), [], (),
                                                 True, out, straight, 2, fan)


def _tree(node, heads):
    return lambda out, straight, fan: relay.cast_tree(node, heads, "actor", "ep", ((), {}),
                                                      [], (), True, out, straight, fan)


def _answer(groups) -> None:
    """Every member answered what was relayed to it."""
    for g in groups:
        for p in g.peers:
            p.relay_acked = p.relay_sent


def _settled_shares(node, cast) -> int:
    before = relay.STATS["settled"]
    _call(node, cast)
    return relay.STATS["settled"] - before


def test_a_host_settles_and_then_its_casts_check_no_member():
    node, groups = _mesh(1)
    node.groups = groups
    cast = _flat(node, groups[0])
    assert _settled_shares(node, cast) == 0     # the first cast checks each member
    _answer(groups)
    assert _settled_shares(node, cast) == 1


def test_a_tree_s_settled_group_cast_flat_checks_its_members_and_keeps_their_route():
    """Settled on the tree's route (head A2, then A3), then cast flat (a sibling agent
    went down): a member still relayed through A2 must get its share that way (a detour),
    not straight from A3, which could overtake what A2 still forwards."""
    node, groups = _mesh(5)
    node.groups = groups
    heads = relay.tree(node, groups, width=2)
    below = next(c for h in heads for c in h.children if c.agent.node_id == "A3")
    assert below.via.node_id == "A2"
    _call(node, _tree(node, heads))
    _call(node, _tree(node, heads))             # settled on the tree's route, unanswered
    node.peers.by_id["A4"].conn.closed = True   # A2's subtree casts flat now
    sent, _ = _call(node, _tree(node, heads))
    assert ("A3", MSG_CAST) not in sent and ("A2", MSG_CAST_TREE) in sent
    m = below.peers[0]
    assert m.relay_via.node_id == "A2" and [r.node_id for r in m.relay_path] == ["A3"]


def test_a_group_settled_flat_and_then_cast_along_the_tree_keeps_its_members_route():
    """The other way round: settled flat (through A3) while a sibling was down, then the
    tree is whole again: members still relayed through A3 alone get their share that way,
    and a call_one after it follows the same route."""
    node, groups = _mesh(5)
    node.groups = groups
    heads = relay.tree(node, groups, width=2)
    below = next(c for h in heads for c in h.children if c.agent.node_id == "A3")
    node.peers.by_id["A4"].conn.closed = True
    _call(node, _tree(node, heads))
    _call(node, _tree(node, heads))             # settled flat, unanswered
    node.peers.by_id["A4"].conn.closed = False
    sent, _ = _call(node, _tree(node, heads))
    assert ("A3", MSG_CAST) in sent             # below's members: along their own route
    m = below.peers[0]
    node.sent.clear()
    relay.relay_one(node, m, below.refs[0], (MSG_CALL, "actor", "ep", ((), {}), None, 0, ()),
                    [])
    assert node.sent == [("A3", MSG_CAST)] and m.relay_via.node_id == "A3"


def test_a_call_one_registered_while_relayed_and_sent_straight_unsettles_its_host():
    """A call_one's port is registered while the member is relayed; its relayed call is
    answered before the call_one leaves, so it leaves straight. The next cast must send
    that member straight too (behind the call_one), not through the agent."""
    node, groups = _mesh(1, per_host=3)
    node.groups = groups
    cast = _flat(node, groups[0])
    _call(node, cast)
    _answer(groups)
    _call(node, cast)                           # settled, unanswered: relayed
    m = groups[0].peers[0]
    assert relay.relayed(m)
    node.ports.expect_reply(m, "actor", "ep")   # the caller's thread
    _answer(groups)                             # the loop's thread: the answers land
    assert not relay.relayed(m)                 # the call_one now leaves straight
    sent, straight = _call(node, cast)
    assert straight == [0], (sent, straight)


def test_a_member_failed_while_a_cast_checks_it_is_checked_again_by_the_next():
    """``Links.fail_peer`` marks the member lost, then closes its connection: a cast on
    another thread in between finds it lost but still connected (so: live) and settles
    its host. The next cast must check it again and send it straight (where its loss
    fails its slot, named)."""
    node, groups = _mesh(1, per_host=3)
    node.groups = groups
    cast = _flat(node, groups[0])
    _call(node, cast)
    _answer(groups)
    m = groups[0].peers[0]
    m.conn = _Conn(on_close=lambda: (_call(node, cast), _answer(groups)))
    links = Links(node, None, b"", node.node_id, {}, node.peers,
                  on_frames=lambda conn, frames: None, deliver=node.ports.deliver)
    links.fail_peer(m.ref.node_id, RuntimeError("member ended"))
    sent, straight = _call(node, cast)
    assert straight == [0], (sent, straight)


@pytest.mark.parametrize("change", ["direct call", "lost"])
def test_a_change_to_one_member_makes_every_host_check_again(change):
    node, groups = _mesh(2)
    node.groups = groups
    casts = [_flat(node, g) for g in groups]
    for cast in casts:
        _call(node, cast)
    _answer(groups)
    assert [_settled_shares(node, c) for c in casts] == [1, 1]
    _answer(groups)
    m = groups[1].peers[1]
    if change == "direct call":
        node.ports.expect_reply(m, "actor", "ep")
    else:
        node.peers.set_lost(m, RuntimeError("gone"))
    assert [_settled_shares(node, c) for c in casts] == [0, 0]
