"""``breakpoint()`` in an endpoint, attached to from ``hpcmesh debug`` in a real pty."""

import asyncio
import io
import os
import pty
import queue
import re
import select
import subprocess
import sys
import threading
import time
from contextlib import redirect_stderr

import pytest
from proc_helpers import wait_until

from hpcmesh.actor import Actor, debug_controller, endpoint
from hpcmesh.job import LocalJob
from hpcmesh.runtime.observe import debugger
from hpcmesh.runtime.client import client_runtime

PROMPT = "(hpcmesh-pdb) "


class Debuggee(Actor):
    @endpoint
    def step(self, x: int) -> int:
        y = x * 2
        breakpoint()
        return y + 1

    @endpoint
    async def ping(self) -> str:
        getattr(self, "seen", []).append("ping")
        return "pong"

    @endpoint
    async def nap(self, seconds: float) -> str:
        getattr(self, "seen", []).append("nap")
        await asyncio.sleep(seconds)    # sleep: the endpoint's work is to take this long
        return "rested"

    @endpoint
    async def break_then_nap(self) -> str:
        self.seen = ["break"]
        breakpoint()
        x = 1                           # still in the callback that paused (run inline)
        await asyncio.sleep(0.2 * x)    # sleep: suspends: handed to the mailbox
        self.seen.append("napped")
        return "napped"

    @endpoint
    async def order(self) -> list:
        return self.seen

    @endpoint
    async def async_break(self) -> int:
        x = 41
        breakpoint()          # on the event loop's thread: the loop goes on meanwhile
        return x + 1

    @endpoint
    async def hold_loop(self, release: str) -> None:
        """Blocks the process's event loop (it reads nothing meanwhile) until the file
        ``release`` exists; ``<release>.held`` says it is blocked now."""
        open(f"{release}.held", "w").close()
        deadline = time.monotonic() + 30
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)


@pytest.fixture
def procs():
    """Two processes (gpus=0, gpus=1) of a local job with the admin view `hpcmesh debug`
    goes through."""
    state = LocalJob(hosts=("hosts",)).enable_admin().state(cached_path=None)
    pm = state.hosts.spawn_procs(per_host={"gpus": 2}, name="dbg")
    try:
        yield pm
    finally:
        pm.stop().get(timeout=30)
        from hpcmesh.admin.server import stop_admin
        stop_admin()


def read_until(fd: int, marker: str, timeout: float = 30.0) -> str:
    buf = ""
    deadline = time.monotonic() + timeout
    while marker not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} within {timeout} s; got:\n{buf}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:        # the child closed the pty
                break
            if not chunk:
                break
            buf += chunk.decode("utf-8", "replace")
    assert marker in buf, buf
    return buf


def open_session(timeout: float = 20.0) -> dict:
    """The one paused endpoint, once it is paused."""
    deadline = time.monotonic() + timeout
    sessions = []
    while not sessions and time.monotonic() < deadline:
        sessions = debug_controller().list()
        time.sleep(0.05)
    (s,) = sessions
    return s


def debug_in_a_pty(attached: list[str], dialogue: list[tuple[bytes, str]]) -> None:
    """``hpcmesh debug`` in a pty: its greeting shows each of ``attached``; each line of
    ``dialogue`` is typed and its answer shows the text paired with it; then ``c``."""
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "hpcmesh", "debug"], stdin=child,
                            stdout=child, stderr=child, close_fds=True,
                            env=dict(os.environ, PYTHONPATH=os.getcwd()))
    os.close(child)
    try:
        out = read_until(main, PROMPT)
        assert all(a in out for a in attached), out
        for line, shown in dialogue:
            os.write(main, line + b"\n")
            assert shown in read_until(main, PROMPT)
        os.write(main, b"c\n")
        assert "detached; the endpoint continues" in read_until(main, "continues")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)


