"""A host agent killed with SIGKILL is a lost host: its processes' loss reaches the owner
(real processes: ProcessJob hosts, each a ``hpcmesh worker`` of its own).

Before, the processes ended (their lease watchdog saw the agent go) but nobody was told:
no MeshFailure reached ``__supervise__`` or ``unhandled_fault_hook``, and pending calls
failed only with a generic "connection lost"."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from proc_helpers import alive, wait_gone, wait_until

from hpcmesh.actor import Actor, SupervisionError, endpoint
from hpcmesh.job import ProcessJob
from hpcmesh.runtime.client import client_runtime
from hpcmesh.runtime.errors import AGENT_EXITED, HOST_LOST

#: SPEC §3: a dead process fails what is pending on it within 5 s; the margin is for a
#: loaded test machine.
BOUND_S = 5.0
MARGIN_S = 3.0


class Sleeper(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def sleep(self, seconds: float) -> str:
        await asyncio.sleep(seconds)    # sleep: the endpoint's work is to take this long
        return "woke"


class Owner(Actor):
    """Spawns a mesh of its own on the hosts it is given and records what it is told."""

    def __init__(self):
        self.failures = []

    @endpoint
    async def start(self, hosts) -> list[int]:
        self.procs = hosts.spawn_procs({"gpus": 2}, name="owned")
        self.sleepers = self.procs.spawn("sleepers", Sleeper)
        return (await self.sleepers.pid.call()).values()

    @endpoint
    def seen(self) -> list[tuple]:
        return [(f.mesh_name, f.host, f.reason, f.report()) for f in self.failures]

    def __supervise__(self, failure) -> bool:
        self.failures.append(failure)
        return True


def test_killing_an_agent_fails_its_calls_and_tells_the_unhandled_fault_hook(unhandled_faults):
    job = ProcessJob({"hosts": 2})
    state = job.state(cached_path=None)
    agents = job.pids["hosts"]
    pids: list[int] = []
    try:
        procs = state.hosts.spawn_procs({"gpus": 2}, name="hostloss")
        mesh = procs.spawn("sleepers", Sleeper)
        pids = mesh.pid.call().get(timeout=60).values()
        lost_pids = pids[2:]                         # host 1's two processes
        pending = mesh.slice(hosts=1, gpus=0).sleep.call_one(60)
        before = len(unhandled_faults)
        t0 = time.monotonic()
        os.kill(agents[1], signal.SIGKILL)

        with pytest.raises(SupervisionError) as ei:
            pending.get(timeout=BOUND_S + MARGIN_S)
        took = time.monotonic() - t0
        err = ei.value
        print(f"\nthe pending call failed {took:.2f} s after the agent was killed: {err}")
        assert took < BOUND_S + MARGIN_S
        assert err.reason == HOST_LOST and err.mesh == "hostloss"
        assert err.pid == lost_pids[0] and err.point["hosts"] == 1 and err.host
        assert f"pid {agents[1]}" in str(err) and "host agent" in str(err), str(err)

        # one MeshFailure for the mesh, naming the host and its agent, however many
        # processes it had there
        got = wait_until(lambda: [f for f in unhandled_faults[before:]
                                  if f.mesh_name == "hostloss"], BOUND_S + MARGIN_S,
                         "the hook is told of the host's loss")
        took = time.monotonic() - t0
        print(f"unhandled_fault_hook told {took:.2f} s after the kill: {got}")
        assert len(got) == 1, got
        failure = got[0]
        assert failure.reason == HOST_LOST and failure.host == err.host
        assert f"pid {agents[1]}" in failure.report() and "lost" in failure.report()
        for p in lost_pids:
            assert str(p) in failure.report(), failure.report()
        assert wait_gone(lost_pids, 10) == []
        # host 0 goes on, and is not reported
        assert mesh.slice(hosts=0).pid.call().get(timeout=30).values() == pids[:2]
        # stop() does not wait on the lost host, nor warn about it: it knows no exit code
        codes = procs.stop(grace=0.5).get(timeout=30)
        assert sorted(codes.values(), key=str) == [0, 0, None, None], codes
        assert len([f for f in unhandled_faults[before:] if f.mesh_name == "hostloss"]) == 1
    finally:
        job.kill()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_killing_an_agent_reaches_the_owning_actors_supervise(unhandled_faults):
    job = ProcessJob({"parent": 1, "hosts": 1})
    state = job.state(cached_path=None)
    leaf_agent = job.pids["hosts"][0]
    before = len(unhandled_faults)
    try:
        parent_procs = state.parent.spawn_procs(name="parentprocs")
        owner = parent_procs.spawn("owner", Owner).slice(hosts=0)
        leaf_pids = owner.start.call_one(state.hosts).get(timeout=60)
        t0 = time.monotonic()
        os.kill(leaf_agent, signal.SIGKILL)
        seen = wait_until(lambda: owner.seen.call_one().get(timeout=10), BOUND_S + MARGIN_S,
                          "__supervise__ is told of the host's loss")
        took = time.monotonic() - t0
        print(f"\n__supervise__ told {took:.2f} s after the agent was killed: {seen}")
        assert len(seen) == 1, seen
        mesh_name, host, reason, report = seen[0]
        assert mesh_name == "owned" and reason == HOST_LOST and host
        assert f"pid {leaf_agent}" in report and all(str(p) in report for p in leaf_pids)
        assert wait_gone(leaf_pids, 10) == []
        # handled by its owner: nothing reached the controller's hook
        assert [f for f in unhandled_faults[before:] if f.mesh_name == "owned"] == []
    finally:
        job.kill()


def test_an_agent_stopped_by_a_signal_is_no_lost_host(unhandled_faults):
    """SIGTERM is how Slurm ends a job's steps (scancel, a time limit): the agent kills its
    processes on purpose and says so first. That is the job's lifecycle (SPEC §12), not a
    lost host: no MeshFailure; the pending call fails at once, saying why."""
    job = ProcessJob({"hosts": 1})
    state = job.state(cached_path=None)
    agent = job.pids["hosts"][0]
    before = len(unhandled_faults)
    try:
        procs = state.hosts.spawn_procs({"gpus": 2}, name="agentstop")
        mesh = procs.spawn("sleepers", Sleeper)
        pids = mesh.pid.call().get(timeout=60).values()
        pending = mesh.slice(gpus=1).sleep.call_one(60)
        os.kill(agent, signal.SIGTERM)
        with pytest.raises(SupervisionError) as ei:
            pending.get(timeout=BOUND_S + MARGIN_S)
        err = ei.value
        print(f"\n{err}")
        assert err.reason == AGENT_EXITED and "SIGTERM" in str(err) and err.pid == pids[1]
        assert wait_gone(pids, 10) == []
        wait_until(lambda: not alive(agent), 10, "the agent has exited")
        # the agent's word came before its connection closed: nothing of the mesh is left
        # for a lost host to take, and what was offered to the hook has run
        assert all(r.stopping for r in procs.records)
        client_runtime().node.run_sync(asyncio.sleep(0))
        client_runtime().wait_for_fault_hook(timeout=10)
        assert [f for f in unhandled_faults[before:] if f.mesh_name == "agentstop"] == []
        procs.stop(grace=0.5).get(timeout=30)
    finally:
        job.kill()
