"""Casts through a tree of host agents (issue 30; ``runtime/relay.py``): past
``HPCMESH_RELAY_FANOUT`` hosts the sender writes one frame to each head of the tree, the
heads forward to the agents below them, every agent answers the sender. Forced here at
small scale (a width of 2: 4 hosts make heads 0 and 2, host 1 below 0 and host 3 below 2;
8 hosts make a tree three agents deep), on the memory twin and on real processes.

Semantics as the flat relay's: order per (sender, actor) whichever route each message
took, a dead member fails its slot alone, a dead head fails the slots of every member it
relayed for, with HOST_LOST, naming its host."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest
from proc_helpers import alive, wait_until
from test_relay import BOUND_S, MARGIN_S, Recorder, _interleave

from hpcmesh.actor import SupervisionError
from hpcmesh.job import ProcessJob
from hpcmesh.runtime import cast_relay, relay
from hpcmesh.runtime.client import client_runtime
from hpcmesh.runtime.errors import HOST_LOST
from hpcmesh.transport.connection import Connection


@pytest.fixture
def width2(monkeypatch):
    monkeypatch.setenv(relay.FANOUT_VAR, "2")


@pytest.fixture
def controller_sent(monkeypatch):
    """Messages the controller's own node queued, by the peer's node id (its connections
    are the ones on its loop; the memory twin's agents write on theirs)."""
    counts: Counter = Counter()
    loop = client_runtime().node.loop
    for name in ("send_msg", "send_obj", "send_frame"):
        orig = getattr(Connection, name)

        def counting(self, *args, __orig=orig, **kwargs):
            if self.loop is loop:
                counts[self.info.get("peer_id")] += 1
            return __orig(self, *args, **kwargs)
        monkeypatch.setattr(Connection, name, counting)
    return counts


def _memory_mesh(hosts: int, gpus: int, name: str):
    from memory_procs import memory_proc_mesh
    pm = memory_proc_mesh({"hosts": hosts, "gpus": gpus})
    mesh = pm.spawn(name, Recorder)
    mesh.initialized.get(timeout=30)
    return pm, mesh


def _agents(pm) -> list[str]:
    """Each host's agent node id, in host order."""
    ids = []
    for r in pm.records:
        if r.agent.node_id not in ids:
            ids.append(r.agent.node_id)
    return ids


def _settle(stream, t0: float, failed: int) -> list:
    """Every answer of ``stream`` within the bound (SPEC §3): ``failed`` of them fail with
    HOST_LOST, the others woke. The failures (a stream yields in the order answers come)."""
    results = [f for f in stream]
    took = time.monotonic() - t0
    assert took < BOUND_S + MARGIN_S, took
    errors = [f.exception() for f in results if f.exception() is not None]
    assert len(errors) == failed and all(
        isinstance(e, SupervisionError) and e.reason == HOST_LOST for e in errors), errors
    assert all(f.value() == "woke" for f in results if f.exception() is None)
    return errors


def test_the_sender_writes_only_to_the_heads(width2, controller_sent):
    pm, mesh = _memory_mesh(4, 2, "heads")
    try:
        agents = _agents(pm)
        members = {r.node.node_id for r in pm.records}
        mesh.note.call("warm").get(timeout=30)
        for what, do in [
                ("call", lambda: mesh.note.call("c").get(timeout=30).values()),
                ("stream", lambda: [f.get(timeout=30) for f in mesh.note.stream("s")]),
                ("broadcast", lambda: (mesh.note.broadcast("b"),
                                       mesh.note.call("after").get(timeout=30)))]:
            controller_sent.clear()
            forwards = relay.STATS["forwards"]
            do()
            assert not any(p in members for p in controller_sent), (what, controller_sent)
            expect = 2 if what == "broadcast" else 1
            assert {p: n for p, n in controller_sent.items() if p in agents} == \
                {agents[0]: expect, agents[2]: expect}, (what, controller_sent)
            # each head forwarded to its one child, per cast
            assert relay.STATS["forwards"] - forwards == 2 * expect, what
        assert mesh.log.call().get(timeout=30).values() == [
            ["warm", "c", "s", "b", "after"]] * 8
        failures = [f.exception() for f in mesh.boom.stream()]
        assert all("boom from a member" in str(e) for e in failures), failures
    finally:
        pm.stop().get(timeout=30)


def test_order_through_a_tree_three_agents_deep(width2):
    """Whole-mesh casts through the tree, one host's through its agent alone, call_one
    straight: each member still sees its messages in send order."""
    pm, mesh = _memory_mesh(8, 2, "deep")
    try:
        # heads 0 and 4; 0 forwards to 1 and 2, 2 to 3 (and 4 to 5 and 6, 6 to 7)
        before = dict(relay.STATS)
        mesh.note.call("warm").get(timeout=30)
        assert relay.STATS["casts_sent"] - before["casts_sent"] == 2
        assert relay.STATS["forwards"] - before["forwards"] == 6
        mesh.log.call().get(timeout=30)         # (forgets "warm")
        for seed in range(4):
            _interleave(mesh, 200 + seed)
    finally:
        pm.stop().get(timeout=30)


def test_a_lost_head_fails_its_subtree_with_host_lost(width2):
    """Host 0's agent heads hosts 0 and 1: lost mid-call, it fails both hosts' slots; host
    1's members stay failed (a broadcast it held may never have reached them)."""
    pm, mesh = _memory_mesh(4, 2, "headless")
    try:
        head = pm.agent_nodes[0]
        assert head.node_id == _agents(pm)[0]
        mesh.note.broadcast("relayed")          # every member is now behind the tree
        stream = mesh.sleep.stream(2.0)
        t0 = time.monotonic()
        head.shutdown_thread()
        errors = _settle(stream, t0, 4)
        relayed = [e for e in errors if "relayed through the host agent" in str(e)]
        assert len(relayed) == 2 and all("agent0" in str(e) for e in relayed), errors
        with pytest.raises(SupervisionError) as ei:
            mesh.slice(hosts=1, gpus=1).note.call_one("one").get(timeout=30)
        assert ei.value.reason == HOST_LOST and "agent0" in str(ei.value), ei.value
        # hosts 2 and 3 go on, through the other head
        assert mesh.slice(hosts=slice(2, 4)).log.call().get(timeout=30).values() == [
            ["relayed"]] * 4
    finally:
        pm.stop().get(timeout=30)


def test_a_lost_agent_inside_the_tree_fails_the_hosts_below_it(width2):
    """8 hosts: host 2's agent is below head 0 and above host 3. Lost mid-call, it fails
    hosts 2 and 3's slots, HOST_LOST naming it; every other host answers."""
    pm, mesh = _memory_mesh(8, 2, "middle")
    try:
        stream = mesh.sleep.stream(2.0)
        t0 = time.monotonic()
        pm.agent_nodes[2].shutdown_thread()
        errors = _settle(stream, t0, 4)
        assert all("agent2" in str(e) for e in errors), errors
        assert sorted(e.point.rank for e in errors) == [4, 5, 6, 7], errors
    finally:
        pm.stop().get(timeout=30)


def test_a_lost_head_with_nothing_in_flight_leaves_its_subtree_working(width2):
    pm, mesh = _memory_mesh(4, 2, "idle")
    try:
        mesh.note.broadcast("relayed")
        assert mesh.note.call("answered").get(timeout=30).values() == [2] * 8
        pm.agent_nodes[0].shutdown_thread()
        # A real process ends with its agent; a member of the memory twin lives on, so a
        # call sent straight before the controller judged the host lost (its probe of the
        # agent failing) could reach it and be answered: wait for the judgement.
        lost = [r for r in pm.records if r.agent.node_id == _agents(pm)[0]]
        wait_until(lambda: all(r.failure is not None for r in lost), BOUND_S + MARGIN_S,
                   "host 0 judged lost")
        with pytest.raises(SupervisionError) as ei:     # host 0's members are lost
            mesh.slice(hosts=0).note.call("x").get(timeout=BOUND_S + MARGIN_S)
        assert ei.value.reason == HOST_LOST, ei.value
        # host 1's answered everything relayed: they go on, their own agent relaying
        # what the lost head would have (the others get theirs, the lost ones fail)
        with pytest.raises(SupervisionError):
            mesh.note.broadcast("everyone")
        rest = mesh.slice(hosts=slice(1, 4))
        assert rest.note.call("after").get(timeout=30).values() == [4] * 6
        assert mesh.slice(hosts=1, gpus=1).note.call_one("one").get(timeout=30) == 5
        seen = ["relayed", "answered", "everyone", "after"]
        assert rest.log.call().get(timeout=30).values() == \
            [seen, seen + ["one"]] + [seen] * 4
    finally:
        pm.stop().get(timeout=30)


def test_real_processes_an_answer_from_below_a_head_outruns_its_member_s_end(width2):
    """A member below a head (host 1, under host 0's agent) answers and ends: its answer
    goes up the tree, where the head may hold it (a lone call()), while its exit report
    goes to the controller straight; the controller waits for the answer before it fails
    the slot."""
    job = ProcessJob({"hosts": 4})
    try:
        procs = job.state(cached_path=None).hosts.spawn_procs({"gpus": 2}, name="treebye")
        mesh = procs.spawn("bye", Recorder)
        mesh.pid.call().get(timeout=60)
        got = mesh.answer_then_end.call(2, 1.5).get(timeout=BOUND_S + MARGIN_S).values()
        assert got == ["late"] * 2 + ["bye"] + ["late"] * 5, got
    finally:
        job.kill()


def test_real_processes_a_killed_head_fails_its_subtree(width2, controller_sent):
    """ProcessJob: 4 hosts of 2; the sender writes to the two heads only; the agent of
    host 0 killed mid-call fails hosts 0 and 1's slots with HOST_LOST; hosts 2 and 3
    answer; nothing is left running."""
    job = ProcessJob({"hosts": 4})
    pids: list[int] = []
    try:
        procs = job.state(cached_path=None).hosts.spawn_procs({"gpus": 2}, name="tree")
        mesh = procs.spawn("sleepers", Recorder)
        pids = mesh.pid.call().get(timeout=60).values()
        agents = _agents(procs)
        members = {r.node.node_id for r in procs.records}
        controller_sent.clear()
        mesh.note.broadcast("relayed")
        stream = mesh.sleep.stream(3.0)
        assert not any(p in members for p in controller_sent), controller_sent
        assert {p: n for p, n in controller_sent.items() if p in agents} == \
            {agents[0]: 2, agents[2]: 2}, controller_sent
        t0 = time.monotonic()
        os.kill(job.pids["hosts"][0], signal.SIGKILL)
        errors = _settle(stream, t0, 4)
        assert sum("relayed through the host agent" in str(e) for e in errors) == 2, errors
        with pytest.raises(SupervisionError) as ei:     # what reached them is not known
            mesh.slice(hosts=1).log.call().get(timeout=30)
        assert ei.value.reason == HOST_LOST, ei.value
        assert mesh.slice(hosts=slice(2, 4)).pid.call().get(timeout=30).values() == pids[4:]
    finally:
        job.kill()
        wait_until(lambda: not any(alive(p) for p in pids), 15, "the processes end")


def test_a_member_moved_off_the_tree_is_relayed_by_its_own_agent_alone(width2):
    """A member the tree relayed, once answered, taken by a cast of one host's view (flat,
    through its own agent): what follows it there goes through that agent alone, not down
    the tree's route again."""
    pm, mesh = _memory_mesh(4, 2, "moved")
    try:
        mesh.note.call("tree").get(timeout=30)          # through head 0, then agent 1
        one = mesh.slice(hosts=1)
        one.note.broadcast("flat")                      # agent 1 alone: relayed there
        forwards = relay.STATS["forwards"]
        assert mesh.slice(hosts=1, gpus=0).note.call_one("after").get(timeout=30) == 3
        assert relay.STATS["forwards"] == forwards
    finally:
        pm.stop().get(timeout=30)


def test_a_lost_head_fails_a_call_over_its_subtree_and_not_the_rest(width2):
    """call() takes one reply port per host share (``runtime/host_share.py``), held by the
    head too: the head lost mid-call fails the call with HOST_LOST within the bound; the
    other head's hosts answered theirs and go on."""
    pm, mesh = _memory_mesh(4, 2, "headcall")
    try:
        mesh.note.broadcast("relayed")
        fut = mesh.sleep.call(2.0)
        t0 = time.monotonic()
        pm.agent_nodes[0].shutdown_thread()
        with pytest.raises(SupervisionError) as ei:
            fut.get(timeout=BOUND_S + MARGIN_S)
        assert time.monotonic() - t0 < BOUND_S + MARGIN_S
        assert ei.value.reason == HOST_LOST and ei.value.point.rank in (0, 1, 2, 3), ei.value
        assert mesh.slice(hosts=slice(2, 4)).log.call().get(timeout=30).values() == [
            ["relayed"]] * 4
    finally:
        pm.stop().get(timeout=30)


@pytest.mark.parametrize("hosts", [4, 8])
def test_answers_fold_up_the_tree_the_sender_reads_a_frame_per_head(width2, monkeypatch,
                                                                   hosts):
    """Every agent's answers go up to the agent that forwarded it the cast, which folds
    them with its own: a call() over 4 or 8 hosts (2 heads; 8 hosts: three agents deep)
    costs the sender two frames to read, not one per host. (The fold window is made long
    here so that no head lets its answers leave before those from below are in.)"""
    for name in ("FOLD_WINDOW", "FOLD_BELOW", "HOLD"):
        monkeypatch.setattr(cast_relay, name, 5.0)
    pm, mesh = _memory_mesh(hosts, 2, f"fold{hosts}")
    try:
        mesh.note.call("warm").get(timeout=30)
        for what, do in [
                ("call", lambda: mesh.note.call("c").get(timeout=30).values()),
                ("stream", lambda: [f.get(timeout=30) for f in mesh.note.stream("s")])]:
            before = dict(relay.STATS)
            answers = do()
            assert len(answers) == 2 * hosts, what
            assert relay.STATS["replies_taken"] - before["replies_taken"] == 2, what
            # every agent but the heads passed its answers up, once
            assert relay.STATS["ups"] - before["ups"] == hosts - 2, what
        assert mesh.log.call().get(timeout=30).values() == [["warm", "c", "s"]] * (2 * hosts)
    finally:
        pm.stop().get(timeout=30)
