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
    ("boom", "default", ["The actor Doomed doomed{'gpus': 0/1} and all its descendants have "
                         "failed", "ValueError: nobody was told", "broadcast()"]),
    ("die", "default", ["doomed_procs", "exit code 7"]),
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
                           r"actor Stuck stuck\{'gpus': 0/2\} and all its descendants have "
                           r"failed: ValueError: failed while calls were queued"):
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
