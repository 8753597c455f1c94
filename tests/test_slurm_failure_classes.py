"""Every failure says its class (SPEC §12; issue 31 item 4), produced for real on the Slurm
test cluster through a ``SlurmJob``: an actor past its job's ``mem`` (Slurm's
``ConstrainRAMSpace``: the step's memory cgroup, whose OOM killer ends it), told apart from
a plain ``kill -9`` in the same job; a gloo all_reduce across two nodes that one rank never
joins; user code that raises. ``MeshFailure.report()`` ends with ``failure class: <class>``
and the failure's ``reason`` (what the telemetry tables record as ``failure_class``) is it.

tests/test_failure_classes.py produces the same classes on this machine (its own memory
cgroup, gloo on ``lo``); this file shows they hold where the cluster, not the test, set
the limits and the network.
"""

from __future__ import annotations

import os
import signal
import socket

import pytest
from ci_gate import import_or_skip
from proc_helpers import wait_until
from test_failure_classes import Hog, _failures_of, _says
from test_slurm_e2e import _job, cluster  # noqa: F401 - cluster is a fixture

from hpcmesh.actor import Actor, ActorError, SupervisionError, endpoint
from hpcmesh.runtime.errors import (COLLECTIVE_TIMEOUT, OUT_OF_MEMORY, SIGNAL,
                                    USER_EXCEPTION)

# each waits in a queue other test runs share
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

#: The job's memory (its step's memory cgroup limit): the agent, its fork server and two
#: actor processes fit; an actor that touches ``HOG_MIB`` does not.
JOB_MEM = "700M"
HOG_MIB = 2048


class Probe(Actor):
    """Beside test_failure_classes' Hog on the same processes: where each runs, and code
    that raises."""

    @endpoint
    def where(self) -> tuple[str, int]:
        return socket.gethostname(), os.getpid()

    @endpoint
    def memory_cgroup(self) -> str:
        """This process's memory cgroup, as its node sees it."""
        with open("/proc/self/cgroup") as f:
            return next(ln.split(":", 2)[2] for ln in f.read().splitlines()
                        if "memory" in ln.split(":")[1].split(","))

    @endpoint
    def boom(self) -> None:
        raise KeyError("a bug in the user's endpoint")


def _slurm_counted_oom_kills(job) -> list[str]:
    """Slurm's own word on the OOM kills in the job's agent step, once the step ended:
    slurmstepd's line in the job's stderr log."""
    def said() -> list[str] | None:
        try:
            with open(job.log_paths()[0][:-4] + ".err") as f:
                lines = [ln for ln in f.read().splitlines() if "oom-kill event" in ln]
        except FileNotFoundError:
            return None
        return lines or None
    return wait_until(said, 60, f"slurmstepd says how many OOM kills job {job.job_id} had")


def _telemetry_classes(state, pids: list[int]) -> dict[int, str] | None:
    """pid -> failure_class of the failed processes' rows, once all of ``pids`` have one."""
    rows = state.query_engine.query(
        "SELECT pid, failure_class FROM process_status_events WHERE new_status = 'failed'"
    ).to_pylist()
    got = {r["pid"]: r["failure_class"] for r in rows}
    return got if set(pids) <= set(got) else None


