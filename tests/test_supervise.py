"""Actors that own meshes: __supervise__ handles or passes on the failure of what they spawned."""

import os
import signal

from proc_helpers import wait_until

from hpcmesh.actor import Actor, SupervisionError, endpoint, this_host


class Leaf(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Parent(Actor):
    """Spawns two processes of its own; optionally handles their failures."""

    def __init__(self, handle: bool):
        self.handle = handle
        self.events = []

    @endpoint
    async def start(self) -> list[int]:
        self.procs = this_host().spawn_procs({"leaf": 2})
        self.leaves = self.procs.spawn("leaf", Leaf)
        return (await self.leaves.pid.call()).values()

    @endpoint
    def seen(self) -> list[str]:
        return self.events

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __supervise__(self, event) -> bool:
        self.events.append(f"{type(event).__name__}: {event}")
        return self.handle


def test_owner_handles_the_failure_of_its_child():
    procs = this_host().spawn_procs({"parents": 1})
    try:
        parent = procs.spawn("parent", Parent, True).slice(parents=0)
        leaf_pids = parent.start.call_one().get(timeout=60)
        assert len(leaf_pids) == 2 and os.getpid() not in leaf_pids
        os.kill(leaf_pids[1], signal.SIGKILL)
        events = wait_until(lambda: parent.seen.call_one().get(timeout=30), 15,
                            "the parent's __supervise__ is told")
        assert len(events) == 1 and "SIGKILL" in events[0] and str(leaf_pids[1]) in events[0]
        assert events[0].startswith("MeshFailure: MeshFailure(mesh_name=procs")
        assert parent.ping.call_one().get(timeout=30) == "pong"    # handled: nothing raised
    finally:
        procs.stop().get(timeout=30)


def test_unhandled_failure_reaches_the_controller_and_nothing_is_left():
    procs = this_host().spawn_procs({"parents": 1})
    try:
        parent = procs.spawn("parent", Parent, False).slice(parents=0)
        leaf_pids = parent.start.call_one().get(timeout=60)
        os.kill(leaf_pids[0], signal.SIGKILL)

        def raised():
            try:
                parent.ping.call_one().get(timeout=30)
            except SupervisionError as e:
                return e
            return None
        err = wait_until(raised, 15, "the controller hears of the unhandled failure")
        assert "did not handle" in str(err) and str(leaf_pids[0]) in str(err)
    finally:
        procs.stop().get(timeout=30)
    # the surviving leaf was the parent's: stopping the parent's process takes it too
    def gone():
        try:
            os.kill(leaf_pids[1], 0)
        except ProcessLookupError:
            return True
        return False
    wait_until(gone, 10, "the surviving leaf is gone with its parent's process")
