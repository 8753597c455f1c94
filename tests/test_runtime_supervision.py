"""Supervision and shutdown with real processes: deaths, exits, stop(), leases."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from proc_helpers import alive, wait_gone, wait_until

from hpcmesh.actor import Actor, ActorError, SupervisionError, endpoint, this_host


class Victim(Actor):
    def __init__(self, marker_dir=None):
        self.marker_dir = marker_dir
        self.n = 0

    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    async def incr(self):
        self.n += 1
        return self.n

    @endpoint
    def sleep(self, seconds):
        self._entered("sleep")
        time.sleep(seconds)      # sleep: the endpoint's work is to be busy this long
        return "woke"

    @endpoint
    async def call_other(self, other, method, *args):
        return await getattr(other, method).call_one(*args)

    @endpoint
    def exit_now(self, code):
        os._exit(code)

    @endpoint
    async def block_loop_ignoring_sigterm(self, seconds):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self._entered("block_loop")
        time.sleep(seconds)      # sleep: blocks the process's event loop: it cannot answer stop

    def _entered(self, endpoint_name):
        """A mark the test waits on: this process is inside ``endpoint_name`` now."""
        if self.marker_dir:
            open(os.path.join(self.marker_dir, f"{endpoint_name}-{os.getpid()}"), "w").close()

    def __cleanup__(self, exc):
        if self.marker_dir:
            from hpcmesh.actor import current_rank
            with open(os.path.join(self.marker_dir, f"cleanup-{current_rank().rank}"), "w") as f:
                f.write("clean")


def test_kill9_fails_in_flight_call_and_later_calls(tmp_path):
    pm = this_host().spawn_procs(per_host={"gpus": 3}, name="kill9")
    try:
        v = pm.spawn("victim", Victim, str(tmp_path))
        pids = v.pid.call().get(timeout=30).values()
        in_flight = v.slice(gpus=1).sleep.call_one(60)
        wait_until((tmp_path / f"sleep-{pids[1]}").exists, 30, "the victim is in its call")
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(SupervisionError) as ei:
            in_flight.get(timeout=10)
        assert time.monotonic() - t0 < 5
        e = ei.value
        assert e.mesh == "kill9" and e.pid == pids[1] and e.point["gpus"] == 1
        assert e.host and "SIGKILL" in e.exit_status
        msg = str(e)
        for part in ("kill9", "gpus=1", str(pids[1]), "SIGKILL", e.host):
            assert part in msg, (part, msg)
        # calls after the death fail at once, with the same precise error
        t1 = time.monotonic()
        with pytest.raises(SupervisionError, match="SIGKILL"):
            v.slice(gpus=1).incr.call_one().get(timeout=10)
        with pytest.raises(SupervisionError, match="SIGKILL"):
            v.incr.call().get(timeout=10)
        assert time.monotonic() - t1 < 1
        # the other processes keep working
        # (the mesh-wide call above still reached the live members)
        assert v.slice(gpus=0).incr.call_one().get(timeout=10) == 2
        assert v.slice(gpus=2).incr.call_one().get(timeout=10) == 2
        assert v.slice(gpus=2).pid.call_one().get(timeout=10) == pids[2]
    finally:
        pm.stop().get(timeout=30)


def test_actor_calling_a_dead_actor_gets_a_bounded_failure(tmp_path):
    pm = this_host().spawn_procs(per_host={"gpus": 3}, name="a2a")
    try:
        v = pm.spawn("v", Victim, str(tmp_path))
        pids = v.pid.call().get(timeout=30).values()
        caller = v.slice(gpus=0)
        # connected first, then the target dies while the call is pending
        assert caller.call_other.call_one(v.slice(gpus=1), "incr").get(timeout=10) == 1
        pending = caller.call_other.call_one(v.slice(gpus=1), "sleep", 60)
        wait_until((tmp_path / f"sleep-{pids[1]}").exists, 30, "the target is in the call")
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(ActorError) as ei:
            pending.get(timeout=15)
        assert ei.value.remote_type == "SupervisionError"
        assert time.monotonic() - t0 < 5
        # never contacted, already dead: the dial fails, the call fails (does not hang)
        os.kill(pids[2], signal.SIGKILL)
        assert wait_gone([pids[2]], 10) == []
        t0 = time.monotonic()
        with pytest.raises(ActorError) as ei:
            caller.call_other.call_one(v.slice(gpus=2), "incr").get(timeout=15)
        assert ei.value.remote_type == "SupervisionError"
        assert "cannot reach" in str(ei.value)
        assert time.monotonic() - t0 < 5
        assert caller.incr.call_one().get(timeout=10) == 1
    finally:
        pm.stop().get(timeout=30)


def test_process_that_exits_by_itself(unhandled_faults):
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="exiter")
    try:
        v = pm.spawn("v", Victim)
        pids = v.pid.call().get(timeout=30).values()
        t0 = time.monotonic()
        with pytest.raises(SupervisionError) as ei:
            v.slice(gpus=0).exit_now.call_one(3).get(timeout=10)
        assert time.monotonic() - t0 < 5
        assert "exit code 3" in str(ei.value) and str(pids[0]) in str(ei.value)
        assert ei.value.exit_status == "exit code 3"
        assert v.slice(gpus=1).incr.call_one().get(timeout=10) == 1
        # nobody owns the mesh but the controller: its unhandled_fault_hook is told
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                f.mesh_name == "exiter" for f in unhandled_faults):
            time.sleep(0.05)
        failure = next(f for f in unhandled_faults if f.mesh_name == "exiter")
        assert failure.pid == pids[0] and failure.exit_status == "exit code 3"
        assert "exit code 3" in failure.report() and str(pids[0]) in failure.report()
    finally:
        pm.stop().get(timeout=30)


def test_stop_runs_cleanup_and_leaves_no_process(tmp_path):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    v = pm.spawn("v", Victim, str(tmp_path))
    pids = v.pid.call().get(timeout=30).values()
    async def stop():
        return await pm.stop()
    codes = asyncio.run(stop())                 # `await procs.stop()` from user code
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cleanup-0", "cleanup-1"]
    assert (tmp_path / "cleanup-1").read_text() == "clean"
    assert set(codes.values()) == {0}
    assert wait_gone(pids, 2) == []
    with pytest.raises(RuntimeError, match="stopped"):
        pm.spawn("again", Victim)
    with pytest.raises(SupervisionError, match="stopped"):
        v.incr.call().get(timeout=10)


def test_stop_right_after_spawn_waits_for_the_start_and_leaves_no_process():
    # stop() before the processes exist: it used to return at once, and the processes the
    # agent was starting outlived it; a SIGTERM before a forked child's setpgid was lost.
    for grace in (5.0, 5.0, 0.0):     # a grace of 0 must not skip the wait for the start
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        codes = pm.stop(grace=grace).get(timeout=30)
        pids = [r.pid for r in pm.records]
        assert all(isinstance(pid, int) for pid in pids), pids
        assert wait_gone(pids, 2) == []
        assert len(codes) == 2
        if grace:
            # stopped by the request or by SIGTERM (caught: 143), never left for the SIGKILL
            assert set(codes.values()) <= {0, -signal.SIGTERM, 128 + signal.SIGTERM}, codes


def test_stop_force_kills_hung_processes(tmp_path):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    v = pm.spawn("v", Victim, str(tmp_path))
    pids = v.pid.call().get(timeout=30).values()
    v.slice(gpus=0).sleep.call_one(600)                        # a hung sync endpoint
    v.slice(gpus=1).block_loop_ignoring_sigterm.call_one(600)  # a hung loop, SIGTERM ignored
    wait_until(lambda: (tmp_path / f"sleep-{pids[0]}").exists()
               and (tmp_path / f"block_loop-{pids[1]}").exists(), 30, "both are hung")
    t0 = time.monotonic()
    pm.stop(grace=1.0).get(timeout=30)
    assert time.monotonic() - t0 < 6
    assert wait_gone(pids, 2) == []
    # the process with the hung sync endpoint still stopped cleanly
    assert (tmp_path / "cleanup-0").exists()


CONTROLLER = textwrap.dedent("""
    import os, sys, time
    from hpcmesh.actor import Actor, endpoint, this_host, attach_to_workers

    class P(Actor):
        @endpoint
        def pid(self):
            return os.getpid()

    if len(sys.argv) > 1:
        hosts = attach_to_workers([sys.argv[1]], secret=bytes.fromhex(sys.argv[2]))
    else:
        hosts = this_host()
    pm = hosts.spawn_procs(per_host={"gpus": 2})
    a = pm.spawn("p", P)
    print(*a.pid.call().get(timeout=60).values(), flush=True)
    time.sleep(600)      # sleep: a controller that lives on until the test kills it
