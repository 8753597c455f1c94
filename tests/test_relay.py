"""call()/broadcast()/stream() over a mesh of several hosts go through the host agents
(SPEC §11, issue 30; ``runtime/relay.py``): one message per host from the controller, not
one per process, with the same order, replies and failures as a direct call.

Real processes: ProcessJob hosts (each a ``hpcmesh worker`` of its own) with 4 processes
each; the order tests also run on the memory twin (``memory_procs``)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections import Counter

import numpy as np
import pytest
from proc_helpers import alive, wait_until

from hpcmesh.actor import Actor, SupervisionError, current_rank, endpoint
from hpcmesh.job import ProcessJob
from hpcmesh.runtime.client import client_runtime
from hpcmesh.runtime.errors import HOST_LOST
from hpcmesh.transport.connection import Connection

#: SPEC §3: a dead process fails what is pending on it within 5 s; the margin is for a
#: loaded test machine.
BOUND_S = 5.0
MARGIN_S = 5.0


class TwoArgError(Exception):
    """Unpickles only where its __init__ is called with two arguments: never."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


class Recorder(Actor):
    """Notes every message it is handed, in the order it is handed them."""

    def __init__(self):
        self.seen: list = []

    @endpoint
    def note(self, tag, data=None) -> int:
        self.seen.append(tag)
        return len(self.seen)

    @endpoint
    async def anote(self, tag) -> int:
        self.seen.append(tag)
        return len(self.seen)

    @endpoint
    def log(self) -> list:
        """What it saw since the last time it was asked."""
        seen, self.seen = self.seen, []
        return seen

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def array(self, n: int) -> np.ndarray:
        return np.arange(n)

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom from a member")

    @endpoint
    def awkward(self, which: str, victim: int):
        """A result the caller cannot unpickle (``unreadable``) or that does not pickle
        (``lock``), from the member of rank ``victim``; the others answer 1."""
        if current_rank().rank != victim:
            return 1
        return TwoArgError("x", "y") if which == "unreadable" else threading.Lock()

    @endpoint
    async def answer_then_end(self, victim: int, others_after: float) -> str:
        """Rank ``victim`` answers and its process ends right after; the others answer
        ``others_after`` seconds later."""
        if current_rank().rank == victim:
            asyncio.get_running_loop().call_later(0.05, os._exit, 0)
            return "bye"
        await asyncio.sleep(others_after)   # sleep: the others answer well after it ended
        return "late"

    @endpoint
    async def sleep(self, seconds: float) -> str:
        await asyncio.sleep(seconds)    # sleep: the endpoint's work is to take this long
        return "woke"


@pytest.fixture(scope="module")
def job():
    job = ProcessJob({"hosts": 2})
    yield job
    job.kill()


@pytest.fixture(scope="module")
def procs(job):
    pm = job.state(cached_path=None).hosts.spawn_procs({"gpus": 4}, name="relayed")
    yield pm
    pm.stop().get(timeout=60)


@pytest.fixture
def sent(monkeypatch):
    """Messages this process queued on each connection, by the peer's node id (counted
    where every message is queued: the connection's three send methods)."""
    counts: Counter = Counter()
    for name in ("send_msg", "send_obj", "send_frame"):
        orig = getattr(Connection, name)

        def counting(self, *args, __orig=orig, **kwargs):
            counts[self.info.get("peer_id")] += 1
            return __orig(self, *args, **kwargs)
        monkeypatch.setattr(Connection, name, counting)
    return counts


def _members_and_agents(procs):
    rt = client_runtime()
    members = {r.node.node_id for r in procs.records}
    agents = {r.agent.node_id for r in procs.records}
    assert rt.node.node_id not in agents
    return members, agents


