"""Stragglers and hangs, named (SPEC §12; issue 31 item 3): real local processes, a real
controller watch, the log warning, the ``stragglers`` telemetry table and the admin tree.

The watch runs with small thresholds here (``Settings(after_s=1, tick_s=0.1)``); every
wait is on a condition with a deadline. ``HPCMESH_TEST_STRAGGLER_PROCS=64`` runs the
grouping test over 64 processes (60 + 4) instead of 16 (12 + 4).
"""

import contextlib
import json
import logging
import os
import threading
import time

import pytest
from proc_helpers import wait_until

from hpcmesh.actor import Actor, current_rank, endpoint
from hpcmesh.admin.server import admin_endpoint, stop_admin
from hpcmesh.admin.top import process_rows
from hpcmesh.job import LocalJob
from hpcmesh.runtime.client import client_runtime
from hpcmesh.runtime.observe.introspect import find_pyspy
from hpcmesh.runtime.observe import stragglers
from hpcmesh.runtime.observe.stragglers import (Frame, Laggard, Settings, ThreadStack,
                                                group_by_stack, headline, parse_dump,
                                                parse_traceback)
from hpcmesh.telemetry import TelemetryConfig

#: Where the actors' code is, as their stacks name it: this module travels by value (it is
#: not importable in an actor process), so its frames have no file of their own.
HERE = "<dynamic-code>"


def blocked_in_step(ev: threading.Event) -> None:
    ev.wait(120)


def blocked_in_loader(ev: threading.Event) -> None:
    ev.wait(120)


def blocked_in_the_loop(release: str) -> None:
    """Holds the event loop (called from an async endpoint) until ``release`` exists."""
    ev = threading.Event()
    deadline = time.monotonic() + 120
    while not os.path.exists(release) and time.monotonic() < deadline:
        ev.wait(0.05)


class Stepper(Actor):
    def __init__(self):
        self.release = threading.Event()

    @endpoint
    def step(self, in_step: list, in_loader: list = ()) -> int:
        """Answers at once, but for the ranks named: those wait until released."""
        rank = current_rank().rank
        if rank in in_step:
            blocked_in_step(self.release)
        elif rank in in_loader:
            blocked_in_loader(self.release)
        return rank

    @endpoint
    async def step_async(self, in_loop: list, release: str) -> int:
        """As step, but the ranks named hold the event loop: their stacks come from
        outside (py-spy, else faulthandler, through the host agent)."""
        rank = current_rank().rank
        if rank in in_loop:
            blocked_in_the_loop(release)
        return rank

    @endpoint
    def work(self, seconds: list) -> int:
        rank = current_rank().rank
        time.sleep(seconds[rank])       # sleep: the endpoint's work, slow on purpose
        return rank

    @endpoint
    def step_or_raise(self, in_step: list) -> int:
        """The ranks named wait as in step; the others raise."""
        rank = current_rank().rank
        if rank not in in_step:
            raise ValueError(f"rank {rank} raised")
        blocked_in_step(self.release)
        return rank

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint(concurrent=True)
    async def let_go(self) -> None:
        """Wake the waiting call; the next one waits again."""
        self.release, ev = threading.Event(), self.release
        ev.set()


class Reports(logging.Handler):
    """The straggler warnings, as they are logged."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.texts: list[str] = []

    def emit(self, record):
        self.texts.append(record.getMessage())


@pytest.fixture
def watch():
    """The controller's watch with small thresholds; the warnings it logs."""
    with _watching(Settings(factor=3, after_s=1.0, hang_s=3.0, tick_s=0.1)) as got:
        yield got


@contextlib.contextmanager
def _watching(settings: Settings | None):
    """The controller's watch (``settings``, else as the environment says) and the
    warnings it logs; then the watch as the environment says again."""
    rt = client_runtime()
    w = stragglers.start(rt, settings)
    handler = Reports()
    logger = logging.getLogger("hpcmesh.stragglers")
    logger.addHandler(handler)
    try:
        yield w, handler
    finally:
        logger.removeHandler(handler)
        stragglers.start(rt)        # as the environment says again
        stop_admin()
        from hpcmesh.telemetry.server import stop_telemetry
        stop_telemetry()


def _release(mesh) -> None:
    mesh.let_go.call().get(timeout=60)