""")


def _run_controller(tmp_path, *args):
    env = dict(os.environ, HPCMESH_LEASE_GRACE="2", HPCMESH_LOG_DIR=str(tmp_path / "logs"))
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    p = subprocess.Popen([sys.executable, str(script), *args], env=env, stdout=subprocess.PIPE,
                         stderr=open(tmp_path / "controller.err", "wb"), text=True)
    line = p.stdout.readline()
    assert line.strip(), (tmp_path / "controller.err").read_text()
    return p, [int(x) for x in line.split()]


def test_controller_killed_leaves_no_workers(tmp_path):
    controller, pids = _run_controller(tmp_path)
    try:
        assert len(pids) == 2 and all(alive(p) for p in pids)
        controller.kill()
        controller.wait()
        left = wait_gone(pids, 2 + 3)
        assert left == [], f"workers {left} outlived their controller"
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_standalone_agent_exits_with_its_procs_when_the_client_dies(tmp_path):
    from hpcmesh.transport.addresses import new_secret
    secret = new_secret()
    ready = tmp_path / "agent.addr"
    env = dict(os.environ, HPCMESH_SECRET=secret.hex(), HPCMESH_LOG_DIR=str(tmp_path / "logs"))
    agent = subprocess.Popen(
        [sys.executable, "-c",
         "from hpcmesh.runtime.process.worker import run_worker_loop_forever; "
         f"print(run_worker_loop_forever('tcp://0.0.0.0:0', grace=2, ready_file={str(ready)!r}))"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        deadline = time.monotonic() + 20
        while not (ready.exists() and ready.read_text().strip()):
            assert agent.poll() is None and time.monotonic() < deadline, agent.stderr.read()
            time.sleep(0.05)
        addr = ready.read_text().split()[0]
        assert "0.0.0.0" not in addr          # a wildcard listener advertises a real address
        client, pids = _run_controller(tmp_path, addr, secret.hex())
        assert all(alive(p) for p in pids)
        client.kill()
        client.wait()
        t0 = time.monotonic()
        out, err = agent.communicate(timeout=2 + 5)
        assert time.monotonic() - t0 < 2 + 3
        assert "controller gone" in out + err
        assert wait_gone(pids, 1) == []
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_supervision_error_is_picklable_and_descriptive():
    import pickle
    e = SupervisionError("proc gpus=1 died", "m", None, "h", 12, "killed by SIGKILL")
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.mesh, e2.host, e2.pid, e2.exit_status) == ("m", "h", 12, "killed by SIGKILL")
    a = ActorError("KeyError", "x", "tb", None, "A", "f")
    assert pickle.loads(pickle.dumps(a)).endpoint == "f"


def test_wait_for_fault_hook_returns_once_the_hook_ran_for_what_was_offered(monkeypatch):
    """The hook runs on a thread of its own: a test that checks what reached it (or that
    nothing did) waits for that thread with ``ClientRuntime.wait_for_fault_hook``."""
    import threading

    import hpcmesh.actor
    from hpcmesh.runtime.client import client_runtime
    from hpcmesh.runtime.errors import MeshFailure
    release, ran = threading.Event(), []

    def slow_hook(failure):
        release.wait(10)
        ran.append(failure)
    monkeypatch.setattr(hpcmesh.actor, "unhandled_fault_hook", slow_hook)
    rt = client_runtime()
    rt.wait_for_fault_hook(timeout=10)          # nothing pending: returns
    failure = MeshFailure("m", SupervisionError("proc gpus=0 died", "m"))
    rt.report_failure(None, failure)
    with pytest.raises(TimeoutError):
        rt.wait_for_fault_hook(timeout=0.2)     # the hook is still running
    release.set()
    rt.wait_for_fault_hook(timeout=10)
    assert ran == [failure]


def test_agent_stops_on_sigterm_even_with_a_controller_attached(tmp_path):
    """scancel/the batch script send SIGTERM: the agent must end at once, not after KillWait."""
    import subprocess
    import sys as _sys

    from hpcmesh.actor import attach_to_workers
    secret = os.urandom(32)
    ready = tmp_path / "ready"
    w = subprocess.Popen([_sys.executable, "-c",
                          "from hpcmesh.runtime.process.worker "
                          "import run_worker_loop_forever as f; "
                          f"f('tcp://127.0.0.1:0', grace=30, ready_file={str(ready)!r})"],
                         env=dict(os.environ, HPCMESH_SECRET=secret.hex()))
    try:
        deadline = time.monotonic() + 20
        while not (ready.exists() and ready.read_text().endswith("\n")):
            assert time.monotonic() < deadline, "agent never wrote its ready file"
            time.sleep(0.05)
        hosts = attach_to_workers([ready.read_text().split()[0]], secret=secret)
        assert len(hosts.hostnames) == 1
        w.terminate()
        assert w.wait(5) == 0
    finally:
        if w.poll() is None:
            w.kill()
