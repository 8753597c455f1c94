"""The controller's runtime thread follows the core of the thread that waits for it
(hpcmesh/runtime/process/placement.py): real threads, real affinity masks."""

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from hpcmesh.runtime import future as future_mod
from hpcmesh.runtime.process import placement
from hpcmesh.runtime.future import Future


class _Parked:
    """A thread that sleeps until told to stop; its native id and original mask."""

    def __init__(self):
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()
        self.ready.wait(5)
        self.tid = self.t.native_id

    def _run(self):
        self.ready.set()
        self.stop.wait(30)

    def close(self):
        self.stop.set()
        self.t.join(5)


@pytest.fixture
def parked():
    p = _Parked()
    yield p
    p.close()


def test_follow_moves_the_thread_to_the_waiters_core_and_release_gives_cores_back(parked):
    before = os.sched_getaffinity(parked.tid)
    f = placement.CallerFollower(parked.tid)
    f.follow()
    assert f.cpu in os.sched_getaffinity(0), "followed a core this process may not use"
    assert os.sched_getaffinity(parked.tid) == {f.cpu}
    f.release()
    assert os.sched_getaffinity(parked.tid) == before
    f.follow()                                   # released: following is over
    assert os.sched_getaffinity(parked.tid) == before


def test_follow_calls_the_kernel_only_when_the_core_changed(parked, monkeypatch):
    f = placement.CallerFollower(parked.tid)
    calls = []
    real = os.sched_setaffinity
    monkeypatch.setattr(placement.os, "sched_setaffinity",
                        lambda tid, cpus: (calls.append(set(cpus)), real(tid, cpus)))
    core = min(os.sched_getaffinity(0))         # a core this process may use
    monkeypatch.setattr(placement, "_getcpu", lambda: core)   # private: fakes what getcpu() says
    for _ in range(5):
        f.follow()
    assert calls == [{core}]
    f.release()


def test_a_runtime_thread_that_starts_a_process_is_not_pinned_meanwhile():
    """Children inherit the starting thread's affinity: a pinned runtime thread would
    put every actor process on one core."""
    me = threading.get_native_id()
    before = os.sched_getaffinity(0)
    f = placement.CallerFollower(me)       # this thread plays the runtime thread
    try:
        f.follow()
        assert os.sched_getaffinity(0) == {f.cpu}
        with placement.spawning():
            assert os.sched_getaffinity(0) == before
            f.cpu = -1
            f.follow()                     # a waiter elsewhere: must not pin meanwhile
            assert os.sched_getaffinity(0) == before
            child = subprocess.run([sys.executable, "-c",
                                    "import os; print(sorted(os.sched_getaffinity(0)))"],
                                   capture_output=True, text=True, timeout=60)
        assert json.loads(child.stdout) == sorted(before)
        f.follow()                         # after the block, following resumes
        assert os.sched_getaffinity(0) == {f.cpu}
    finally:
        f.release()
    assert os.sched_getaffinity(0) == before


def test_a_forked_child_forgets_the_runtime_thread_of_its_parent(parked):
    """Its thread ids are the parent's: following there would move the parent's thread."""
    before = os.sched_getaffinity(parked.tid)
    if len(before) < 2:
        pytest.skip("one core: a thread pinned to it looks like one that is not")
    f = placement.CallerFollower(parked.tid)
    future_mod.set_wait_hook(f.follow)
    try:
        pid = os.fork()
        if pid == 0:        # the child waits on a Future, as a caller of the runtime would
            code = 1
            try:
                Future().get(timeout=0.01)
            except TimeoutError:
                code = 0
            finally:
                os._exit(code)
        assert os.waitpid(pid, 0)[1] == 0
        assert os.sched_getaffinity(parked.tid) == before      # the child moved nothing
        with pytest.raises(TimeoutError):
            Future().get(timeout=0.01)                          # the parent still follows
        assert os.sched_getaffinity(parked.tid) == {f.cpu}
    finally:
        future_mod.set_wait_hook(None)
        f.release()


def test_a_thread_that_is_gone_stops_the_following_without_an_error():
    p = _Parked()
    tid = p.tid
    f = placement.CallerFollower(tid)
    p.close()
    # join() returns a moment before the OS thread is gone: wait for its /proc entry.
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/self/task/{tid}") and time.monotonic() < deadline:
        time.sleep(0.01)
    f.cpu = -1
    f.follow()
    assert f.active is False


