"""The runtime thread polls for the rest of a call() once its first reply is in
(``Node.poll_for_rest``): only while somebody waits for the fan-in, until it settles or
the window ends, so a slow member costs at most the window in CPU."""

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest

import hpcmesh.runtime.fanin as fanin_mod
from hpcmesh.actor import Actor, endpoint, this_host
from hpcmesh.runtime.future import Future, gather
from hpcmesh.runtime.node import Node


def _counting_yields(monkeypatch) -> list:
    turns: list = []
    # private: counts the poller's turns (its CPU), no public hook
    monkeypatch.setattr(fanin_mod, "_yield_core", lambda: turns.append(1))
    return turns


def _waited_on() -> Future:
    """A pending Future somebody waits for (as ``await``/``get()`` would register)."""
    f = Future()
    f.add_done_callback(lambda _f: None)
    return f


def _run_on_own_loop(body) -> None:
    loop = asyncio.new_event_loop()
    try:
        async def main():
            node = Node(b"s" * 32, loop, role="proc", name="poll-test")
            try:
                await body(node)
            finally:
                node.close()
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_polls_while_the_fanin_is_pending_and_stops_when_it_settles(monkeypatch):
    turns = _counting_yields(monkeypatch)

    async def body(node: Node) -> None:
        fanin = _waited_on()
        node.poll_for_rest(fanin, window=10.0)
        deadline = time.monotonic() + 10
        while len(turns) <= 20:            # timers: the loop keeps turning meanwhile
            assert time.monotonic() < deadline, f"only {len(turns)} polling turns in 10 s"
            await asyncio.sleep(0.001)
        assert node.fanin.polling
        fanin.set_result("all in")
        deadline = time.monotonic() + 2    # well inside the 10 s window
        while node.fanin.polling:          # its next turn sees the fan-in settled
            assert time.monotonic() < deadline, "still polling after the fan-in settled"
            await asyncio.sleep(0.001)
        seen = len(turns)
        await asyncio.sleep(0.02)          # sleep: a polling loop would turn meanwhile
        assert len(turns) == seen          # no polling without a pending fan-in
    _run_on_own_loop(body)


def test_polling_ends_with_its_window_even_if_the_fanin_never_settles(monkeypatch):
    turns = _counting_yields(monkeypatch)

    async def body(node: Node) -> None:
        never = _waited_on()
        t0 = time.perf_counter()
        node.poll_for_rest(never, window=0.005)
        while node.fanin.polling:
            await asyncio.sleep(0)
            assert time.perf_counter() - t0 < 1.0
        assert time.perf_counter() - t0 >= 0.005
        assert turns and not never.done()
    _run_on_own_loop(body)


def test_no_polling_off_the_loop_thread_unwaited_settled_or_with_a_zero_window(monkeypatch):
    """Off the loop thread the first result is set by the caller itself, still running;
    nobody waiting means the caller is busy too: polling would compete with it."""
    turns = _counting_yields(monkeypatch)

    async def body(node: Node) -> None:
        other = threading.Thread(target=node.poll_for_rest, args=(_waited_on(), 10.0))
        other.start()
        other.join()
        node.poll_for_rest(Future(), window=10.0)           # nobody waits for it
        done = _waited_on()
        done.set_result(1)
        node.poll_for_rest(done, window=10.0)
        node.poll_for_rest(_waited_on(), window=0.0)
        await asyncio.sleep(0.01)          # sleep: a polling loop would turn meanwhile
        assert not node.fanin.polling and turns == []
    _run_on_own_loop(body)


def test_waited_on_until_the_callbacks_ran():
    f = Future()
    assert not f.waited_on()
    f.add_done_callback(lambda _f: None)
    assert f.waited_on()
    f.set_result(1)
    assert not f.waited_on()


def test_gather_calls_on_first_once_for_the_first_of_several_results():
    seen = []
    futs = [Future() for _ in range(3)]
    out = gather(futs, on_first=seen.append)
    futs[2].set_result("c")
    assert seen == [out] and not out.done()
    futs[0].set_result("a")
    futs[1].set_result("b")
    assert seen == [out] and out.get() == ["a", "b", "c"]
    single = [Future()]
    gather(single, on_first=seen.append)
    single[0].set_result(1)
    assert seen == [out]                   # one member: nothing to poll for


def test_bad_window_setting_is_a_clear_error():
    out = subprocess.run([sys.executable, "-c", "import hpcmesh.runtime.node"],
                         env=dict(os.environ, HPCMESH_FANIN_POLL_US="fast"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "HPCMESH_FANIN_POLL_US must be a number of microseconds >= 0" in out.stderr
    assert "'fast'" in out.stderr


class Staggered(Actor):
    @endpoint
    async def answer(self, first_s: float, rest_s: float):
        from hpcmesh.actor import current_rank
        rank = current_rank().rank
        await asyncio.sleep(first_s if rank == 0 else rest_s)   # sleep: a slow member
        return rank


@pytest.fixture(scope="module")
def staggered():
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    try:
        yield procs.spawn("s", Staggered)
    finally:
        procs.stop().get(timeout=30)


def test_a_slow_member_costs_the_controller_at_most_the_window(staggered, monkeypatch):
    """Rank 0 answers after 50 ms (the caller waits by then), the others 0.3 s later: the
    runtime thread polls for at most its window (250 µs), then sleeps, so its CPU time over
    the call stays small. (First, the others 10 ms after rank 0: that it polls at all. At
    1 ms apart, a loaded machine once handed the loop all three answers in one turn.)"""
    from hpcmesh.runtime.client import client_runtime
    turns = _counting_yields(monkeypatch)
    node = client_runtime().node
    assert staggered.answer.call(0.05, 0.06).get(timeout=30).values() == [0, 1, 2]
    assert turns, "a fan-in over 3 actors was not polled for"

    def runtime_cpu() -> float:
        box = []
        done = threading.Event()
        node.loop.call_soon_threadsafe(lambda: (box.append(time.thread_time()), done.set()))
        done.wait(10)
        return box[0]
    before = runtime_cpu()
    t0 = time.monotonic()
    assert staggered.answer.call(0.05, 0.35).get(timeout=30).values() == [0, 1, 2]
    assert time.monotonic() - t0 >= 0.35
    used = runtime_cpu() - before
    assert used < 0.1, f"the runtime thread used {used * 1e3:.1f} ms of CPU waiting for 0.3 s"


def test_fanin_slots_are_views_of_its_own_state():
    """A FanIn keeps each slot's state itself; slot objects (what a reply port resolves,
    what the straggler watch reads) are views made on demand, and agree with it."""
    from hpcmesh.runtime.future import FanIn
    fan = FanIn(3, lambda vals: tuple(vals))
    slots = fan.all_slots()
    assert len(slots) == 3 and [s.done() for s in slots] == [False] * 3
    seen = []
    slots[2].add_done_callback(lambda s: seen.append((s.i, s.done(), s.exception())))
    fan.put(0, "a")
    fan.slot(0).set_result("again")             # a second answer of a slot is dropped
    assert slots[0].done() and not slots[1].done() and not fan.out.done()
    fan.slot(1).set_result("b")
    err = RuntimeError("member 2 lost")
    fan.fail_slot(2, err)
    assert seen == [(2, True, err)]
    assert slots[2].exception() is err and slots[0].exception() is None
    assert fan.out.exception() is err           # a failed slot fails the whole
    late = []
    slots[1].add_done_callback(lambda s: late.append(s.i))     # settled: runs at once
    assert late == [1]
    with pytest.raises(IndexError):
        slots[3]
