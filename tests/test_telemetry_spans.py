"""Spans (``hpcmesh.telemetry.span``, the ``spans`` table): the API on its own, then real
actor processes whose sync and async endpoints open spans, the controller's own spans and
the runtime's (spawning and stopping meshes), read back with SQL."""

import asyncio
import json
import os
import re
import threading
import time

import pytest
from test_imports import _modules_after
from test_telemetry import rows, stop_telemetry_after, telemetry_state  # noqa: F401

from hpcmesh.actor import Actor, endpoint
from hpcmesh.job import LocalJob
from hpcmesh.runtime.observe import telemetry_recorder
from hpcmesh.runtime.observe.telemetry_recorder import Recorder
from hpcmesh.telemetry import span
from hpcmesh.telemetry.schema import TABLES

#: the columns a process records (the collector adds process, host, pid)
RECORDED = [c[0] for c in TABLES["spans"].columns]
SLEEP = 0.05


@pytest.fixture
def recorder(monkeypatch):
    """Telemetry on in this process alone: spans go into a fresh Recorder."""
    rec = Recorder(max_rows=1000)
    monkeypatch.setattr(telemetry_recorder, "RECORDER", rec)
    return rec


def drained(rec: Recorder) -> dict[str, dict]:
    """The spans recorded so far, by name, as dicts of the table's columns."""
    return {r[3]: dict(zip(RECORDED, r)) for r in rec.drain()["tables"]["spans"]}


# -- the API, in this process --------------------------------------------------------------
@span()
def decorated_sync(x):
    with span("inside_sync", x=x):
        return x * 2


@span("named_async", kind="async")
async def decorated_async(x):
    async with span("inside_async"):
        await asyncio.sleep(0)
        child = asyncio.create_task(in_a_task())    # a task started inside: a child
        await child
    return x + 1


async def in_a_task():
    with span():        # named after the function it is in
        pass


def test_spans_nest_across_tasks_and_decorators_and_threads_start_at_the_top(recorder):
    with span("top", step=3, obj=object(), seq=(1, 2)) as top:
        top_id = top.span_id
        assert decorated_sync(4) == 8
        assert asyncio.run(decorated_async(1)) == 2
        t = threading.Thread(target=decorated_sync, args=(5,))
        t.start()
        t.join()
    assert top.span_id == top_id        # (ended: still readable)
    got = {}
    for r in recorder.drain()["tables"]["spans"]:
        got.setdefault(r[3], []).append(dict(zip(RECORDED, r)))
    (t_row,) = got["top"]
    assert t_row["span_id"] == top_id and t_row["parent_span_id"] is None
    assert re.fullmatch(rf"{os.getpid()}-[0-9a-f]{{8}}-\d+", top_id)
    attrs = json.loads(t_row["attributes_json"])
    assert attrs["step"] == 3 and attrs["seq"] == [1, 2] and attrs["obj"].startswith("<object")
    in_main, in_thread = sorted(got["decorated_sync"], key=lambda r: r["timestamp_us"])
    assert in_main["parent_span_id"] == top_id and in_thread["parent_span_id"] is None
    inner = {r["parent_span_id"]: r for r in got["inside_sync"]}
    assert set(inner) == {in_main["span_id"], in_thread["span_id"]}
    assert json.loads(inner[in_thread["span_id"]]["attributes_json"]) == {"x": 5}
    (a,) = got["named_async"]
    assert a["parent_span_id"] == top_id and json.loads(a["attributes_json"]) == {
        "kind": "async"}
    assert got["inside_async"][0]["parent_span_id"] == a["span_id"]
    assert got["in_a_task"][0]["parent_span_id"] == got["inside_async"][0]["span_id"]
    ids = [r["span_id"] for rs in got.values() for r in rs]
    assert len(ids) == len(set(ids)) == 8
    assert all(r["status"] == "ok" and r["error"] is None and r["actor_id"] is None
               for rs in got.values() for r in rs)


def test_an_exception_ends_the_span_as_an_error_and_goes_on(recorder):
    with pytest.raises(KeyError):
        with span("raising"):
            raise KeyError("no such key")

    @span
    async def failing():
        raise RuntimeError("async failure")
    with pytest.raises(RuntimeError, match="async failure"):
        asyncio.run(failing())
    got = drained(recorder)
    assert (got["raising"]["status"], got["raising"]["error"]) == ("error",
                                                                   "KeyError: 'no such key'")
    name = "test_an_exception_ends_the_span_as_an_error_and_goes_on.<locals>.failing"
    assert got[name]["error"] == "RuntimeError: async failure"


def test_a_span_object_reentered_as_in_recursion_records_each_level(recorder):
    level = span("level")

    def recurse(n):
        with level:
            if n:
                recurse(n - 1)
    recurse(2)
    parents = {r[1]: r[2] for r in recorder.drain()["tables"]["spans"]}   # id: parent's
    assert len(parents) == 3 and list(parents.values()).count(None) == 1
    assert {p for p in parents.values() if p is not None} < set(parents)  # a chain of 3


