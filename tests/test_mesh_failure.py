"""Actor failures as Monarch has them (real processes): what the default
``unhandled_fault_hook`` does to the client, and that no call waits for a failed actor."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from proc_helpers import processes_with_env, wait_gone, wait_until

from hpcmesh.actor import Actor, MeshFailure, SupervisionError, endpoint, this_host

_PROGRAM = textwrap.dedent("""
    import os, sys, time
    import hpcmesh.actor
    from hpcmesh.actor import Actor, endpoint, this_host

    class Doomed(Actor):
        @endpoint
        def boom(self):
            raise ValueError("nobody was told")

        @endpoint
        def die(self):
            os._exit(7)

    if sys.argv[2] == "raising hook":
        def hook(failure):
            raise RuntimeError("my hook gave up")
        hpcmesh.actor.unhandled_fault_hook = hook
    doomed = this_host().spawn_procs(per_host={"gpus": 1}, name="doomed_procs").spawn(
        "doomed", Doomed)
    doomed.initialized.get(timeout=60)
    getattr(doomed, sys.argv[1]).broadcast()
    try:
        time.sleep(60)      # sleep: where the failure interrupts the controller's own code
    finally:
        print("finally ran", flush=True)
    print("not reached")
""")


@pytest.mark.parametrize("fault, hook, words", [
    ("boom", "default", ["The actor <__main__.Doomed doomed{'gpus': 0/1}> and all its "
                         "descendants have failed", "ValueError: nobody was told",
                         "broadcast()"]),
    ("die", "default", ["The actor <__main__.Doomed doomed{'gpus': 0/1}> and all its "
                        "descendants have failed: the process this actor was running on "
                        "exited with non-zero code 7", "doomed_procs", "exit code 7"]),
    ("boom", "raising hook", ["unhandled_fault_hook raised RuntimeError: my hook gave up"]),
])
def test_an_unhandled_fault_ends_the_client_as_in_monarch(tmp_path, fault, hook, words):
    # Monarch's default hook exits the client: its main thread gets a KeyboardInterrupt
    # (finally blocks and atexit run) and it dies of SIGINT; so does a hook that raises
    script = tmp_path / "client.py"
    script.write_text(_PROGRAM)
    mark = f"HPCMESH_TEST_MARK_{uuid.uuid4().hex}"
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, str(script), fault, hook], capture_output=True,
                         text=True, timeout=90, env=dict(os.environ, **{mark: "1"}))
    assert run.returncode == -signal.SIGINT, run.stderr[-3000:]
    assert time.monotonic() - t0 < 45
    assert run.stdout == "finally ran\n"
    assert "Unhandled hpcmesh error on the controller" in run.stderr, run.stderr[-3000:]
    for w in words:
        assert w in run.stderr, run.stderr[-3000:]
    assert wait_gone(processes_with_env(mark), timeout=10) == []


class Stuck(Actor):
    def __init__(self):
        self.never = None

    @endpoint(concurrent=True)
    async def wait_forever(self) -> None:
        self.never = asyncio.Event()
        await self.never.wait()

    @endpoint
    async def slow_boom(self) -> None:
        await asyncio.sleep(0.5)    # sleep: the calls sent after it queue meanwhile
        raise ValueError("failed while calls were queued")

    @endpoint
    async def ping(self) -> str:
        return "pong"


@pytest.fixture(scope="module")
def procs():
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=30)


def test_no_call_waits_for_a_failed_actor(procs, unhandled_faults):
    stuck = procs.spawn("stuck", Stuck)
    one = stuck.slice(gpus=0)
    running = one.wait_forever.call_one()        # in progress when the actor fails
    one.slow_boom.broadcast()
    queued = [one.ping.call_one() for _ in range(20)]
    t0 = time.monotonic()
    for f in [running, *queued]:
        with pytest.raises(SupervisionError, match=r"Endpoint call stuck\.\w+\(\) failed, The "
                           r"actor <test_mesh_failure\.Stuck stuck\{'gpus': 0/2\}> and all "
                           r"its descendants have failed: ValueError: failed while calls "
                           r"were queued"):
            f.get(timeout=10)
    assert time.monotonic() - t0 < 5
    with pytest.raises(SupervisionError, match="stuck"):
        stuck.ping.call().get(timeout=10)           # the mesh's call() includes it
    assert stuck.slice(gpus=1).ping.call_one().get(timeout=10) == "pong"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(f.mesh_name == "stuck"
                                                  for f in unhandled_faults):
        time.sleep(0.05)
    failure = next(f for f in unhandled_faults if f.mesh_name == "stuck")
    assert isinstance(failure, MeshFailure) and failure.point.rank == 0
    # the message, then its class (SPEC §12) on a line of its own
    assert failure.report() == f"{failure.error.message}\nfailure class: user exception"
    assert "stuck" in str(failure)


class Leaf(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Spawner(Actor):
    """Spawns processes and actors of its own, then fails."""

    @endpoint
    def grow(self) -> list:
        self.procs = this_host().spawn_procs(per_host={"gpus": 2})
        self.leaves = self.procs.spawn("leaves", Leaf)
        return self.leaves.pid.call().get(timeout=60).values()

    @endpoint
    def boom(self) -> None:
        raise ValueError("the owner fails")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_failed_actor_takes_its_descendants_with_it(procs, unhandled_faults):
    spawner = procs.spawn("spawner", Spawner).slice(gpus=0)
    pids = spawner.grow.call_one().get(timeout=120)
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    before = len(unhandled_faults)
    spawner.boom.broadcast()                   # nobody could be told: the actor fails
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "what the failed actor spawned lives on"
    wait_until(lambda: any(f.mesh_name == "spawner" for f in unhandled_faults[before:]), 10,
               "the owner's failure is reported")
    time.sleep(0.5)     # sleep: a wrong report of its descendants would come in meanwhile
    reported = [f for f in unhandled_faults[before:]]
    # the owner's failure is reported; its descendants' stopping is no failure of its own
    assert [f.mesh_name for f in reported] == ["spawner"], [str(f) for f in reported]


class Kid(Actor):
    @endpoint
    def die(self) -> None:
        os._exit(7)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Guardian(Actor):
    """Spawns actors on processes the client gave it, and handles their failures."""

    def __init__(self):
        self.seen: list = []

    @endpoint
    async def adopt(self, kid_procs, name: str = "kids") -> list:
        self.kids = getattr(self, "kids", {})
        self.kids[name] = kid_procs.spawn(name, Kid)
        return list((await self.kids[name].pid.call()).values())

    @endpoint
    async def kill(self, gpus: int, name: str = "kids") -> None:
        self.kids[name].slice(gpus=gpus).die.broadcast()

    @endpoint
    async def seen_failures(self) -> list:
        return [(f.mesh_name, f.point.rank, f.exit_status, f.pid, "and all its descendants "
                 "have failed" in f.report()) for f in self.seen]

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(failure)
        return True


def test_an_actor_supervises_its_actors_on_processes_it_was_given(procs, unhandled_faults):
    # SPEC §3: the owner is the actor that spawned the mesh, whatever ProcMesh it spawned
    # it on; its processes' host agents tell it of their deaths (they belong to the client)
    given = this_host().spawn_procs(per_host={"gpus": 2}, name="given")
    stopped = this_host().spawn_procs(per_host={"gpus": 2}, name="given_then_stopped")
    canary = this_host().spawn_procs(per_host={"gpus": 1}, name="given_canary")
    try:
        guardian = procs.slice(gpus=0).spawn("guardian", Guardian)
        calm = procs.slice(gpus=1).spawn("calm", Guardian)
        pids = guardian.adopt.call_one(given).get(timeout=60)
        calm.adopt.call_one(stopped, "on_stopped").get(timeout=60)
        calm.adopt.call_one(canary, "on_canary").get(timeout=60)
        guardian.kill.call_one(1).get(timeout=10)
        wait_until(lambda: guardian.seen_failures.call_one().get(timeout=10), 20,
                   "the owner's __supervise__ hears of the death")
        assert guardian.seen_failures.call_one().get(timeout=10) == [
            ("kids", 1, "exit code 7", pids[1], True)]
        # the client owns the processes: it is told of the death of one, as ever
        wait_until(lambda: any(f.mesh_name == "given" for f in unhandled_faults), 10,
                   "the processes' owner is told")
        stopped.stop().get(timeout=30)      # stopped by their owner: no failure of its actors
        # the canary's death is told after the stop's exits (one agent, in order): once it
        # is in, a wrong report of the stop would be too
        calm.kill.call_one(0, "on_canary").get(timeout=10)
        wait_until(lambda: calm.seen_failures.call_one().get(timeout=10), 20,
                   "the canary's death is told")
        assert [f[0] for f in calm.seen_failures.call_one().get(timeout=10)] == ["on_canary"]
        assert not any(f.mesh_name.startswith(("guardian", "calm", "kids", "on_"))
                       for f in unhandled_faults)
    finally:
        for p in (given, stopped, canary):
            p.stop().get(timeout=30)


class Flaky(Actor):
    @endpoint
    def boom(self) -> None:
        raise ValueError("child went wrong")

    @endpoint
    def ping(self) -> str:
        return "pong"


class SyncParent(Actor):
    """A sync actor with no __supervise__ whose call outlives its child's failure."""

    def __init__(self, kid_procs):
        self.kid = kid_procs.spawn("flaky", Flaky)

    @endpoint
    def trigger(self) -> str:
        self.kid.boom.broadcast()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.kid.ping.call_one().get(timeout=10)
            except SupervisionError:    # the child's failure reached this process before
                return "sent"
        return "the child never failed"

    @endpoint
    def ping(self) -> str:
        return "pong"


