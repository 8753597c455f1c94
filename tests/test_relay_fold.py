"""The bookkeeping of answers folding up a tree of host agents (``cast_relay.CastRelay``), on a
node with no I/O: what one agent is owed by the agent below it, when that agent's link
drops and it comes back, and where answers go when the agent above is out of reach.
(The end-to-end behaviour is ``test_relay_tree.py``'s, on real processes and the memory
twin.)"""
from __future__ import annotations

import pickle

import pytest

from hpcmesh.runtime.future import FanIn
from hpcmesh.runtime.host_share import HostShare, fail_member
from hpcmesh.runtime.messages import (MSG_CAST, MSG_CAST_REPLY, MSG_CAST_TREE, MSG_CAST_UP,
                                      MSG_DELIVER, MSG_FAIL, MSG_RESULTS, MSG_VALUES, PROTOCOL,
                                      Failure, NodeRef)
from hpcmesh.runtime.peers import PeerTable
from hpcmesh.runtime.ports import PortTable
from hpcmesh.runtime import cast_relay as relay_mod
from hpcmesh.runtime.cast_relay import CastRelay
from hpcmesh.runtime.relay import RawResult
from hpcmesh.transport.framing import FrameError

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
    """Timers are kept (``timers``), not run: a test fires one with ``fire()``."""
    def __init__(self):
        self.timers: list[_Timer] = []

    def call_later(self, delay, fn, *args):
        self.timers.append(_Timer(delay, fn, args))
        return self.timers[-1]

    def call_soon(self, fn, *args) -> None:
        pass

    def armed(self) -> list:
        return [t.delay for t in self.timers if not t.cancelled]


class _Timer:
    def __init__(self, delay, fn, args):
        self.delay, self.fn, self.args, self.cancelled = delay, fn, args, False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        self.cancelled = True
        self.fn(*self.args)


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
           (PARENT, ("tcp://p",), 1), False)
    relay.on_cast(msg, PARENT, [])
    own = [entry[0] for entry in node.ports.replies.values()]     # the members' answers
    return node, relay, own


def _link_drops(node, peer_id: str) -> None:
    """The node's last connection to ``peer_id`` closed (its peer-closed hooks run)."""
    for cb in node.on_peer_closed:
        cb(node, peer_id, None)


def _values(entries: list) -> list:
    """Each member's answer in ``entries`` (a share's answers come packed, MSG_VALUES: one
    value per position, or one for all)."""
    out = []
    for port, kind, value, nbufs, seq in entries:
        if kind == MSG_VALUES or kind == MSG_RESULTS:
            out += value * len(seq) if len(value) == 1 else value
        else:
            out.append(value)
    return out


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
    assert sorted(_values(entries)) == ["x", "x", "y", "y", "y"], node.sent
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
    assert _values([e for m in replies for e in m[1]]) == ["x", "x"], node.sent
    assert not _ups(node)


def _flat_share(n: int, hold: bool = False, port: int = 9, node=None, relay=None):
    """Agent X handed a call()'s host share of ``n`` members (one reply ``port``); the
    answers that wait on its members."""
    node = node or _Node()
    relay = relay or CastRelay(node)
    names = [f"m{port}.{i}" for i in range(n)]
    for nid in (SENDER, *names):
        node.peers.peer(NodeRef(nid, (f"tcp://{nid}",))).conn = _Conn()
    before = set(node.ports.replies)
    relay.on_cast((MSG_CAST, "actor", "ep", b"payload", (), _members(*names), port, None,
                   hold), SENDER, [])
    return node, [e[0] for pid, e in node.ports.replies.items() if pid not in before]


def _replies(node) -> list:
    return [m for to, m in node.sent if to == SENDER and m[0] == MSG_CAST_REPLY]


def test_a_share_s_answers_travel_as_one_entry_and_alike_ones_as_one_value():
    node, answers = _flat_share(4)
    for a in answers:
        a.set_result(None)
    (to, msg), = node.sent[-1:]
    assert to == SENDER and msg[0] == MSG_CAST_REPLY
    assert msg[1] == [(9, MSG_VALUES, [None], 0, [0, 1, 2, 3])]