def test_get_and_foreign_await_call_the_wait_hook_and_a_settled_future_does_not():
    seen = []
    future_mod.set_wait_hook(lambda: seen.append(threading.get_ident()))
    try:
        done = Future()
        done.set_result(1)
        assert done.get() == 1
        assert seen == []                       # nothing to wait for: no hook

        pending = Future()
        threading.Timer(0.05, pending.set_result, (2,)).start()
        assert pending.get(timeout=5) == 2
        assert seen == [threading.get_ident()]

        async def wait_on_other_loop():
            f = Future()
            threading.Timer(0.05, f.set_result, (3,)).start()
            return await f
        assert asyncio.run(wait_on_other_loop()) == 3
        assert len(seen) == 2
    finally:
        future_mod.set_wait_hook(None)


def test_the_client_runtime_thread_follows_its_caller_and_can_be_turned_off(tmp_path):
    """In a fresh controller: after a round trip, the runtime thread is on one core that
    the caller may use, and the actor processes may use every core the controller may;
    with HPCMESH_FOLLOW_CALLER=0 the runtime thread's mask is left alone."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, os\n"
        "from hpcmesh.actor import Actor, endpoint, this_host\n"
        "from hpcmesh.runtime.client import client_runtime\n"
        "class A(Actor):\n"
        "    @endpoint\n"
        "    async def cores(self):\n"
        "        return sorted(os.sched_getaffinity(0))\n"
        "from hpcmesh.runtime import future\n"
        "client_runtime()\n"
        "if future._wait_hook is not None:\n"
        "    future._wait_hook()   # pinned before any process is started, not by chance\n"
        "pm = this_host().spawn_procs(per_host={'gpus': 2})\n"
        "a = pm.spawn('a', A)\n"
        "actor_cores = a.cores.call().get(timeout=60).values()\n"
        "pm2 = this_host().spawn_procs(per_host={'gpus': 1})\n"
        "actor_cores += pm2.spawn('b', A).cores.call().get(timeout=60).values()\n"
        "rt = client_runtime().node.loop_native_tid\n"
        "print(json.dumps([sorted(os.sched_getaffinity(rt)), sorted(os.sched_getaffinity(0)),\n"
        "                  actor_cores]))\n"
        "pm.stop().get(timeout=30)\n"
        "pm2.stop().get(timeout=30)\n")
    env = dict(os.environ)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rt_cores, my_cores, actor_cores = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rt_cores) == 1 and set(rt_cores) <= set(my_cores)
    assert actor_cores == [my_cores] * 3

    env["HPCMESH_FOLLOW_CALLER"] = "0"
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rt_cores, my_cores, actor_cores = json.loads(out.stdout.strip().splitlines()[-1])
    assert rt_cores == my_cores and actor_cores == [my_cores] * 3


def test_threads_the_runtime_loop_starts_after_it_is_pinned_get_every_core(tmp_path):
    """libuv's resolver pool and the loop's default executor start threads from the runtime
    thread; once it is pinned, they would inherit the pin."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import asyncio, json, os, threading\n"
        "from hpcmesh.runtime.client import client_runtime\n"
        "from hpcmesh.runtime import future\n"
        "node = client_runtime().node\n"
        "future._wait_hook()                      # the runtime thread is pinned now\n"
        "rt = node.loop_native_tid\n"
        "async def use_helpers():\n"
        "    loop = asyncio.get_running_loop()\n"
        "    await loop.getaddrinfo('localhost', None)\n"
        "    return await loop.run_in_executor(None, threading.get_native_id)\n"
        "helper = node.run_sync(use_helpers(), 30)\n"
        "tids = [int(t) for t in os.listdir('/proc/self/task')]\n"
        "print(json.dumps({'rt': sorted(os.sched_getaffinity(rt)),\n"
        "                  'mine': sorted(os.sched_getaffinity(0)),\n"
        "                  'helper': sorted(os.sched_getaffinity(helper)),\n"
        "                  'others': [sorted(os.sched_getaffinity(t)) for t in tids if t != rt]}))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # (on a one-core machine these hold trivially; CI's machine has two)
    assert len(got["rt"]) == 1                       # the runtime thread follows its caller
    assert got["helper"] == got["mine"]
    assert all(cores == got["mine"] for cores in got["others"]), got