# -- pure: the parsers and the grouping -------------------------------------------------------
PYSPY = """Process 123: python -m hpcmesh.runtime.proc
Python v3.11.7 (/usr/bin/python3.11)

Thread 123 (idle): "MainThread"
    select (selectors.py:468)
    _run_once (asyncio/base_events.py:1898)
Thread 130 (idle): "actor-Stepper"
    wait (threading.py:327)
    wait (threading.py:629)
    blocked_in_step (/home/u/train.py:57)
    step (/home/u/train.py:80)
    run (hpcmesh/runtime/actor_host.py:90)
    run (threading.py:982)
"""
FAULTHANDLER = """Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/home/u/train.py", line 57 in blocked_in_step
  File "/home/u/train.py", line 80 in step

Current thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/selectors.py", line 468 in select
"""


def test_the_three_stack_formats_parse_to_the_same_user_frames():
    spy = parse_dump(PYSPY)
    assert [t.name for t in spy] == ["MainThread", "actor-Stepper"]
    assert [f.func for f in spy[1].frames][-3:] == ["blocked_in_step", "wait", "wait"]
    fh = parse_dump(FAULTHANDLER)
    assert [f.func for f in fh[0].frames] == ["step", "blocked_in_step", "wait"]
    tb = parse_traceback('  File "/home/u/train.py", line 80, in step\n    blocked_in_step(ev)\n'
                         '  File "/home/u/train.py", line 57, in blocked_in_step\n'
                         '    ev.wait(120)\n')
    assert tb[-1] == Frame("/home/u/train.py", 57, "blocked_in_step", "ev.wait(120)")
    assert headline(spy[1].frames) == "wait at train.py:57 (in blocked_in_step)"


def test_sixty_and_four_alike_stacks_are_two_groups_whichever_source_read_them():
    def lag(i, text, parse):
        threads = parse(text) if parse is parse_dump else \
            [ThreadStack("actor-Stepper", parse(text))]
        return Laggard(i, f"gpus={i}", f"p-{i}", "h", 1000 + i, 5.0, "x", threads)
    tb_step = ('  File "/home/u/train.py", line 80, in step\n    x\n'
               '  File "/home/u/train.py", line 57, in blocked_in_step\n    ev.wait(120)\n'
               f'  File "{threading.__file__}", line 629, in wait\n    x\n'
               f'  File "{threading.__file__}", line 327, in wait\n    x\n')
    tb_loader = tb_step.replace("line 57, in blocked_in_step", "line 12, in next_batch")
    laggards = [lag(i, PYSPY if i % 2 else tb_step, parse_dump if i % 2 else parse_traceback)
                for i in range(60)]
    laggards += [lag(60 + i, tb_loader, parse_traceback) for i in range(4)]
    laggards.append(Laggard(99, "gpus=99", "p-99", "h", None, 5.0, error="no answer"))
    groups = group_by_stack(laggards)
    assert [(len(g.members), g.headline) for g in groups] == [
        (60, "wait at train.py:57 (in blocked_in_step)"),
        (4, "wait at train.py:12 (in next_batch)"),
        (1, "no stacks: no answer")]


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="HPCMESH_STRAGGLER_AFTER_S"):
        Settings.from_env({"HPCMESH_STRAGGLER_AFTER_S": "soon"})
    with pytest.raises(ValueError, match="HPCMESH_STRAGGLERS must be 1 or 0"):
        Settings.from_env({"HPCMESH_STRAGGLERS": "maybe"})
    assert Settings.from_env({}) == Settings()
    assert not Settings.from_env({"HPCMESH_STRAGGLERS": "0"}).enabled
    assert Settings.from_env({"HPCMESH_HANG_AFTER_S": "inf"}).hang_s == float("inf")
    with pytest.raises(ValueError, match="HPCMESH_STRAGGLER_AFTER_S .* and finite"):
        Settings.from_env({"HPCMESH_STRAGGLER_AFTER_S": "inf"})
    # configure() takes them as the watch reads them
    from hpcmesh.config import KEYS
    assert KEYS["hang_after_s"].check(float("inf")) == "inf"
    with pytest.raises(ValueError, match="configure.straggler_tick_s=0"):
        KEYS["straggler_tick_s"].check(0)