def test_answers_equal_only_across_types_are_not_folded_into_one():
    # 0 == False == 0.0 == -0.0 in Python: each must reach the caller as it was sent
    node, answers = _flat_share(4)
    for a, v in zip(answers, [0, False, 0.0, -0.0]):
        a.set_result(v)
    (port, kind, values, _, positions), = node.sent[-1][1][1]
    got = dict(zip(positions, values))
    assert [(type(got[i]), got[i]) for i in range(4)] == [
        (int, 0), (bool, False), (float, 0.0), (float, -0.0)]
    assert str(got[3]) == "-0.0"


def test_a_share_s_packed_answers_fill_their_slots_and_an_unreadable_one_fails_its_own():
    ports = PortTable()
    peers = PeerTable()
    members = [peers.peer(NodeRef(f"m{i}", ())) for i in range(3)]
    fan = FanIn(3)
    share = HostShare(ports, fan, "actor", "ep")
    share.fill([2, 0, 1], members, 1)
    share.open = 3
    share.pid = ports.expect_into(peers.peer(NodeRef("agent", ())), share)
    share.take_results([0, 2], [pickle.dumps("a"), pickle.dumps("c")], pickle.loads,
                       lambda p, e: Failure(RuntimeError(f"unreadable from {p.ref.node_id}")))
    assert fan.done == bytearray([0, 1, 1]) and not fan.out.done()     # slots 2 and 1
    assert [p.relay_acked for p in members] == [1, 0, 1]
    share.take_results([1], [b"not a pickle"], pickle.loads,
                       lambda p, e: Failure(RuntimeError(f"unreadable from {p.ref.node_id}")))
    with pytest.raises(RuntimeError, match="unreadable from m1"):
        fan.out.get(timeout=1)
    assert share.pid not in ports.replies          # every member answered: closed


def test_alike_pickled_answers_are_unpickled_once():
    ports, peers = PortTable(), PeerTable()
    members = [peers.peer(NodeRef(f"m{i}", ())) for i in range(4)]
    fan = FanIn(4)
    share = HostShare(ports, fan, "actor", "ep")
    share.fill([0, 1, 2, 3], members, 5, None, 0)
    share.open = 4
    share.pid = ports.expect_into(peers.peer(NodeRef("agent", ())), share)
    loads = []
    share.take_results([3, 1, 0, 2], [pickle.dumps(7)],
                       lambda b: loads.append(b) or pickle.loads(b), None)
    assert fan.out.get(timeout=1) == [7, 7, 7, 7] and len(loads) == 1


def _share(n: int, slots: list | None = None, first: int = 0, seq: int = 5):
    """A call()'s host share of ``n`` members (in slots ``first`` .. on), relayed as
    number ``seq``: (share, fan-in, member peers, port table)."""
    ports, peers = PortTable(), PeerTable()
    members = [peers.peer(NodeRef(f"m{i}", ())) for i in range(n)]
    fan = FanIn(n if slots is None else max(slots) + 1)
    share = HostShare(ports, fan, "actor", "ep")
    share.fill(list(range(first, first + n)) if slots is None else slots, members, seq, None,
               first if slots is None else -1)
    share.open = n
    for p in members:
        p.relay_sent = seq
    share.pid = ports.expect_into(peers.peer(NodeRef("agent", ())), share)
    return share, fan, members, ports


class _RunsOnly(FanIn):
    """A fan-in that fails a test putting results one slot at a time."""
    def put(self, i, value):
        raise AssertionError(f"slot {i} put on its own, not in a run")


@pytest.mark.parametrize("values", [["a", "b", "c", "d"], ["alike"]])
def test_a_whole_share_answering_in_order_fills_its_slots_as_one_run(values):
    share, fan, members, ports = _share(4)
    share.fan = fan = _RunsOnly(4)
    share.take_results([0, 1, 2, 3], values, None, None)
    assert fan.out.get(timeout=1) == (values if len(values) == 4 else values * 4)
    assert [p.relay_acked for p in members] == [5] * 4         # each read number 5
    assert share.pid not in ports.replies and not any(share.pending)