def test_one_message_per_host_for_call_broadcast_and_stream(procs, sent):
    mesh = procs.spawn("counted", Recorder)
    mesh.initialized.get(timeout=60)
    members, agents = _members_and_agents(procs)
    assert len(members) == 8 and len(agents) == 2
    mesh.note.call("warm").get(timeout=30)       # connections are up (the agents' too)

    for what, do in [
            ("call", lambda: mesh.note.call("c").get(timeout=30)),
            ("call, not plain", lambda: mesh.note.call("c", data=np.ones(3)).get(timeout=30)),
            ("stream", lambda: [f.get(timeout=30) for f in mesh.note.stream("s")]),
            ("broadcast", lambda: (mesh.note.broadcast("b"),
                                   mesh.note.call("after").get(timeout=30)))]:
        sent.clear()
        do()
        to_members = sum(n for peer, n in sent.items() if peer in members)
        to_agents = {peer: n for peer, n in sent.items() if peer in agents}
        assert to_members == 0, (what, sent)
        # one per host and call (the broadcast and the call after it: two)
        expect = 2 if what == "broadcast" else 1
        assert to_agents == {a: expect for a in agents}, (what, sent)
    results = mesh.array.call(5).get(timeout=30).values()
    assert [list(a) for a in results] == [list(range(5))] * 8
    # a member's exception reaches its own slot, through its agent
    failures = [f.exception() for f in mesh.boom.stream()]
    assert all("boom from a member" in str(e) for e in failures), failures
    mesh.stop().get(timeout=30)


@pytest.mark.parametrize("which,says", [
    ("unreadable", "cannot be unpickled here"), ("lock", "could not be sent")])
def test_a_result_that_cannot_travel_fails_its_slot_only(procs, which, says):
    """The agent passes a member's pickled result on unread: one the controller cannot
    unpickle, or one that never left its member, fails that member's slot alone."""
    mesh = procs.spawn(f"awkward_{which}", Recorder)
    results = list(mesh.awkward.stream(which, 6))
    bad = [f.exception() for f in results if f.exception() is not None]
    assert len(bad) == 1 and says in str(bad[0]), bad
    assert sorted(f.value() for f in results if f.exception() is None) == [1] * 7
    assert mesh.pid.call().get(timeout=30).values()      # all of them go on
    mesh.stop().get(timeout=30)


def test_relay_off_sends_one_message_per_process(procs, sent, monkeypatch):
    monkeypatch.setenv("HPCMESH_RELAY", "0")
    mesh = procs.spawn("direct", Recorder)
    mesh.initialized.get(timeout=60)
    members, agents = _members_and_agents(procs)
    mesh.note.call("warm").get(timeout=30)
    sent.clear()
    mesh.note.call("c").get(timeout=30)
    assert sum(n for peer, n in sent.items() if peer in members) == 8, sent
    assert not any(peer in agents for peer in sent), sent
    mesh.stop().get(timeout=30)


def _interleave(mesh, seed: int, steps: int = 240) -> None:
    """Calls of every kind, to the whole mesh, a host, one member, without waiting for
    most: each member must see its messages in the order they were sent to it."""
    rng = random.Random(seed)
    ext = dict(mesh.extent)
    n = ext["hosts"] * ext["gpus"]
    expected: list[list] = [[] for _ in range(n)]
    pending = []
    for i in range(steps):
        kind = rng.choice(["call", "broadcast", "stream", "one", "one", "host", "host_bc",
                           "wait"])
        h, g = rng.randrange(ext["hosts"]), rng.randrange(ext["gpus"])
        ep = "anote" if rng.random() < 0.3 else "note"
        tag = (i, kind)
        if kind == "call":
            pending.append(getattr(mesh, ep).call(tag))
            targets = range(n)
        elif kind == "broadcast":
            getattr(mesh, ep).broadcast(tag)
            targets = range(n)
        elif kind == "stream":
            pending.extend(getattr(mesh, ep).stream(tag))
            targets = range(n)
        elif kind == "one":
            pending.append(getattr(mesh.slice(hosts=h, gpus=g), ep).call_one(tag))
            targets = [h * ext["gpus"] + g]
        elif kind == "host":
            pending.append(getattr(mesh.slice(hosts=h), ep).call(tag))
            targets = range(h * ext["gpus"], (h + 1) * ext["gpus"])
        elif kind == "host_bc":
            getattr(mesh.slice(hosts=h), ep).broadcast(tag)
            targets = range(h * ext["gpus"], (h + 1) * ext["gpus"])
        else:       # let what is in flight land: the routes change back
            for f in pending:
                f.get(timeout=60)
            pending = []
            continue
        for t in targets:
            expected[t].append(tag)
    for f in pending:
        f.get(timeout=60)
    seen = mesh.log.call().get(timeout=60).values()
    for member, (got, want) in enumerate(zip(seen, expected)):
        assert got == want, f"member {member}: first difference at " \
            f"{next(i for i, (a, b) in enumerate(zip(got + [None], want + [None])) if a != b)}"


