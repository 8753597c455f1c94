"""The node's port and peer tables on their own: no loop, no socket, no process (pure)."""

import pytest

from hpcmesh.runtime.messages import Failure, NodeRef
from hpcmesh.runtime.peers import PeerTable
from hpcmesh.runtime.ports import PortTable


def test_a_callback_port_gets_every_delivery_a_once_port_the_first():
    ports, got = PortTable(), []
    every = ports.open(got.append)
    first = ports.open(lambda v: got.append(("once", v)), once=True)
    for v in (1, 2):
        ports.deliver(every, v)
        ports.deliver(first, v)
    assert got == [1, ("once", 1), 2]
    ports.close(every)
    ports.deliver(every, 3)            # closed: dropped, nothing raised
    assert got == [1, ("once", 1), 2]


def test_a_reply_port_resolves_its_future_once_and_a_late_reply_is_dropped():
    ports, peers = PortTable(), PeerTable()
    p = peers.peer(NodeRef("b", ("tcp://10.0.0.2:1",)))
    fut, pid = ports.expect_reply(p)
    assert peers.load("b") == 1 and pid in p.inflight
    ports.deliver(pid, "answer")
    assert fut.result() == "answer" and peers.load("b") == 0
    ports.deliver(pid, "late")          # nobody waits any more
    assert fut.result() == "answer"
    err, epid = ports.expect_reply(None)
    ports.deliver(epid, Failure(ValueError("boom")))
    with pytest.raises(ValueError, match="boom"):
        err.result()


def test_losing_a_peer_fails_what_waits_on_it_and_nothing_else():
    ports, peers, events = PortTable(), PeerTable(), []
    p = peers.peer(NodeRef("b", ()))
    waiting = [ports.expect_reply(p)[0] for _ in range(3)]
    other, _ = ports.expect_reply(peers.peer(NodeRef("c", ())))
    ports.open(events.append)
    p.lost = ConnectionError("b is gone")
    peers.fail_inflight(p, p.lost, ports.deliver)
    for fut in waiting:
        with pytest.raises(ConnectionError, match="b is gone"):
            fut.result()
    assert not other.done() and events == [] and not p.inflight
    # a reply port opened after the loss fails at once instead of waiting forever
    late, _ = ports.expect_reply(p)
    with pytest.raises(ConnectionError, match="b is gone"):
        late.result()


def test_the_peer_table_learns_addresses_and_names_unknown_nodes_by_id():
    peers = PeerTable()
    assert peers.ref_of("x") == NodeRef("x", ()) and not peers.connected("x")
    p = peers.peer(NodeRef("x", ()))
    assert peers.peer(NodeRef("x", ("tcp://h:1",))) is p      # one entry per node
    assert peers.ref_of("x").addresses == ("tcp://h:1",)
    peers.peer(NodeRef("x", ("tcp://other:2",)))                # known addresses are kept
    assert peers.ref_of("x").addresses == ("tcp://h:1",)
    assert peers.values() == [p] and peers.load("nobody") == 0


def test_a_lost_peer_weighs_more_than_any_live_one():
    from hpcmesh.runtime.peers import LOST_LOAD
    ports, peers = PortTable(), PeerTable()
    busy = peers.peer(NodeRef("busy", ()))
    for _ in range(1000):
        ports.expect_reply(busy)
    gone = peers.peer(NodeRef("gone", ()))
    gone.lost = ConnectionError("gone")
    assert peers.load("busy") == 1000 < peers.load("gone") == LOST_LOAD