def test_generators_are_refused_and_a_name_must_be_a_string():
    def gen():
        yield 1
    with pytest.raises(TypeError, match="generators"):
        span("g")(gen)
    with pytest.raises(TypeError, match="takes a name"):
        span(3)


def test_with_telemetry_off_a_span_records_nothing_and_works():
    assert telemetry_recorder.RECORDER is None
    with span("off", step=1) as s:
        assert s.span_id is None
    assert decorated_sync(2) == 4 and asyncio.run(decorated_async(2)) == 3
    with pytest.raises(ValueError):
        with span("off"):
            raise ValueError("still raised")


def test_the_span_api_loads_no_query_engine_and_no_torch():
    mods = _modules_after("from hpcmesh.telemetry import span")
    assert not {m.partition(".")[0] for m in mods} & {"pyarrow", "datafusion", "torch"}


# -- real processes ------------------------------------------------------------------------
async def _child_of_the_endpoint() -> None:
    with span("in_task"):
        await asyncio.sleep(0)


class Spanner(Actor):
    @endpoint
    def sync_work(self, step: int) -> str:
        with span("sync_outer", step=step) as outer:
            with span("sync_inner"):
                time.sleep(SLEEP)       # sleep: a span that lasts this long
        return outer.span_id

    @endpoint
    async def async_work(self) -> None:
        async with span("async_outer"):
            with span("async_inner"):
                await asyncio.sleep(SLEEP)      # sleep: a span that lasts this long
            await asyncio.create_task(_child_of_the_endpoint())

    @endpoint
    @span()
    def decorated(self) -> int:
        return 7

    @endpoint
    def failing(self) -> None:
        with span("failing_span"):
            raise ValueError("span boom")

    @endpoint
    def recording(self) -> bool:
        return telemetry_recorder.RECORDER is not None


def test_spans_of_endpoints_the_controller_and_the_runtime_come_back_from_sql(
        stop_telemetry_after):  # noqa: F811
    state = telemetry_state()
    with span("setup", job="spans") as setup:
        pm = state.hosts.spawn_procs(per_host={"gpus": 2}, name="spanprocs")
        sp = pm.spawn("spanner", Spanner)
        sp.initialized.get(timeout=60)
    try:
        one = sp.slice(gpus=1)
        outer_id = one.sync_work.call_one(3).get(timeout=60)
        one.async_work.call_one().get(timeout=60)
        assert one.decorated.call_one().get(timeout=60) == 7
        with pytest.raises(Exception, match="span boom"):
            one.failing.call_one().get(timeout=60)
        got = {r["name"]: r for r in rows(state, """
            SELECT s.*, a.full_name FROM spans s LEFT JOIN actors a ON s.actor_id = a.id
            WHERE s.name NOT LIKE 'hpcmesh.%'""")}
        actor_spans = ("sync_outer", "sync_inner", "async_outer", "async_inner", "in_task",
                       "Spanner.decorated", "failing_span")
        assert set(got) == {"setup", *actor_spans}, sorted(got)
        for name in actor_spans:    # the actor that ran them, in its own process
            assert got[name]["full_name"] == "spanner[1]" and got[name]["pid"] == pm.pids[1]
        assert got["sync_outer"]["span_id"] == outer_id
        for child, parent in (("sync_inner", "sync_outer"), ("async_inner", "async_outer"),
                              ("in_task", "async_outer")):
            assert got[child]["parent_span_id"] == got[parent]["span_id"], child
        for name in ("sync_inner", "async_inner"):
            assert got[name]["duration_us"] >= SLEEP * 1e6, got[name]
            parent = got[name.replace("inner", "outer")]
            assert parent["duration_us"] >= got[name]["duration_us"]
            assert parent["timestamp_us"] <= got[name]["timestamp_us"]
        assert {got[n]["endpoint"] for n in ("sync_outer", "sync_inner")} == {"sync_work"}
        assert {got[n]["endpoint"] for n in ("async_outer", "async_inner", "in_task")} == {
            "async_work"}
        assert got["Spanner.decorated"]["endpoint"] == "decorated"
        assert json.loads(got["sync_outer"]["attributes_json"]) == {"step": 3}
        f = got["failing_span"]
        assert (f["status"], f["error"], f["endpoint"]) == ("error", "ValueError: span boom",
                                                            "failing")
        s = got["setup"]        # the controller's
        assert (s["span_id"], s["process"], s["actor_id"], s["parent_span_id"]) == (
            setup.span_id, "client", None, None)
        assert s["span_id"].split("-")[:2] != outer_id.split("-")[:2]
        assert json.loads(s["attributes_json"]) == {"job": "spans"}
    finally:
        pm.stop().get(timeout=30)
    deadline = time.monotonic() + 10
    runtime: list = []
    while time.monotonic() < deadline and len(runtime) < 3:   # the stop's ends as it settles
        runtime = rows(state, "SELECT name, parent_span_id, duration_us, status, "
                              "attributes_json, process FROM spans WHERE name IN "
                              "('hpcmesh.spawn_procs', 'hpcmesh.spawn_actors', 'hpcmesh.stop')"
                              " AND attributes_json LIKE '%span%' ORDER BY timestamp_us")
        time.sleep(0.05)
    assert [r["name"] for r in runtime] == ["hpcmesh.spawn_procs", "hpcmesh.spawn_actors",
                                           "hpcmesh.stop"], runtime
    procs, actors, stop = runtime
    assert all(r["status"] == "ok" and r["process"] == "client" and r["duration_us"] > 0
               for r in runtime)
    assert procs["parent_span_id"] == actors["parent_span_id"] == s["span_id"]
    assert stop["parent_span_id"] is None
    assert json.loads(procs["attributes_json"]) == {"mesh": "spanprocs", "extent": {"gpus": 2},
                                                    "host_mesh": state.hosts.name}
    a = json.loads(actors["attributes_json"])
    assert (a["mesh"], a["actor_class"], a["proc_mesh"]) == ("spanner", "Spanner", "spanprocs")
    assert json.loads(stop["attributes_json"]) == {"mesh": "spanprocs", "extent": {"gpus": 2}}