def test_an_actor_past_the_jobs_mem_is_out_of_memory_and_a_kill_9_is_not(
        cluster, unhandled_faults):
    """``SlurmJob(mem=...)``: Slurm's task/cgroup limits the agent step's memory cgroup to
    it (ConstrainRAMSpace); an actor that touches far more is ended by the kernel's OOM
    killer there, which the node's host agent reads in that cgroup (oom.py, inside the
    node's cgroup namespace). A kill -9 of the other actor in the same cgroup is a signal;
    an endpoint that raises is the user's. Slurm counts exactly the one OOM kill.

    The agent's count is the only word in time: Slurm says its own (slurmstepd's "Detected
    1 oom-kill event(s)", srun's "Out Of Memory") only once the agent step ends, in the
    job's stderr log, and the job's state stays COMPLETED (Slurm 22.05 sets OUT_OF_MEMORY
    on a job only for a kill in its batch step)."""
    import_or_skip("datafusion")
    from hpcmesh.telemetry import TelemetryConfig
    job = _job("oom", cluster, mem=JOB_MEM, grace=10)
    job.enable_telemetry(TelemetryConfig())
    try:
        state = job.state(cached_path=None)
        procs = state.hosts.spawn_procs({"gpus": 2}, name="oom_procs")
        hogs = procs.spawn("hogs", Hog)
        probes = procs.spawn("probes", Probe)
        where = probes.where.call().get(timeout=60).values()
        cgroups = probes.memory_cgroup.call().get(timeout=60).values()
        print(f"\nhogs on {where}, memory cgroups {cgroups}")
        # the step's memory cgroup (Slurm's task/cgroup), not the test machine's
        assert all(f"/job_{job.job_id}/step_0/" in cg for cg in cgroups), cgroups

        # user code that raises: the caller's error and the failure are the user's
        before = len(unhandled_faults)
        with pytest.raises(ActorError) as ei:
            probes.slice(gpus=1).boom.call_one().get(timeout=60)
        assert ei.value.reason == USER_EXCEPTION, str(ei.value)
        probes.slice(gpus=1).boom.broadcast()     # nobody to tell: the actor fails
        failure = _failures_of(unhandled_faults, before, "probes")[0]
        _says(failure, USER_EXCEPTION)
        assert "KeyError" in failure.report()

        with pytest.raises(SupervisionError) as ei:
            hogs.slice(gpus=0).eat.call_one(HOG_MIB).get(timeout=120)
        assert ei.value.reason == OUT_OF_MEMORY, str(ei.value)
        failure = _failures_of(unhandled_faults, before, "oom_procs")[0]
        print(failure.report())
        _says(failure, OUT_OF_MEMORY)
        assert (failure.host, failure.pid) == where[0], failure
        assert "killed by SIGKILL" in failure.report() and "OOM killer" in failure.report()

        # the same job, the same cgroup: a plain kill -9 is a signal, not the OOM killer
        os.kill(where[1][1], signal.SIGKILL)
        second = _failures_of(unhandled_faults, before, "oom_procs", 2)[1]
        print(second.report())
        _says(second, SIGNAL)
        assert (second.host, second.pid) == where[1] and "OOM" not in second.report()

        # the telemetry tables record each with its class
        classes = wait_until(lambda: _telemetry_classes(state, [p for _, p in where]), 20,
                             "both processes' failures reach the telemetry tables")
        assert classes[where[0][1]] == OUT_OF_MEMORY and classes[where[1][1]] == SIGNAL, \
            classes
    finally:
        job.kill()
        from hpcmesh.telemetry.server import stop_telemetry
        stop_telemetry()
    # Slurm agrees, in its own words, once the step ended: one OOM kill, not two
    said = _slurm_counted_oom_kills(job)
    print("\n".join(said))
    assert f"Detected 1 oom-kill event(s) in StepId={job.job_id}.0" in said[0], said


class Member(Actor):
    @endpoint
    def join(self) -> tuple[str, bool]:
        """Every member forms the groups along hosts (one per gpus index, each across the
        two nodes) and reduces once through torch itself, so gloo's pairs are connected."""
        import torch
        import torch.distributed as dist
        from hpcmesh import collectives
        t = torch.ones(1)
        dist.all_reduce(t, group=collectives.process_group("hosts"))
        return socket.gethostname(), t.item() == 2

    @endpoint
    def lonely_all_reduce(self, timeout: float) -> None:
        """An all_reduce along hosts that the member on the other node never joins."""
        import torch
        from hpcmesh import collectives
        collectives.all_reduce(torch.ones(2), dims="hosts", timeout=timeout)


def test_a_gloo_all_reduce_across_two_nodes_one_rank_never_joins_is_a_collective_timeout(
        cluster, unhandled_faults):
    """Two nodes, two members on each: the pairs along hosts cross the nodes' network (the
    agent names the interface for gloo). Member 0 calls an all_reduce member 2 never
    joins: its caller gets CollectiveTimeoutError, classified collective timeout, naming
    the dimension and the members; member 1 does the same, called without a reply port:
    the actor fails, and its MeshFailure says collective timeout."""
    import_or_skip("torch")
    job = _job("colltimeout", cluster, meshes={"hosts": 2}, grace=10)
    try:
        state = job.state(cached_path=None)
        procs = state.hosts.spawn_procs({"gpus": 2}, name="coll_procs")
        members = procs.spawn("members", Member)
        joined = members.join.call().get(timeout=180).values()
        assert [ok for _, ok in joined] == [True] * 4, joined
        assert joined[0][0] != joined[2][0], joined        # the pair spans two nodes

        with pytest.raises(ActorError) as ei:
            members.slice(hosts=0, gpus=0).lonely_all_reduce.call_one(3.0).get(timeout=60)
        err = ei.value
        print(f"\n{err}")
        assert err.reason == COLLECTIVE_TIMEOUT, str(err)
        assert err.remote_type == "CollectiveTimeoutError", str(err)
        assert "dims=('hosts',)" in err.message and "group members [0, 2]" in err.message, \
            err.message
        assert "failed on member 0" in err.message and "timeout 3s" in err.message, err.message

        before = len(unhandled_faults)
        members.slice(hosts=0, gpus=1).lonely_all_reduce.broadcast(3.0)
        failure = _failures_of(unhandled_faults, before, "members")[0]
        print(failure.report())
        _says(failure, COLLECTIVE_TIMEOUT)
        assert failure.point is not None and failure.point.rank == 1, failure
        assert "group members [1, 3]" in failure.report(), failure.report()
    finally:
        job.kill()