def test_order_across_call_one_call_broadcast_and_stream(procs):
    mesh = procs.spawn("ordered", Recorder)
    mesh.initialized.get(timeout=60)
    for seed in range(3):
        _interleave(mesh, seed)
    mesh.stop().get(timeout=30)


def test_order_behind_a_big_direct_message(procs):
    """The routes' two rules where a path is slow: a call() must not overtake a big
    call_one still being read (direct calls in flight keep a member's share direct), nor a
    big broadcast sent straight to a member that had a direct call in flight (its ping
    keeps it direct until the broadcast was read)."""
    mesh = procs.spawn("big", Recorder)
    mesh.initialized.get(timeout=60)
    one = mesh.slice(hosts=1, gpus=2)
    big = b"x" * (64 << 20)
    rounds = 6
    for i in range(rounds):
        first = one.note.call_one(("big call_one", i), data=big)
        after = mesh.note.call(("call", i))
        first.get(timeout=60)
        after.get(timeout=60)

        quick = one.note.call_one(("quick", i))
        one.note.broadcast(("big broadcast", i), data=big)
        quick.get(timeout=60)
        mesh.note.call(("call after", i)).get(timeout=60)
    want = [t for i in range(rounds) for t in (("big call_one", i), ("call", i), ("quick", i),
                                          ("big broadcast", i), ("call after", i))]
    assert mesh.log.call().get(timeout=60).values()[6] == want
    mesh.stop().get(timeout=30)


def test_order_on_the_memory_twin():
    from memory_procs import memory_proc_mesh
    pm = memory_proc_mesh({"hosts": 2, "gpus": 4})
    try:
        mesh = pm.spawn("ordered", Recorder)
        mesh.initialized.get(timeout=30)
        for seed in range(5):
            _interleave(mesh, 100 + seed)
    finally:
        pm.stop().get(timeout=30)


def test_a_settled_host_group_is_only_numbered_until_a_member_changes():
    """A cast that found every member of a host on its agent's route settles the host:
    the next casts only number its members. A direct call_one in flight makes the next
    cast check each member again (that member's share goes straight, behind the call_one),
    and the order holds all along."""
    from hpcmesh.runtime import relay
    from hpcmesh.runtime.peers import PeerTable, changes
    from hpcmesh.runtime.ports import PortTable
    from hpcmesh.runtime.messages import NodeRef
    from memory_procs import memory_proc_mesh
    pm = memory_proc_mesh({"hosts": 2, "gpus": 4})
    try:
        mesh = pm.spawn("settled", Recorder)
        mesh.initialized.get(timeout=30)
        mesh.note.call("a").get(timeout=30)     # checks each member: both hosts settle
        settled = relay.STATS["settled"]
        mesh.note.call("b").get(timeout=30)
        assert relay.STATS["settled"] - settled == 2        # a share per host, unchecked
        one = mesh.slice(hosts=1, gpus=2)
        first = one.note.call_one("c")                      # straight: nothing relayed
        settled = relay.STATS["settled"]
        after = mesh.note.call("d")
        assert relay.STATS["settled"] == settled            # every member checked again
        first.get(timeout=30)
        after.get(timeout=30)
        mesh.note.call("e").get(timeout=30)                 # checks: settles again
        settled = relay.STATS["settled"]
        mesh.note.call("f").get(timeout=30)
        assert relay.STATS["settled"] - settled == 2
        seen = mesh.log.call().get(timeout=30).values()
        assert seen[6] == ["a", "b", "c", "d", "e", "f"]
        assert all(got == ["a", "b", "d", "e", "f"] for i, got in enumerate(seen) if i != 6)
    finally:
        pm.stop().get(timeout=30)

    # what else unsettles a member: its loss, a direct call registered on a port table
    peers, ports = PeerTable(), PortTable()
    p = peers.peer(NodeRef("member", ()))
    before = changes()
    peers.set_lost(p, RuntimeError("gone"))
    ports.expect_reply(p)
    assert changes() == before                  # not in a settled group: nothing to tell
    p.settled, p.lost = True, None
    ports.expect_reply(p)
    assert changes() == before + 1              # a call to a settled member
    peers.set_lost(p, RuntimeError("gone"))
    assert changes() == before + 2