# -- real processes ------------------------------------------------------------------------------
def test_one_blocked_actor_of_eight_is_named_with_its_point_host_pid_and_stack(watch):
    w, reports = watch
    job = LocalJob(hosts=("hosts",)).enable_admin().enable_telemetry(TelemetryConfig())
    state = job.state(cached_path=None)
    pm = state.hosts.spawn_procs(per_host={"gpus": 8}, name="strag8")
    try:
        m = pm.spawn("stepper", Stepper)
        pids = m.pid.call().get(timeout=120).values()
        # calls that finish report nothing, and leave the watch as their result is made
        # (not at a tick: holding them was a cost to every call, through the GC)
        for _ in range(20):
            m.step.call([]).get(timeout=60)
            assert not w.live
        t0 = time.monotonic()
        fut = m.step.call([5])
        text = wait_until(lambda: reports.texts and reports.texts[0], 1.0 + 5,
                          "the straggler warning")
        assert time.monotonic() - t0 < 1.0 + 5
        assert len(reports.texts) == 1 and not fut.done()
        assert "1 of its 8 members have not answered" in text and "7 answered" in text
        assert f"1 member: wait at {HERE}:" in text and "(in blocked_in_step)" in text
        assert "gpus=5 (process " in text
        assert f"pid {pids[5]}," in text and "host " in text
        assert "Stepper.step" in text and "'stepper'" in text

        # once per call: later ticks say nothing more
        n = len(w.reports)
        w.node.run_sync(_check(w))
        assert len(w.reports) == n and len(reports.texts) == 1

        # the admin tree shows it, and marks the process
        tree = _get_json(admin_endpoint(state.admin_url, "/api/tree"))
        (rep,) = [r for r in tree["stragglers"] if r["mesh"] == "stepper"]
        assert rep["kind"] == "straggler" and rep["answered"] == 7
        (g,) = rep["groups"]
        assert g["count"] == 1 and g["members"][0]["pid"] == pids[5]
        assert g["members"][0]["point"] == "gpus=5" and "blocked_in_step" in g["stack"]
        marked = [p for h in tree["hosts"] for p in h["processes"] if p.get("straggler")]
        assert [p["pid"] for p in marked] == [pids[5]]
        # hpcmesh top's rows say it
        (row,) = [r for r in process_rows(tree) if r["late"]]
        assert row["pid"] == pids[5] and row["late"].startswith("straggler ")
        assert f" s: wait at {HERE}:" in row["late"]

        # the telemetry table has its row
        def row():
            return state.query_engine.query(
                "SELECT kind, point, pid, group_size, headline FROM stragglers "
                "WHERE mesh = 'stepper' AND kind <> 'finished'").to_pylist()
        got = wait_until(row, 30, "the stragglers row")
        assert got == [{"kind": "straggler", "point": "gpus=5", "pid": pids[5],
                        "group_size": 1,
                        "headline": g["headline"]}]

        _release(m)
        assert fut.get(timeout=60).values() == list(range(8))
        wait_until(lambda: w.reports[-1].finished_after_s is not None, 10,
                   "the report marked finished")
        wait_until(lambda: state.query_engine.query(
            "SELECT waited_s FROM stragglers WHERE kind = 'finished' AND mesh = 'stepper'"
        ).to_pylist(), 30, "the finished row")
        tree = _get_json(admin_endpoint(state.admin_url, "/api/tree"))
        assert not [p for h in tree["hosts"] for p in h["processes"] if p.get("straggler")]
    finally:
        pm.stop().get(timeout=60)


async def _check(w):
    w.check(time.monotonic())


def _get_json(url: str) -> dict:
    import urllib.request
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture
def hang_after_2s(monkeypatch):
    """The watch as the environment sets it: a hang after 2 s, looks every 0.1 s."""
    monkeypatch.setenv("HPCMESH_HANG_AFTER_S", "2")
    monkeypatch.setenv("HPCMESH_STRAGGLER_TICK_S", "0.1")
    with _watching(None) as got:
        yield got
        monkeypatch.undo()      # before the watch is started again as the environment says


