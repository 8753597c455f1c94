"""this_proc(): actors in the calling process (the controller's, or an actor process's)."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from hpcmesh.actor import Actor, SupervisionError, endpoint, this_host, this_proc
from hpcmesh.runtime.client import client_runtime

_SHARED: list = []      # module state: an actor in this process sees the same list


class Local(Actor):
    def __init__(self, start: int = 0):
        self.n = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    async def where(self) -> tuple:
        _SHARED.append("seen")
        return os.getpid(), len(_SHARED)


class Nester(Actor):
    """Lives in its own process and puts a helper actor in that same process."""

    @endpoint
    async def helper_pid(self) -> tuple:
        helper = this_proc().spawn("helper", Local)
        pid, _ = await helper.where.call_one()
        return os.getpid(), pid


def test_actors_spawned_on_this_proc_run_in_this_process():
    pm = this_proc()
    assert dict(pm.extent) == {} and pm.pids == [os.getpid()]
    local = pm.spawn("local", Local, start=5)
    assert local.incr.call_one(2).get(timeout=10) == 7
    _SHARED.clear()
    pid, seen = local.where.call_one().get(timeout=10)
    assert pid == os.getpid() and seen == 1 and _SHARED == ["seen"]   # same memory
    # the runtime tracks it (supervision, the admin view) through track_actor_mesh
    tracked = [st for st in client_runtime().actor_meshes() if st.name == "local"]
    assert [(st.class_name, st.proc_names) for st in tracked] == [("Local",
                                                                  [pm.records[0].name])]
    assert not pm.stopped
    assert pm.stop().get(timeout=10) == {pm.records[0].name: 0}
    assert pm.stopped
    with pytest.raises(SupervisionError, match="Endpoint call local.incr\\(\\) failed, .* "
                       "actor mesh is stopped due to proc mesh shutdown \\(proc mesh "
                       "'this_proc' of actor mesh 'local' was stopped\\)"):
        local.incr.call_one().get(timeout=10)
    with pytest.raises(RuntimeError, match="has been stopped"):
        pm.spawn("again", Local)
    # the process goes on: a fresh handle spawns again
    assert this_proc().spawn("again", Local, 1).incr.call_one().get(timeout=10) == 2


def test_a_remote_actor_calls_an_actor_in_the_controller_and_this_proc_works_in_actors():
    local = this_proc().spawn("shared_counter", Local, 100)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        class Caller(Actor):
            @endpoint
            async def bump(self, target) -> int:
                return await target.incr.call_one(1)
        callers = procs.spawn("callers", Caller)
        assert sorted(callers.bump.call(local).get(timeout=30).values()) == [101, 102]
        nesters = procs.spawn("nesters", Nester)
        for own, helper in nesters.helper_pid.call().get(timeout=30).values():
            assert own == helper and own != os.getpid()
    finally:
        procs.stop().get(timeout=30)


def test_a_script_with_actors_in_its_own_process_exits_quietly(tmp_path):
    script = tmp_path / "local.py"
    script.write_text(textwrap.dedent("""
        from hpcmesh.actor import Actor, endpoint, this_proc

        class Sleeper(Actor):
            @endpoint
            async def ping(self):
                return "pong"

        s = this_proc().spawn("s", Sleeper)
        print(s.ping.call_one().get(timeout=10))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert out.returncode == 0 and out.stdout.strip() == "pong", out.stderr
    assert out.stderr == "", out.stderr      # no "Task was destroyed but it is pending"


def test_a_blocked_sync_endpoint_in_this_process_does_not_hold_the_exit(tmp_path):
    script = tmp_path / "blocked.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        from hpcmesh.actor import Actor, endpoint, this_proc

        class Stuck(Actor):
            @endpoint
            def block(self, inside: str):
                open(inside, "w").close()
                time.sleep(120)     # sleep: an endpoint that would hold the exit for 2 min

        s = this_proc().spawn("s", Stuck)
        s.block.broadcast(sys.argv[1])
        deadline = time.monotonic() + 30
        while not os.path.exists(sys.argv[1]):      # the actor's thread is inside block()
            assert time.monotonic() < deadline, "block() never ran"
            time.sleep(0.01)
        print("main done", flush=True)
    """))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "inside")],
                         capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert out.returncode == 0 and "main done" in out.stdout, out.stderr
    assert time.monotonic() - t0 < 20      # not the 120 s of the endpoint