def test_a_member_killed_mid_call_fails_only_its_slot(job):
    procs = job.state(cached_path=None).hosts.spawn_procs({"gpus": 4}, name="killme")
    try:
        mesh = procs.spawn("sleepers", Recorder)
        pids = mesh.pid.call().get(timeout=60).values()
        victim = 5                      # host 1, gpu 1
        stream = mesh.sleep.stream(3.0)
        t0 = time.monotonic()
        os.kill(pids[victim], signal.SIGKILL)
        results = [f for f in stream]
        took = time.monotonic() - t0
        assert took < BOUND_S + MARGIN_S, took
        failed = [f.exception() for f in results if f.exception() is not None]
        assert len(failed) == 1, failed
        assert isinstance(failed[0], SupervisionError) and failed[0].pid == pids[victim], \
            failed[0]
        # named as the direct path names it (the controller's own exit report wins the
        # agent's word of the lost connection)
        assert "hosts=1,gpus=1" in str(failed[0]), failed[0]
        assert sum(1 for f in results if f.exception() is None and f.value() == "woke") == 7
        # a call() over all fails with it; the others go on
        with pytest.raises(SupervisionError):
            mesh.pid.call().get(timeout=BOUND_S + MARGIN_S)
        assert mesh.slice(hosts=1, gpus=2).pid.call_one().get(timeout=30) == pids[6]
        assert mesh.slice(hosts=0).pid.call().get(timeout=30).values() == pids[:4]
    finally:
        procs.stop(grace=0.5).get(timeout=60)


def test_an_agent_killed_fails_its_hosts_slots_with_host_lost():
    job = ProcessJob({"hosts": 2})
    pids: list[int] = []
    try:
        procs = job.state(cached_path=None).hosts.spawn_procs({"gpus": 4}, name="lost")
        mesh = procs.spawn("sleepers", Recorder)
        pids = mesh.pid.call().get(timeout=60).values()
        mesh.note.broadcast("relayed")      # host 1's members now take calls via its agent
        stream = mesh.sleep.stream(3.0)
        t0 = time.monotonic()
        os.kill(job.pids["hosts"][1], signal.SIGKILL)
        early = mesh.slice(hosts=1, gpus=3).pid.call_one()     # the agent is gone already
        results = [f for f in stream]
        took = time.monotonic() - t0
        assert took < BOUND_S + MARGIN_S, took
        errors = [f.exception() for f in results if f.exception() is not None]
        assert len(errors) == 4, errors
        assert all(isinstance(e, SupervisionError) and e.reason == HOST_LOST for e in errors), \
            errors
        assert sorted(e.pid for e in errors) == sorted(pids[4:])
        assert [f.value() for f in results if f.exception() is None] == ["woke"] * 4
        with pytest.raises(SupervisionError):
            early.get(timeout=BOUND_S + MARGIN_S)
        with pytest.raises(SupervisionError) as ei:
            mesh.slice(hosts=1, gpus=0).pid.call_one().get(timeout=BOUND_S + MARGIN_S)
        assert ei.value.reason == HOST_LOST, ei.value
        with pytest.raises(SupervisionError):    # as ever: after the others got theirs
            mesh.note.broadcast("after")
        assert mesh.slice(hosts=0).log.call().get(timeout=30).values() == [
            ["relayed", "after"]] * 4
        # host 0 goes on through its agent; host 1's members fail at once
        assert mesh.slice(hosts=0).pid.call().get(timeout=30).values() == pids[:4]
        with pytest.raises(SupervisionError):
            mesh.pid.call().get(timeout=BOUND_S + MARGIN_S)
    finally:
        job.kill()
        wait_until(lambda: not any(alive(p) for p in pids), 15, "the lost host's processes end")


