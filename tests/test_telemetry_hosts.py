"""Telemetry at scale: the controller's collector drains once per host, not per process.

Each host agent drains its processes over their Unix sockets and answers with all their
rows (``HostAgent.telemetry_drain_host``); processes with no such agent are asked one by
one, as before. The rows in the SQL tables are the same either way.
"""

import os
import signal
import time

import pytest
from proc_helpers import wait_until

from hpcmesh.actor import Actor, endpoint
from hpcmesh.job import ProcessJob
from hpcmesh.runtime.observe import telemetry_recorder
from hpcmesh.runtime.client import ProcRecord
from hpcmesh.runtime.future import completed, failed
from hpcmesh.runtime.messages import NodeRef
from hpcmesh.telemetry.collector import Collector
from hpcmesh.telemetry.store import TelemetryStore

DRAINS = ("telemetry_drain", "telemetry_drain_host")


class Ping(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x

    @endpoint
    async def freeze(self, release: str) -> int:
        # blocks this process's event loop (an async endpoint that does not await): no
        # drain is answered until the file is there
        open(f"{release}.{os.getpid()}", "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)    # sleep: the loop is meant to be stuck until the release
        return os.getpid()


@pytest.fixture
def stop_telemetry_after():
    yield
    from hpcmesh.telemetry.server import stop_telemetry
    stop_telemetry()


def _count_drains(node, calls: list):
    """Wrap ``node.rpc`` to note the drain calls the controller makes."""
    orig = node.rpc

    def rpc(ref, service, *args):
        if service in DRAINS:
            calls.append((service, ref.node_id))
        return orig(ref, service, *args)
    node.rpc = rpc
    return lambda: node.__dict__.pop("rpc", None)


def _per_process(state, sql: str) -> dict:
    return {r["process"]: r["n"] for r in state.query_engine.query(sql).to_pylist()}


@pytest.mark.timeout(240)
def test_one_drain_per_host_and_every_process_s_rows_arrive(tmp_path, stop_telemetry_after):
    from hpcmesh.telemetry.server import current_service
    job = ProcessJob({"w": 2}).enable_telemetry()
    state = job.state(cached_path=None)
    try:
        pm = state.w.spawn_procs(per_host={"gpus": 4}, name="tdh")
        m = pm.spawn("tdhm", Ping)
        for i in range(3):
            assert m.ping.call(i).get(timeout=60).values() == [i] * 8
        collector = current_service().collector
        collector.pause()       # no periodic collection: the one below is counted alone
        collector.collect()     # (what the spawn and the calls left)
        for i in range(3):
            m.ping.call(i).get(timeout=60)
        calls: list = []
        store = current_service().store
        batches = {t: len(store.batches(t)) for t in ("messages", "metric_process")}
        restore = _count_drains(collector.rt.node, calls)
        try:
            answered = collector.collect()
        finally:
            restore()
        # and one record batch a table for the whole collection, not one per process
        assert {t: len(store.batches(t)) - n for t, n in batches.items()} == \
            {"messages": 1, "metric_process": 1}
        mine = [rec for rec in collector.rt.procs.values() if rec.mesh_name == "tdh"]
        agents = {rec.agent.node_id for rec in mine}
        assert len(agents) == 2
        # one call per host (its agent), none per process (of this job: the session's
        # earlier tests may have left records of others)
        ours = agents | {rec.node.node_id for rec in mine}
        assert sorted(c for c in calls if c[1] in ours) == \
            sorted(("telemetry_drain_host", a) for a in agents)
        assert answered >= 1 + 2 + 8        # the controller, the agents, the processes
        # every process's rows are in the tables, as when each was asked itself
        names = sorted(rec.name for rec in mine)
        calls_of = _per_process(state, "SELECT process, COUNT(*) AS n FROM messages WHERE "
                                       "endpoint = 'ping' GROUP BY process")
        assert calls_of == {n: 6 for n in names}
        sampled = _per_process(state, "SELECT process, COUNT(*) AS n FROM metric_process "
                                      "GROUP BY process")
        assert set(sampled) >= set(names) | {"client"}
        assert any(p.startswith("agent@") for p in sampled)
        where = {r["process"]: (r["host"], r["pid"]) for r in state.query_engine.query(
            "SELECT DISTINCT process, host, pid FROM messages WHERE endpoint = 'ping'"
        ).to_pylist()}
        assert sorted(pid for _, pid in where.values()) == sorted(pm.pids)
        sent = state.query_engine.query(
            "SELECT SUM(n_dest) AS d FROM sent_messages WHERE endpoint = 'ping'").to_pylist()
        assert sent == [{"d": 48}]

        # a process stuck past the agent's wait: its answer, when it comes, goes with the
        # host's next one (its rows are not lost)
        release = str(tmp_path / "release")
        stuck = m.slice(hosts=1, gpus=3)
        stuck.ping.call_one(99).get(timeout=60)
        everyone = collector.collect()
        frozen = stuck.freeze.call_one(release)
        wait_until(lambda: collector.collect(timeout=0.6) < everyone, 30,
                   "a collection that misses the stuck process")
        open(release, "w").close()
        frozen.get(timeout=60)
        stuck_name = [r.name for r in mine if r.pid == pm.pids[7]][0]
        wait_until(lambda: _per_process(
            state, "SELECT process, COUNT(*) AS n FROM messages WHERE endpoint = 'ping' "
                   "GROUP BY process").get(stuck_name) == 7, 30,
                   "the stuck process's ping in the tables")
        pm.stop().get(timeout=60)
    finally:
        job.kill()


@pytest.mark.timeout(120)
def test_a_process_that_dies_while_its_host_is_drained_does_not_hold_the_answer(tmp_path):
    from hpcmesh.runtime.client import client_runtime
    # the agent waits 60 s for a precise report before it fails what a lost connection
    # leaves pending: only its own news of the exit ends the wait in time
    job = ProcessJob({"w": 1}, env={"HPCMESH_LOST_PEER_WAIT": "60"})
    state = job.state(cached_path=None)
    try:
        pm = state.w.spawn_procs(per_host={"gpus": 2}, name="tdd")
        m = pm.spawn("tddm", Ping)
        m.ping.call(0).get(timeout=60)
        rt = client_runtime()
        recs = {r.pid: r for r in rt.procs.values() if r.mesh_name == "tdd"}
        healthy, victim = recs[pm.pids[0]], recs[pm.pids[1]]
        release = str(tmp_path / "release")
        frozen = m.slice(gpus=1).freeze.call_one(release)
        wait_until(lambda: os.path.exists(f"{release}.{victim.pid}"), 30,
                   "the process's loop is stuck")
        answer = rt.node.rpc(healthy.agent, "telemetry_drain_host",
                             [(r.name, r.node) for r in (healthy, victim)], 30.0)
        os.kill(victim.pid, signal.SIGKILL)
        t0 = time.monotonic()
        res = answer.get(timeout=40)
        took = time.monotonic() - t0
        assert took < 5, f"the host's answer waited {took:.1f} s for a dead process"
        assert {d["who"]["name"] for d in res["drains"]} >= {healthy.name}
        assert victim.name not in {d["who"]["name"] for d in res["drains"]}
        with pytest.raises(Exception):
            frozen.get(timeout=30)
    finally:
        job.kill()


# -- the collector's choice of whom to ask (a runtime of records, no processes) -------------
class _FakeNode:
    """Answers ``rpc`` as a controller's node would get it answered: agents in ``hosts``
    drain their processes, other agents have no such service; processes answer their own."""

    def __init__(self, hosts: set[str], missed: set[str] = frozenset()):
        self.node_id, self.name, self.hosts, self.missed = "me", "client", hosts, missed
        self.calls: list = []

    def peer_connected(self, node_id: str) -> bool:
        return True

    def rpc(self, ref, service, *args):
        self.calls.append((service, ref.node_id))
        if service == "telemetry_drain":
            return completed(_drain(ref.node_id))
        if ref.node_id not in self.hosts:
            return failed(LookupError(f"node {ref.node_id} has no service {service!r}"))
        procs, _timeout = args
        return completed({"drains": [_drain(ref.node_id)] + [
            _drain(r.node_id) for name, r in procs if name not in self.missed],
            "missed": [name for name, _ in procs if name in self.missed]})


def _drain(who: str) -> dict:
    return {"who": {"name": who, "host": "h", "pid": 1},
            "tables": {"events": [(telemetry_recorder.now_us(), "info", who, "hello")]}}


class _FakeRuntime:
    def __init__(self, node: _FakeNode, hosts: dict[str, int]):
        self.node = node
        self.procs = {}
        for agent, n in hosts.items():
            for i in range(n):
                rec = ProcRecord(name=f"{agent}-p{i}", mesh_name="m", point=None,
                                 agent=NodeRef(agent, ()), label=f"{agent}={i}")
                rec.node = NodeRef(f"{agent}-p{i}", ())
                self.procs[rec.name] = rec


@pytest.fixture
def recorder_off_after():
    was = telemetry_recorder.RECORDER
    yield
    if was is None:
        telemetry_recorder.disable()


def _sources(store: TelemetryStore) -> list:
    return sorted(store.table("events").column("process").to_pylist())


def test_agents_without_the_host_drain_and_missed_processes_are_asked_one_by_one(
        recorder_off_after):
    node = _FakeNode(hosts={"a1"}, missed={"a1-p2"})
    store = TelemetryStore()
    collector = Collector(_FakeRuntime(node, {"a1": 3, "mpi": 2}), store)
    assert collector.collect() == 1 + 4 + 2
    # a1 drains its host but for a1-p2 (not its to ask); mpi has no host drain: its
    # processes are asked, and from then on it is not asked for its host again
    assert sorted(node.calls) == sorted([
        ("telemetry_drain_host", "a1"), ("telemetry_drain", "a1-p2"),
        ("telemetry_drain_host", "mpi"), ("telemetry_drain", "mpi-p0"),
        ("telemetry_drain", "mpi-p1")])
    assert _sources(store) == ["a1", "a1-p0", "a1-p1", "a1-p2", "mpi-p0", "mpi-p1"]
    assert len(store.batches("events")) == 1       # one batch for the collection
    node.calls.clear()
    assert collector.collect() == 1 + 4 + 3
    assert sorted(node.calls) == sorted([
        ("telemetry_drain_host", "a1"), ("telemetry_drain", "a1-p2"),
        ("telemetry_drain", "mpi"), ("telemetry_drain", "mpi-p0"),
        ("telemetry_drain", "mpi-p1")])

