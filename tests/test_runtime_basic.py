"""Core runtime on the local host: real processes, real sockets."""

import asyncio
import os
import signal
import time

import pytest

from hpcmesh.actor import (Actor, ActorError, BootstrapCommand, SupervisionError, context,
                           default_bootstrap_cmd, endpoint, this_host)
from proc_helpers import wait_gone, wait_until


class Counter(Actor):
    def __init__(self, start: int):
        self.n = start

    @endpoint
    async def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    def point(self):
        c = context()
        return dict(c.actor_instance.rank.coords), dict(c.message_rank.coords)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def env(self, name):
        return os.environ.get(name)

    @endpoint
    def fail(self):
        raise KeyError("nope")


@pytest.fixture(scope="module")
def procs():
    pm = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    yield pm
    pm.stop().get(timeout=30)


def test_call_every_member_and_slice(procs):
    c = procs.spawn("c", Counter, 10)
    assert c.incr.call(5).get(timeout=30).values() == [15, 15, 15, 15]
    assert c.slice(hosts=1).incr.call().get().values() == [16, 16]
    assert c.slice(hosts=0, gpus=1).incr.call_one(100).get() == 115
    vm = c.incr.call(0).get()
    assert [p.coords for p, _ in vm] == [{"hosts": h, "gpus": g} for h in (0, 1) for g in (0, 1)]
    assert vm.values() == [15, 115, 16, 16]


def test_message_rank_versus_actor_rank(procs):
    c = procs.spawn("c2", Counter, 0)
    vm = c.slice(gpus=1).point.call().get()
    assert vm.values() == [({"hosts": 0, "gpus": 1}, {"hosts": 0}),
                           ({"hosts": 1, "gpus": 1}, {"hosts": 1})]


def test_call_one_on_many_is_refused(procs):
    c = procs.spawn("c3", Counter, 0)
    with pytest.raises(ValueError, match="exactly one actor"):
        c.incr.call_one()


def test_remote_exception_is_actor_error(procs):
    c = procs.spawn("c4", Counter, 0)
    with pytest.raises(ActorError) as ei:
        c.slice(hosts=1, gpus=0).fail.call_one().get()
    e = ei.value
    assert e.remote_type == "KeyError" and "nope" in e.message
    assert "Traceback" in e.traceback_text
    assert e.point.coords == {"hosts": 1, "gpus": 0}


def test_unknown_endpoint(procs):
    c = procs.spawn("c5", Counter, 0)
    with pytest.raises(AttributeError, match="no endpoint 'nope'.*incr"):
        c.nope


def test_await_and_get_same_future(procs):
    c = procs.spawn("c6", Counter, 0)
    f = c.slice(hosts=0, gpus=0).incr.call_one()

    async def main():
        return await f
    assert asyncio.run(main()) == 1
    assert f.get() == 1


def test_per_sender_ordering(procs):
    c = procs.spawn("c7", Counter, 0).slice(hosts=0, gpus=0)
    futs = [c.incr.call_one() for _ in range(500)]
    assert [f.get(timeout=30) for f in futs] == list(range(1, 501))


def test_kill9_fails_pending_with_supervision_error():
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        c = pm.spawn("victim", Counter, 0)
        pids = c.pid.call().get(timeout=30).values()
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(SupervisionError) as ei:
            c.slice(gpus=1).incr.call_one().get(timeout=10)
        assert time.monotonic() - t0 < 5
        msg = str(ei.value)
        assert "SIGKILL" in msg and str(pids[1]) in msg and "gpus=1" in msg
        # the rest of the mesh keeps working
        assert c.slice(gpus=0).incr.call_one().get(timeout=10) == 1
    finally:
        pm.stop().get(timeout=30)


def test_stop_leaves_no_process():
    pm = this_host().spawn_procs(per_host={"gpus": 3})
    c = pm.spawn("s", Counter, 0)
    pids = c.pid.call().get(timeout=30).values()
    pm.stop().get(timeout=30)

    def reaped(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    wait_until(lambda: all(map(reaped, pids)), 10, "every process is gone, reaped")


def test_bootstrap_env_rules():
    os.environ["HPCMESH_TEST_INHERITED"] = "from-agent"
    try:
        cmd = default_bootstrap_cmd().with_env({"A": "1", "B": ""}).with_env(
            {"A": "2", "HPCMESH_TEST_INHERITED": None, "P": "${PATH}:/opt/bin"})
        pm = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=cmd)
        c = pm.spawn("e", Counter, 0)
        one = c.slice(gpus=0)
        assert one.env.call_one("A").get(timeout=30) == "2"
        assert one.env.call_one("B").get() == ""
        assert one.env.call_one("HPCMESH_TEST_INHERITED").get() is None
        assert one.env.call_one("P").get() == "${PATH}:/opt/bin"
        assert one.env.call_one("HPCMESH_BOOTSTRAP_MODE").get() == "proc"
        pm.stop().get(timeout=30)
    finally:
        del os.environ["HPCMESH_TEST_INHERITED"]


def test_missing_bootstrap_program_is_a_clear_error():
    pm = this_host().spawn_procs(per_host={"gpus": 1},
                                 bootstrap_command=BootstrapCommand("/nonexistent/python"))
    c = pm.spawn("x", Counter, 0)
    with pytest.raises(FileNotFoundError, match="/nonexistent/python.*does not exist"):
        c.incr.call().get(timeout=30)


def test_exit_without_waiting_for_stop_is_quiet_and_leaves_no_process(tmp_path):
    """A script may end right after ``procs.stop()`` without waiting on its Future: the
    runtime's exit handler finishes or cancels what is in flight, without asyncio's
    "Task was destroyed but it is pending" or "never awaited" warnings."""
    import subprocess
    import sys
    script = tmp_path / "script.py"
    script.write_text(
        "from hpcmesh.actor import Actor, endpoint, this_host\n"
        "class A(Actor):\n"
        "    @endpoint\n"
        "    def pid(self):\n"
        "        import os\n"
        "        return os.getpid()\n"
        "procs = this_host().spawn_procs(per_host={'gpus': 3})\n"
        "print(*procs.spawn('a', A).pid.call().get(timeout=30).values())\n"
        "procs.stop()\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PYTHONWARNINGS="default"))
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 3
    assert "destroyed but it is pending" not in out.stderr, out.stderr
    assert "never awaited" not in out.stderr, out.stderr
    assert wait_gone(pids, 5) == []