def test_a_hung_call_one_or_choose_is_named_once_with_its_point_host_pid_and_stack(
        hang_after_2s):
    """call_one and choose() are not noted per call (their hot path stays as it was): the
    watch finds them in the reply table once older than HPCMESH_HANG_AFTER_S, and names
    them as a call()'s hang: once, in the log, the admin tree and the telemetry table. A
    one-member stream (an Accumulator) is a call()'s hang already."""
    from hpcmesh.actor import Accumulator
    w, reports = hang_after_2s
    hang_s = 2.0
    job = LocalJob(hosts=("hosts",)).enable_admin().enable_telemetry(TelemetryConfig())
    state = job.state(cached_path=None)
    pm = state.hosts.spawn_procs(per_host={"gpus": 2}, name="stragone")
    try:
        m = pm.spawn("stepper", Stepper)
        pids = m.pid.call().get(timeout=120).values()
        one = m.slice(gpus=1)
        # a call_one that answers says nothing; the one after it waits (rank 0 of the
        # slice), and a call_one queued behind it is no second report
        assert one.step.call_one([]).get(timeout=60) == 0
        t0 = time.monotonic()
        fut = one.step.call_one([0])
        behind = one.step.call_one([])
        text = wait_until(lambda: reports.texts and reports.texts[0], hang_s + 5,
                          "the hung call_one's warning")
        assert time.monotonic() - t0 < hang_s + 5
        assert not fut.done() and not behind.done()
        assert "a call Stepper.step to actor mesh 'stepper' outside any call() still " \
               "waited on (call_one, choose, " in text, text
        assert "has had no answer after" in text
        assert "HPCMESH_HANG_AFTER_S=2" in text
        assert f"1 member: wait at {HERE}:" in text and "(in blocked_in_step)" in text
        assert "gpus=1 (process " in text and f"pid {pids[1]}," in text
        assert "host " in text and "blocked_in_step" in text.split("gpus=1 (process ")[1]
        rep = w.reports[-1]
        assert (rep.kind, rep.call, rep.members, rep.answered) == ("hang", "call_one", 1, 0)
        assert rep.waited_s >= hang_s

        # once: later looks say nothing more
        for _ in range(3):
            w.node.run_sync(_check(w))
        assert len(reports.texts) == 1

        # the admin tree marks the process; the telemetry table has its row
        tree = _get_json(admin_endpoint(state.admin_url, "/api/tree"))
        (r,) = [r for r in tree["stragglers"] if r["mesh"] == "stepper"]
        assert r["kind"] == "hang" and r["call"] == "call_one"
        marked = [p for h in tree["hosts"] for p in h["processes"] if p.get("straggler")]
        assert [p["pid"] for p in marked] == [pids[1]]
        got = wait_until(lambda: state.query_engine.query(
            "SELECT kind, point, pid, endpoint FROM stragglers WHERE mesh = 'stepper' "
            "AND kind <> 'finished'").to_pylist(), 30, "the stragglers row")
        assert got == [{"kind": "hang", "point": "gpus=1", "pid": pids[1],
                        "endpoint": "step"}]

        _release(m)
        assert fut.get(timeout=60) == 0 and behind.get(timeout=60) == 0
        wait_until(lambda: rep.finished_after_s is not None, 10, "the report marked finished")
        assert rep.finished_after_s >= hang_s

        # choose(): the member it picked, named the same way
        reports.texts.clear()
        fut = m.step.choose([0, 1])
        text = wait_until(lambda: reports.texts and reports.texts[0], hang_s + 5,
                          "the hung choose's warning")
        assert "a call Stepper.step to actor mesh 'stepper' outside" in text
        assert "blocked_in_step" in text
        assert any(f"gpus={i} (process " in text and f"pid {pids[i]}," in text
                   for i in (0, 1)), text
        _release(m)
        fut.get(timeout=60)

        # a call() that failed at once (rank 0 raised): rank 1, still waiting, is named
        reports.texts.clear()
        fut = m.step_or_raise.call([1])
        with pytest.raises(Exception, match="rank 0 raised"):
            fut.get(timeout=60)
        text = wait_until(lambda: reports.texts and reports.texts[0], hang_s + 5,
                          "the warning for the failed call()'s waiting member")
        assert "a call Stepper.step_or_raise to actor mesh 'stepper' outside" in text
        assert "left by a call() that failed" in text and "gpus=1 (process " in text
        assert "blocked_in_step" in text
        _release(m)

        # a one-member stream (an Accumulator's): the call()'s hang
        reports.texts.clear()
        fut = Accumulator(one.step, 0, lambda a, b: a + b).accumulate([0])
        text = wait_until(lambda: reports.texts and reports.texts[0], hang_s + 5,
                          "the hung one-member stream's warning")
        assert "none of its 1 members has answered" in text and "gpus=1 (process " in text
        _release(m)
        assert fut.get(timeout=60) == 0
        assert len(reports.texts) == 1
    finally:
        pm.stop().get(timeout=60)