@pytest.mark.parametrize("positions", [[2, 0, 3, 1], [0, 1, 3, 2]])
def test_a_whole_share_answering_out_of_order_gets_each_value_in_its_own_slot(positions):
    share, fan, members, _ = _share(4)
    share.take_results(positions, [f"v{i}" for i in positions], None, None)
    assert fan.out.get(timeout=1) == ["v0", "v1", "v2", "v3"]
    assert [p.relay_acked for p in members] == [5] * 4


def test_a_failure_in_a_whole_share_s_answers_fails_its_own_slot_and_the_rest_land():
    share, fan, members, _ = _share(3)
    share.take_results([0, 1, 2], ["a", Failure(ValueError("m1 broke")), "c"], None, None)
    with pytest.raises(ValueError, match="m1 broke"):
        fan.out.get(timeout=1)
    assert fan.done == bytearray([1, 2, 1]) and fan.results[0] == "a"   # then: failed
    assert [p.relay_acked for p in members] == [5] * 3


def test_a_share_whose_slots_do_not_follow_on_is_filled_one_by_one():
    share, fan, _, _ = _share(3, slots=[4, 0, 2])
    share.take_results([0, 1, 2], [None], None, None)
    assert fan.done == bytearray([1, 0, 1, 0, 1])
    assert not fan.out.done()           # slots 1 and 3 belong to other members


def test_a_run_with_a_slot_answered_already_is_filled_one_by_one():
    fan = FanIn(4)
    fan.put(2, "first")
    fan.put_range(0, 4, "x")
    assert fan.out.get(timeout=1) == ["x", "x", "first", "x"]    # a second answer: dropped


@pytest.mark.parametrize("first", ["a run", "one slot"])
def test_a_run_completing_a_fan_in_settles_it_and_tells_the_first_result_once(first):
    firsts = []
    fan = FanIn(6, on_first=firsts.append)
    if first == "a run":
        fan.put_range(3, 3, values=["c", "d", "e"])
    else:
        fan.put(5, "e")
    assert len(firsts) == 1 and not fan.out.done()
    if first == "a run":
        fan.put_range(0, 3, values=["x", "y", "z"])
        assert fan.out.get(timeout=1) == ["x", "y", "z", "c", "d", "e"]
    else:
        fan.put_range(0, 2, values=["x", "y"])
        assert not fan.out.done()
        fan.put_range(2, 3, "c")
        assert fan.out.get(timeout=1) == ["x", "y", "c", "c", "c", "e"]
    assert len(firsts) == 1
    fan.put_range(0, 0)                 # nothing: no count taken


def test_a_lone_call_s_answers_are_held_until_the_last_is_in():
    node, answers = _flat_share(4, hold=True)
    for a in answers[:3]:
        a.set_result(0)
    assert not _replies(node) and node.loop.armed() == [relay_mod.HOLD]
    answers[3].set_result(0)
    assert [m[1] for m in _replies(node)] == [[(9, MSG_VALUES, [0], 0, [0, 1, 2, 3])]]
    assert node.loop.armed() == []


def test_a_lone_call_s_hold_ends_when_it_runs_out():
    node, answers = _flat_share(4, hold=True)
    answers[0].set_result(0)
    node.loop.timers[-1].fire()                 # a straggler: what came leaves
    assert [m[1] for m in _replies(node)] == [[(9, MSG_VALUES, [0], 0, [0])]]


@pytest.mark.parametrize("second_says_hold", [False, True])
def test_a_second_call_in_flight_ends_the_hold_of_the_first(second_says_hold):
    # pipelined calls share the destination: the first's answers must not wait for the
    # second's. The sender says hold only for a call alone in flight through the agent;
    # a cast that finds answers owed never holds, even if it says so (another path's count)
    node, answers = _flat_share(2, hold=True)
    answers[0].set_result(0)
    node, second = _flat_share(2, hold=second_says_hold, port=10, node=node,
                               relay=node.cast_handler.__self__)
    assert node.loop.armed() == [relay_mod.FOLD_WINDOW]
    answers[1].set_result(0)
    assert not _replies(node)                   # the second is still out: the window
    node.loop.timers[-1].fire()
    assert [m[1] for m in _replies(node)] == [[(9, MSG_VALUES, [0], 0, [0, 1])]]