def test_attach_to_a_breakpoint_from_hpcmesh_debug_in_a_pty(procs):
    pm = procs
    d = pm.spawn("d", Debuggee)
    other = pm.spawn("other", Debuggee)
    paused = d.slice(gpus=0).step.call_one(20)
    s = open_session()
    assert (s["mesh"], s["rank"], s["point"], s["pid"]) == ("d", 0, {"gpus": 0}, pm.pids[0])
    # the rest goes on: the other member, and another actor in the paused one's process
    assert d.slice(gpus=1).ping.call_one().get(timeout=10) == "pong"
    assert other.slice(gpus=0).ping.call_one().get(timeout=10) == "pong"
    assert not paused.done()
    debug_in_a_pty(["attached to d[gpus=0] (Debuggee)", f"pid {pm.pids[0]}"],
                   [(b"p y", "40"), (b"p x + 1", "21")])
    assert paused.get(timeout=30) == 41
    assert debug_controller().list() == []
    # a second breakpoint, and end of input (the user's ^D) continues it too
    again = d.slice(gpus=1).step.call_one(1)
    open_session()
    res = subprocess.run([sys.executable, "-m", "hpcmesh", "debug"], input="",
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "detached" in res.stdout, res.stdout + res.stderr
    assert again.get(timeout=30) == 3


def test_a_breakpoint_in_an_async_endpoint_leaves_its_process_running(procs):
    pm = procs
    d = pm.spawn("d", Debuggee)
    other = pm.spawn("other", Debuggee)
    napping = other.slice(gpus=0).nap.call_one(1.0)   # its reply is due while d is paused
    paused = d.slice(gpus=0).async_break.call_one()
    # answered with nothing else arriving at the process (no session listed yet)
    assert napping.get(timeout=5) == "rested"
    s = open_session()
    assert (s["mesh"], s["point"], s["pid"]) == ("d", {"gpus": 0}, pm.pids[0])
    # another actor of the paused one's process answers, at once or after suspending
    assert other.slice(gpus=0).ping.call_one().get(timeout=2) == "pong"
    assert other.slice(gpus=0).nap.call_one(0.05).get(timeout=2) == "rested"
    debug_in_a_pty(["attached to d[gpus=0] (Debuggee)"], [(b"p x", "41")])
    assert paused.get(timeout=30) == 42
    assert debug_controller().list() == []
    assert d.slice(gpus=0).ping.call_one().get(timeout=10) == "pong"


def test_frames_read_with_the_paused_call_are_handled_during_the_pause(procs, tmp_path):
    # CI (under load): the call that paused and a later one to another actor arrived in
    # one read; the later one waited in that read's list for the pause to end. Here the
    # process's loop is held while both are sent, so that one read takes both.
    d = procs.spawn("d", Debuggee).slice(gpus=0)
    other = procs.spawn("other", Debuggee).slice(gpus=0)
    assert other.ping.call_one().get(timeout=30) == "pong"
    release = tmp_path / "release"
    holding = other.hold_loop.call_one(str(release))
    wait_until((tmp_path / "release.held").exists, 30, "the process's loop is held")
    paused = d.async_break.call_one()
    napping = other.nap.call_one(0.05)
    client_runtime().node.run_sync(asyncio.sleep(0))    # both are written out by now
    release.touch()
    assert napping.get(timeout=10) == "rested"
    holding.get(timeout=10)
    open_session()
    debug_in_a_pty(["attached to d[gpus=0] (Debuggee)"], [(b"p x", "41")])
    assert paused.get(timeout=30) == 42


def test_calls_to_an_actor_paused_in_an_async_endpoint_wait_their_turn(procs):
    # review: an idle actor runs an async call inline, not marked busy; paused there, the
    # next calls to it ran inside the pause, and the paused call, which lost its place in
    # the mailbox when it suspended, was never answered
    e = procs.spawn("e", Debuggee).slice(gpus=1)
    paused = e.break_then_nap.call_one()
    s = open_session()
    quick = e.ping.call_one()
    napping = e.nap.call_one(0.3)
    time.sleep(0.5)     # sleep: the nap's 0.3 s would end meanwhile, were it run in the pause
    assert not (paused.done() or quick.done() or napping.done())
    # steps: to the next line in the same callback, then past the await (the call
    # handed to the mailbox); at each pause the others still wait
    def stopped_at(out: dict) -> int:
        return int(re.findall(r"\((\d+)\)break_then_nap", out["output"])[-1])
    line = stopped_at(debug_controller().send(s["process"], s["session"], None))
    for step in (1, 2):
        out = debug_controller().send(s["process"], s["session"], "n")
        assert not out["ended"] and stopped_at(out) == line + 1, out
        line += 1
        time.sleep(0.5)     # sleep: time for the others to end, were they let run
        assert not (paused.done() or quick.done() or napping.done()), step
    out = debug_controller().send(s["process"], s["session"], "c")
    assert out["ended"], out
    assert paused.get(timeout=10) == "napped"
    assert quick.get(timeout=10) == "pong" and napping.get(timeout=10) == "rested"
    assert e.order.call_one().get(timeout=10) == ["break", "napped", "ping", "nap"]


def loop_keeping_errors() -> tuple:
    """A new asyncio loop, and the list its callbacks' uncaught errors go to."""
    loop = asyncio.new_event_loop()
    errors: list = []
    loop.set_exception_handler(lambda _, ctx: errors.append(ctx))
    return loop, errors


def test_a_nested_loop_runs_the_rest_and_gives_the_outer_one_its_place_back():
    """The mechanism on its own, nested twice: ready callbacks, tasks and lines put from
    another thread (which must wake a loop waiting in select) all go on, no step of a task
    finds another one running, and the paused tasks are theirs again afterwards."""
    loop, errors = loop_keeping_errors()
    outer, inner = (debugger.DebugSession({}, loop).input for _ in range(2))
    seen: list = []

    async def pause(name: str, inp, then: tuple = ()):
        seen.append(name)
        if then:
            tasks[then[0]] = loop.create_task(pause(*then))
        # private: the nested loop on its own, under breakpoint_hook
        line = debugger._run_loop_until_line(loop, inp.lines)
        seen.append((name, line, asyncio.current_task() is tasks[name]))

    async def bystander(i: int):
        await asyncio.sleep(0)
        seen.append(i)

    def put_later():
        while "inner" not in seen:
            time.sleep(0.01)
        time.sleep(0.1)     # sleep: the loop goes idle in select, which the put must wake
        inner.put("inner line")
        time.sleep(0.1)     # sleep: idle in select again, now in the outer pause
        outer.put("outer line")

    async def main():
        tasks["outer"] = loop.create_task(pause("outer", outer, ("inner", inner)))
        for i in range(3):
            loop.call_soon(seen.append, f"soon{i}")
            loop.create_task(bystander(i))
        await tasks["outer"]

    tasks: dict = {}
    threading.Thread(target=put_later, daemon=True).start()
    t0 = time.monotonic()
    try:
        loop.run_until_complete(asyncio.wait_for(main(), 10))
    finally:
        loop.close()
    assert time.monotonic() - t0 < 5 and not errors, errors
    assert {"soon0", "soon1", "soon2", 0, 1, 2} <= set(seen)
    assert seen.index(("inner", "inner line", True)) < seen.index(("outer", "outer line", True))


class NodeHere:
    """What breakpoint_hook needs of a process's node, for a loop run by this thread."""
    name = "here"

    def __init__(self, loop):
        self.loop = loop
        self.tid = threading.get_ident()

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self.tid

    def pause_frame_handling(self) -> tuple:
        return ()               # it reads no frames: there is nothing to pause

    def resume_frame_handling(self, paused: tuple) -> None:
        pass

    def take_unhandled_frames(self) -> list:
        return []


def test_breakpoints_in_two_async_endpoints_nest_and_the_first_steps_on_after(monkeypatch):
    loop, errors = loop_keeping_errors()
    monkeypatch.setattr(debugger, "_node", NodeHere(loop))   # private: a fake node, no install()
    before = set(debugger.SESSIONS)

    def one():
        debugger.breakpoint_hook()
        return 1

    async def first():
        x = one()
        x += 1
        return x

    async def second():      # runs while the first one is paused
        y = 20
        debugger.breakpoint_hook()
        return y

    said: dict = {}

    def user():
        deadline = time.monotonic() + 10
        while len(set(debugger.SESSIONS) - before) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        s1, s2 = (debugger.SESSIONS[i] for i in sorted(set(debugger.SESSIONS) - before))
        said["second"] = s2.send("p y")["output"]     # the inner one first
        said["second ended"] = s2.send("c")["ended"]
        said["first next"] = s1.send("n")["output"] + s1.send("n")["output"]
        said["first"] = s1.send("p x")["output"]
        said["first ended"] = s1.send("c")["ended"]
    async def both():
        return await asyncio.wait_for(asyncio.gather(first(), second()), 30)
    threading.Thread(target=user, daemon=True).start()
    try:
        results = loop.run_until_complete(both())
    finally:
        loop.close()
    assert results == [2, 20] and not errors, errors
    assert "20" in said["second"] and said["second ended"] and said["first ended"], said
    assert "--Return--" in said["first next"] and "x += 1" in said["first next"], said
    assert "1" in said["first"], said


def test_a_loop_that_cannot_nest_skips_the_breakpoint_with_how_to_debug_it(monkeypatch):
    class UvloopLike:       # uvloop's Loop: no _run_once to turn it from inside
        def is_running(self):
            return True

    class Node:
        loop = UvloopLike()
        name = "p"

        def on_loop_thread(self):
            return True
    monkeypatch.setattr(debugger, "_node", Node())   # private: a fake node, no install()
    err = io.StringIO()
    with redirect_stderr(err):
        debugger.breakpoint_hook()
    assert "HPCMESH_UVLOOP=0" in err.getvalue() and debugger.SESSIONS == {}


def test_debug_with_nothing_paused_says_so():
    state = LocalJob(hosts=("hosts",)).enable_admin().state(cached_path=None)
    try:
        # (the URL from $HPCMESH_ADMIN_URL, which state() set)
        assert os.environ["HPCMESH_ADMIN_URL"] == state.admin_url
        res = subprocess.run([sys.executable, "-m", "hpcmesh", "debug"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and "no actor is paused at a breakpoint()" in res.stderr
        res = subprocess.run([sys.executable, "-m", "hpcmesh", "debug", "--list"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "no actor is paused" in res.stdout
    finally:
        from hpcmesh.admin.server import stop_admin
        stop_admin()