def test_many_members_blocked_in_two_places_are_two_groups_and_a_hang_is_dumped(watch):
    w, reports = watch
    n = int(os.environ.get("HPCMESH_TEST_STRAGGLER_PROCS", "16"))
    state = LocalJob(hosts=("hosts",)).state(cached_path=None)
    pm = state.hosts.spawn_procs(per_host={"gpus": n}, name=f"strag{n}")
    try:
        m = pm.spawn("stepper", Stepper)
        m.pid.call().get(timeout=300)
        in_step, in_loader = list(range(n - 4)), list(range(n - 4, n))
        # nobody answers: a hang, dumped the same way, once
        fut = m.step.call(in_step, in_loader)
        text = wait_until(lambda: reports.texts and reports.texts[0], 3.0 + 30, "the hang")
        assert f"none of its {n} members has answered" in text, text
        groups = w.reports[-1].groups
        assert [(len(g.members), g.headline.split(" (in")[1]) for g in groups] == [
            (n - 4, " blocked_in_step)"), (4, " blocked_in_loader)")], text
        assert text.count(f"wait at {HERE}:") == 2        # two groups, not n stacks
        _release(m)
        fut.get(timeout=120)

        # stragglers: all but 4 answer, the 4 wait in one place
        reports.texts.clear()
        fut = m.step.call([], in_loader)
        text = wait_until(lambda: reports.texts and reports.texts[0], 1.0 + 30,
                          "the straggler warning")
        assert f"4 of its {n} members have not answered" in text
        (g,) = w.reports[-1].groups
        assert len(g.members) == 4 and "blocked_in_loader" in g.headline
        _release(m)
        fut.get(timeout=120)
    finally:
        pm.stop().get(timeout=120)


def test_the_dashboard_marks_the_straggler_on_the_hosts_by_gpus_grid(watch, tmp_path,
                                                                   monkeypatch):
    """The page (headless Chromium, as tests/test_dashboard.py): the late process's cell
    on its process mesh's heatmap is marked, the report listed with its stack's headline;
    a screenshot a person can check (copied to ``$HPCMESH_TEST_ARTIFACTS``)."""
    from test_dashboard import _browser, _quit, _require_browser
    _require_browser()
    monkeypatch.setenv("SE_OFFLINE", "true")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    w, reports = watch
    job = LocalJob(hosts=("hosts",)).enable_telemetry(
        TelemetryConfig(include_dashboard=True, dashboard_port=0))
    state = job.state(cached_path=None)
    pm = state.hosts.spawn_procs(per_host={"gpus": 4}, name="stragdash")
    try:
        m = pm.spawn("stepper", Stepper)
        m.pid.call().get(timeout=120)
        fut = m.step.call([2])
        wait_until(lambda: reports.texts, 1.0 + 5, "the straggler warning")
        driver, profile = _browser(tmp_path)
        try:
            _the_page_marks_it(driver, state.dashboard_url, tmp_path)
            _release(m)
            assert fut.get(timeout=60).values() == [0, 1, 2, 3]
            # its call finished: the mark goes, the report says when
            WebDriverWait(driver, 30, poll_frequency=0.2).until(
                lambda d: not d.find_elements(By.CSS_SELECTOR, ".late")
                and "finished after" in d.find_element(By.ID, "stragglers").text)
        finally:
            _quit(driver, profile)
    finally:
        pm.stop().get(timeout=60)


def _the_page_marks_it(driver, url: str, tmp_path) -> None:
    """gpus=2 ringed on the process heatmap and the actor grid, the report listed."""
    from test_dashboard import screenshot
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(url)
    cells = 'div.procmesh[data-mesh="stragdash"] .hc[data-key]'

    def shown(d):
        late = d.find_elements(By.CSS_SELECTOR, cells + ".late")
        listed = d.find_element(By.ID, "stragglers").text
        return (len(d.find_elements(By.CSS_SELECTOR, cells)) == 4 and len(late) == 1
                and late[0].get_attribute("data-rank") == "2"
                and "blocked_in_step" in listed and "stepper.step" in listed)
    try:
        WebDriverWait(driver, 30, poll_frequency=0.2).until(shown)
    except Exception:
        print("page text:", driver.find_element(By.TAG_NAME, "body").text)
        raise
    late = driver.find_element(By.CSS_SELECTOR, cells + ".late")
    assert "straggler: step waited" in late.get_attribute("title")
    (actor,) = driver.find_elements(By.CSS_SELECTOR, 'div.mesh[data-mesh="stepper"] td.cell.late')
    assert actor.get_attribute("data-rank") == "2" and "straggler" in actor.text
    screenshot(driver, tmp_path, "dashboard-straggler.png")