def test_a_member_that_answered_then_ended_keeps_its_answer(job):
    # its agent holds a lone call()'s answers until the rest are in (cast_relay.HOLD): what
    # the member answered must leave before the agent reports it ended, which fails its slot
    procs = job.state(cached_path=None).hosts.spawn_procs({"gpus": 4}, name="bye")
    try:
        mesh = procs.spawn("bye", Recorder)
        mesh.pid.call().get(timeout=60)
        got = mesh.answer_then_end.call(5, 1.5).get(timeout=BOUND_S + MARGIN_S).values()
        assert got == ["late"] * 5 + ["bye"] + ["late"] * 2, got
    finally:
        procs.stop(grace=0.5).get(timeout=60)


def test_a_member_killed_mid_call_fails_the_call_naming_it_and_not_its_host(job):
    """call() takes one reply port per host (``runtime/host_share.py``): a member killed
    mid-call still fails its own slot within the bound, named as the direct path names it,
    and the rest of its host's share still counts (the next calls to them answer)."""
    procs = job.state(cached_path=None).hosts.spawn_procs({"gpus": 4}, name="sharekill")
    try:
        mesh = procs.spawn("sleepers", Recorder)
        pids = mesh.pid.call().get(timeout=60).values()
        victim = 6                      # host 1, gpu 2
        fut = mesh.sleep.call(3.0)
        t0 = time.monotonic()
        os.kill(pids[victim], signal.SIGKILL)
        with pytest.raises(SupervisionError) as ei:
            fut.get(timeout=BOUND_S + MARGIN_S)
        took = time.monotonic() - t0
        assert took < BOUND_S + MARGIN_S, took
        assert ei.value.pid == pids[victim], ei.value
        assert "hosts=1,gpus=2" in str(ei.value), ei.value
        # its host's other members answered that call (their order counts are settled):
        # every later call to them goes on, relayed or one by one
        assert mesh.slice(hosts=1, gpus=0).log.call_one().get(timeout=30) == []
        assert mesh.slice(hosts=1).slice(gpus=slice(0, 2)).pid.call().get(
            timeout=30).values() == pids[4:6]
        assert mesh.slice(hosts=0).pid.call().get(timeout=30).values() == pids[:4]
    finally:
        procs.stop(grace=0.5).get(timeout=60)


def test_an_agent_killed_mid_call_fails_the_call_with_host_lost_naming_a_member():
    job = ProcessJob({"hosts": 2})
    pids: list[int] = []
    try:
        procs = job.state(cached_path=None).hosts.spawn_procs({"gpus": 4}, name="sharelost")
        mesh = procs.spawn("sleepers", Recorder)
        pids = mesh.pid.call().get(timeout=60).values()
        fut = mesh.sleep.call(3.0)
        t0 = time.monotonic()
        os.kill(job.pids["hosts"][1], signal.SIGKILL)
        with pytest.raises(SupervisionError) as ei:
            fut.get(timeout=BOUND_S + MARGIN_S)
        assert time.monotonic() - t0 < BOUND_S + MARGIN_S
        assert ei.value.reason == HOST_LOST, ei.value
        assert ei.value.pid in pids[4:], ei.value
        # host 0's share of the same call() was answered; it goes on through its agent
        assert mesh.slice(hosts=0).sleep.call(0.0).get(timeout=30).values() == ["woke"] * 4
    finally:
        job.kill()
        wait_until(lambda: not any(alive(p) for p in pids), 15, "the lost host's processes end")