def test_with_telemetry_off_spans_in_an_actor_work_and_record_nothing():
    assert telemetry_recorder.RECORDER is None
    state = LocalJob(hosts=("hosts",)).state(cached_path=None)
    pm = state.hosts.spawn_procs(per_host={"gpus": 1}, name="spansoff")
    try:
        sp = pm.spawn("spanner_off", Spanner)
        assert sp.recording.call_one().get(timeout=60) is False
        assert sp.sync_work.call_one(1).get(timeout=60) is None    # no id: not recorded
        sp.async_work.call_one().get(timeout=60)
        assert sp.decorated.call_one().get(timeout=60) == 7
        with pytest.raises(Exception, match="span boom"):
            sp.failing.call_one().get(timeout=60)
        assert telemetry_recorder.RECORDER is None
    finally:
        pm.stop().get(timeout=30)


# -- review findings ------------------------------------------------------------------------
class LocalWorker(Actor):
    @endpoint
    def sync_step(self, i: int) -> None:
        with span("sync_in_actor", i=i):
            helper(i)

    @endpoint
    async def async_step(self, i: int) -> None:
        with span("async_in_actor", i=i):
            await asyncio.sleep(0)


@span()
def helper(i: int) -> int:
    return i


def test_an_actor_span_never_takes_an_ended_or_a_callers_span_as_parent(recorder):
    # asyncio copies a context into what it schedules: the mailbox task of an actor first
    # called inside the controller's span kept that span as every later span's parent
    # (review). And a decorated helper an endpoint calls is labelled with that endpoint.
    from hpcmesh.actor import this_proc
    mesh = this_proc().spawn("span_parents", LocalWorker)
    try:
        with span("setup"):
            mesh.sync_step.call_one(0).get(timeout=10)
            mesh.async_step.call_one(0).get(timeout=10)
        for i in (1, 2):
            mesh.sync_step.call_one(i).get(timeout=10)
            mesh.async_step.call_one(i).get(timeout=10)
        got = [dict(zip(RECORDED, r)) for r in recorder.drain()["tables"]["spans"]]
    finally:
        mesh.stop().get(timeout=10)
    by_id = {r["span_id"]: r for r in got}
    in_actor = [r for r in got if r["name"] != "setup" and not r["name"].startswith("hpcmesh.")]
    assert len(in_actor) == 9                   # 3 x (sync, its helper, async)
    for r in in_actor:
        parent = by_id.get(r["parent_span_id"])
        assert parent is None or parent["name"] == "sync_in_actor", (r, parent)
    helpers = [r for r in in_actor if r["name"] == "helper"]
    assert [r["endpoint"] for r in helpers] == ["sync_step"] * 3


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("str failed")


class BadRepr:
    def __repr__(self):
        raise RuntimeError("repr failed")


def test_a_span_never_raises_into_the_code_it_measures(recorder):
    with span("bad_attribute", value=BadRepr()):
        pass
    with pytest.raises(Unprintable):        # the user's own exception, not span's
        with span("bad_exception"):
            raise Unprintable()
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with span("too_deep", value=deep):
        pass
    got = drained(recorder)
    assert "repr raised" in got["bad_attribute"]["attributes_json"]
    assert got["bad_exception"]["status"] == "error"
    assert got["bad_exception"]["error"].startswith("Unprintable")
    assert set(got) == {"bad_attribute", "bad_exception", "too_deep"}