def test_a_failed_member_ends_the_hold():
    node, answers = _flat_share(3, hold=True)
    answers[0].set_result(0)
    answers[1].set_exception(RuntimeError("boom"))
    assert node.loop.armed() == [relay_mod.FOLD_WINDOW]



def test_a_hold_that_runs_out_ends():
    # a straggler: what came leaves after HOLD, and the rest is not held a second HOLD at
    # this agent (an agent above may hold it once; the controller waits for no more)
    node, answers = _flat_share(3, hold=True)
    answers[0].set_result(0)
    node.loop.timers[-1].fire()
    answers[1].set_result(0)
    assert node.loop.armed() == [relay_mod.FOLD_WINDOW]


def _send_limited_to(node, limit: int) -> None:
    """The node's sends fail as a frame over ``limit`` bytes does (FrameError)."""
    def send(ref, msg, buffers=None, cork=None):
        if len(pickle.dumps(msg, PROTOCOL)) > limit:
            raise FrameError(f"over {limit} bytes")
        node.sent.append((ref.node_id, msg))
    node.send = send


def test_held_answers_too_big_for_one_frame_go_one_by_one():
    node, answers = _flat_share(3, hold=True)
    _send_limited_to(node, 1 << 20)
    for i, a in enumerate(answers):         # 0.6 MiB each: two fit no frame together
        a.set_result(chr(65 + i) * (600 << 10))
    got = _values([e for m in _replies(node) for e in m[1]])
    assert sorted(v[0] for v in got) == ["A", "B", "C"], [len(v) for v in got]


def test_an_answer_too_big_to_pass_on_fails_its_member_saying_so():
    node, answers = _flat_share(2, hold=True)
    _send_limited_to(node, 500 << 10)
    answers[0].set_result("x" * (600 << 10))
    answers[1].set_result("y")
    entries = [e for m in _replies(node) for e in m[1]]
    fails = [e for e in entries if e[1] == MSG_FAIL]
    assert [e[4] for e in fails] == [0] and "could not be passed on" in str(fails[0][2])
    assert _values([e for e in entries if e[1] != MSG_FAIL]) == ["y"]


def test_alike_pickled_answers_that_are_mutable_are_each_their_own_object():
    node, answers = _flat_share(3)
    for a in answers:
        a.set_result(RawResult(pickle.dumps(list(range(40)), PROTOCOL), []))
    (port, kind, values, _, positions), = _replies(node)[0][1]
    assert kind == MSG_RESULTS and len(values) == 1         # one pickle on the wire
    ports, peers = PortTable(), PeerTable()
    fan = FanIn(3)
    share = HostShare(ports, fan, "actor", "ep")
    share.fill([0, 1, 2], [peers.peer(NodeRef(f"m{i}", ())) for i in range(3)], 1, None, 0)
    share.open = 3
    share.pid = ports.expect_into(peers.peer(NodeRef("agent", ())), share)
    share.take_results(positions, values, pickle.loads, None)
    got = fan.out.get(timeout=1)
    got[0].append("mine")                   # the caller edits one member's result
    assert got[1] == list(range(40)) and got[2] == list(range(40))


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_lost_member_below_a_head_is_failed_after_each_agent_above_may_have_held(depth):
    node = _Node()
    p = node.peers.peer(NodeRef("member", ()))
    p.relay_sent, p.relay_acked = 2, 1
    p.relay_via = NodeRef("head", ())
    p.relay_path = tuple(NodeRef(f"agent{i}", ()) for i in range(depth))
    fail_member(node, p, RuntimeError("gone"))
    assert node.loop.armed() == ([(depth + 1) * relay_mod.HOLD] if depth else [])