def test_a_child_failure_fails_a_sync_parent_between_its_calls(procs, unhandled_faults):
    # Monarch: the sync parent hears of it after its running call returned; that call
    # returns to its caller, the failure goes to supervision (unhandled_fault_hook)
    kid_procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        parent = procs.slice(gpus=0).spawn("sync_parent", SyncParent, kid_procs)
        assert parent.trigger.call_one().get(timeout=60) == "sent"
        wait_until(lambda: any(f.mesh_name == "sync_parent" for f in unhandled_faults), 10,
                   "the parent's failure reaches the hook")
        with pytest.raises(SupervisionError, match="child went wrong"):
            parent.ping.call_one().get(timeout=10)
    finally:
        kid_procs.stop().get(timeout=30)


class Marks(Actor):
    def __init__(self, path: str):
        self.path = path

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc) -> None:
        with open(self.path, "a") as f:
            f.write("cleanup\n")


class Forgetful(Actor):
    """Spawns an actor mesh on processes it was given and keeps no reference to it."""

    @endpoint
    async def spawn_and_forget(self, given, path: str) -> str:
        mesh = given.spawn("forgotten", Marks, path)
        return await mesh.ping.call_one()

    @endpoint
    async def boom(self) -> None:
        raise ValueError("the owner fails")


@pytest.mark.parametrize("how", ["stopped", "failed"])
def test_an_actor_takes_the_meshes_it_spawned_on_given_processes_along(
        procs, unhandled_faults, tmp_path, how):
    # what an actor spawned ends with it, also on processes it was given (their owner is
    # the client) and when it no longer holds the mesh (Monarch's recursive stop)
    given = this_host().spawn_procs(per_host={"gpus": 1})
    path = tmp_path / "cleanup"
    try:
        owner = procs.slice(gpus=0).spawn(f"forgetful_{how}", Forgetful)
        assert owner.spawn_and_forget.call_one(given, str(path)).get(timeout=60) == "pong"
        if how == "stopped":
            owner.stop().get(timeout=30)
        else:
            owner.boom.broadcast()
        wait_until(lambda: path.exists() and path.read_text() == "cleanup\n", 20,
                   "the forgotten mesh's __cleanup__ runs")
    finally:
        given.stop().get(timeout=30)