def test_the_dashboard_document_marks_only_members_of_calls_not_finished():
    from hpcmesh.telemetry.dashboard import (newest_straggler_rows, straggler_reports,
                                             with_straggler_marks)

    def row(rid, kind, process=None, group=0, size=1, waited=5.0):
        return {"report_id": rid, "timestamp_us": 10 - rid, "kind": kind, "mesh": "w",
                "endpoint": "step", "point": process and f"gpus={process[-1]}",
                "process": process, "host": "h", "pid": 1, "waited_s": waited,
                "stack_group": group, "group_size": size, "headline": f"h{group}"}
    rows = [row(2, "finished", waited=9.0), row(2, "straggler", "p3"),     # newest first
            row(1, "hang", "p1", 0, 2), row(1, "hang", "p2", 0, 2), row(1, "hang", "p4", 1)]
    assert set(newest_straggler_rows(rows)) == {"p1", "p2", "p4"}
    reps = straggler_reports(rows)
    assert [(r["id"], r["finished_after_s"]) for r in reps] == [(2, 9.0), (1, None)]
    assert [(g["count"], g["points"]) for g in reps[1]["groups"]] == [
        (2, ["gpus=1", "gpus=2"]), (1, ["gpus=4"])]
    ts = with_straggler_marks({"since_us": 8, "marks": [
        {"timestamp_us": 7, "kind": "failure", "text": "x"}]}, rows)
    assert [(m["kind"], m["text"]) for m in ts["marks"]] == [
        ("failure", "x"), ("straggler", "straggler: 1 late in w.step (h0)"),
        ("hang", "hang: 3 late in w.step (h0)")]


def test_members_blocking_their_event_loop_are_named_from_outside(watch, tmp_path):
    """An async endpoint that holds its loop cannot answer ``admin_stacks``: its stack
    comes through the host agent (py-spy where installed, else faulthandler) and groups
    as one."""
    w, reports = watch
    state = LocalJob(hosts=("hosts",)).state(cached_path=None)
    pm = state.hosts.spawn_procs(per_host={"gpus": 4}, name="stragloop")
    release = str(tmp_path / "release")
    try:
        m = pm.spawn("stepper", Stepper)
        pids = m.pid.call().get(timeout=120).values()
        fut = m.step_async.call([1, 3], release)
        text = wait_until(lambda: reports.texts and reports.texts[0], 1.0 + 5 + 9,
                          "the straggler warning")
        (g,) = w.reports[-1].groups
        assert "(in blocked_in_the_loop)" in g.headline, text
        assert sorted(lg.pid for lg in g.members) == [pids[1], pids[3]]
        assert {lg.source for lg in g.members} == {"py-spy" if find_pyspy() else
                                                   "faulthandler"}, text
        open(release, "w").close()
        assert fut.get(timeout=60).values() == [0, 1, 2, 3]
    finally:
        open(release, "w").close()
        pm.stop().get(timeout=60)


def test_calls_slow_alike_are_neither_stragglers_nor_hangs(watch):
    """Every member past the floor (1 s), none past 3 x the median nor the hang (3 s): the
    call is slow, nobody is late; it finishes and nothing was said. A stream() with one
    member late is named."""
    w, reports = watch
    state = LocalJob(hosts=("hosts",)).state(cached_path=None)
    pm = state.hosts.spawn_procs(per_host={"gpus": 4}, name="stragslow")
    try:
        m = pm.spawn("stepper", Stepper)
        m.pid.call().get(timeout=120)
        assert m.work.call([1.2, 1.3, 1.4, 2.0]).get(timeout=60).values() == [0, 1, 2, 3]
        looked = w.node.run_sync(_check_and_count(w))
        assert looked == 0 and not reports.texts and not [
            r for r in w.reports if r.mesh == "stepper"]

        # a stream() is watched as a call() is
        stream = m.step.stream([1])
        text = wait_until(lambda: reports.texts and reports.texts[0], 1.0 + 5,
                          "the stream's straggler")
        assert "1 of its 4 members have not answered" in text and "blocked_in_step" in text
        _release(m)
        assert sorted(f.get(timeout=60) for f in stream) == [0, 1, 2, 3]
        wait_until(lambda: w.node.run_sync(_check_and_count(w)) == 0, 10,
                   "the stream forgotten once it ended")
    finally:
        pm.stop().get(timeout=60)


async def _check_and_count(w) -> int:
    """One more look (the finished call is forgotten); the calls still watched."""
    w.check(time.monotonic())
    return len(w.live) + len(w.slow)
