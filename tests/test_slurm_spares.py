"""A lost host is replaced from spares (SPEC §12, issue 31 item 2), on the real test cluster.

``SlurmJob(meshes={"w": 2}, spare_nodes=1)`` holds 3 nodes; one of the mesh's nodes is cut
off (its network namespace's link down: no FIN, no RST, as when a node dies). The failure
names that host as lost within ``HOST_LOST_BOUND_S``; ``state()`` gives ``{"hosts": 2}``
on the surviving node and the spare, the survivor's processes untouched; a gloo
all_reduce across the new mesh is right; the dead node is remembered (``bad_nodes``, in
the cached job) and excluded by a requeue and by a new submission. The node is restored
(link up, ``scontrol update state=resume``) whatever happens.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import time

import pytest
from ci_gate import import_or_skip
from proc_helpers import wait_gone, wait_until
from test_slurm_e2e import _job, cluster  # noqa: F401 - cluster is a fixture

from hpcmesh.actor import Actor, SupervisionError, endpoint
from hpcmesh.job import job_load
from hpcmesh.job.slurm import HOST_LOST_BOUND_S, SlurmHostsLost, squeue_jobs
from hpcmesh.runtime.errors import HOST_LOST

#: margin for a loaded test machine (2 cores shared by several test runs)
MARGIN_S = 3.0


class Member(Actor):
    @endpoint
    def where(self) -> tuple[str, int]:
        return socket.gethostname(), os.getpid()

    @endpoint
    async def sleep(self, seconds: float) -> str:
        await asyncio.sleep(seconds)    # sleep: the endpoint's work is to take this long
        return "woke"

    @endpoint
    def all_reduce(self) -> tuple[float, int, str]:
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        try:
            t = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(t)
            return t.item(), dist.get_world_size(), socket.gethostname()
        finally:
            dist.destroy_process_group()


def _scontrol_show(what: str, name: str) -> str:
    return subprocess.run(["scontrol", "-o", "show", what, name], capture_output=True,
                          text=True, timeout=30).stdout


def _field(text: str, key: str) -> str:
    for word in text.split():
        if word.startswith(key + "="):
            return word.split("=", 1)[1]
    return ""


def _resume(node: str) -> None:
    """Bring a node Slurm marked DOWN back (other test runs share the cluster)."""
    state = ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"],
                       capture_output=True, timeout=30)
        state = _field(_scontrol_show("node", node), "State")
        if state and not any(s in state for s in ("DOWN", "DRAIN", "NOT_RESPONDING")):
            return
        time.sleep(1.0)     # sleep: between asks while slurmd registers again
    raise AssertionError(f"{node} did not come back after the test (State={state}); run "
                         f"tests/cluster/status.sh")


class CutNode:
    """One test node's link taken down, and brought back (and the node resumed) at close."""

    def __init__(self, node: str):
        self.node = node
        self.veth = f"hpcm-v{node.removeprefix('node')}"
        self.down = False

    def cut(self) -> None:
        subprocess.run(["ip", "link", "set", self.veth, "down"], check=True, timeout=30)
        self.down = True

    def restore(self) -> None:
        if self.down:
            subprocess.run(["ip", "link", "set", self.veth, "up"], check=True, timeout=30)
            _resume(self.node)
            self.down = False


class StoppedSlurmd:
    """One test node's slurmd stopped (SIGSTOP: Slurm hears nothing from it, as from a
    dead slurmd, while the node's network and our agent there go on); continued and the
    node resumed at close."""

    def __init__(self, node: str):
        self.node = node
        with open(f"/run/slurmd-{node}.pid") as f:
            self.pid = int(f.read().strip())
        self.stopped = False

    def cut(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.stopped = True

    def restore(self) -> None:
        if self.stopped:
            os.kill(self.pid, signal.SIGCONT)
            _resume(self.node)
            self.stopped = False


@pytest.fixture
def cut_node():
    cuts: list = []

    def make(node: str, how=CutNode):
        cuts.append(how(node))
        return cuts[-1]
    yield make
    for c in cuts:
        c.restore()


@pytest.mark.timeout(600)   # queue waits behind other runs' jobs, then Slurm's SlurmdTimeout
def test_lost_node_is_replaced_by_a_spare(cluster, cut_node, unhandled_faults):
    import_or_skip("torch")
    from hpcmesh.spmd import setup_torch_elastic_env
    job = _job("spares", cluster, meshes={"w": 2}, spare_nodes=1, requeue=True, grace=20,
               timeout=120)
    try:
        state = job.state()
        hosts = state.w.hostnames
        nodes = squeue_jobs([job.job_id])[job.job_id].nodes
        assert len(nodes) == 3 and "--no-kill" in open(
            os.path.join(job.job_dir, "job.sbatch")).read()
        spare = [n for n in nodes if n not in hosts]
        assert len(spare) == 1, (nodes, hosts)
        # the batch script runs on the allocation's first node: cut the mesh's other one
        lost_rank = 1 if hosts[1] != nodes[0] else 0
        victim, survivor_rank = hosts[lost_rank], 1 - lost_rank
        procs = state.w.spawn_procs({"gpus": 1}, name="spw")
        members = procs.spawn("members", Member)
        before = members.where.call().get(timeout=60).values()
        pending = members.slice(hosts=lost_rank).sleep.call_one(300)
        seen = len(unhandled_faults)

        cut = cut_node(victim)
        t0 = time.monotonic()
        cut.cut()
        got = wait_until(lambda: [f for f in unhandled_faults[seen:] if f.mesh_name == "spw"],
                         HOST_LOST_BOUND_S + MARGIN_S, "the host's loss is told")
        took = time.monotonic() - t0
        print(f"\n{victim} cut off: MeshFailure after {took:.2f} s (bound "
              f"{HOST_LOST_BOUND_S:g} s): {got[0]}")
        assert took <= HOST_LOST_BOUND_S + MARGIN_S
        assert got[0].reason == HOST_LOST and got[0].host == victim, got[0]
        assert victim in got[0].report() and "lost" in got[0].report()
        with pytest.raises(SupervisionError) as ei:
            pending.get(timeout=30)
        assert ei.value.reason == HOST_LOST and ei.value.host == victim

        t1 = time.monotonic()
        new = job.state()
        print(f"state() with a spare in place in {time.monotonic() - t1:.2f} s: "
              f"{new.w.hostnames}")
        assert dict(new.w.extent) == {"hosts": 2}
        want = list(hosts)
        want[lost_rank] = spare[0]
        assert new.w.hostnames == want
        assert job.bad_nodes == [victim]
        # the survivor's process is the one it was, and answers
        assert members.slice(hosts=survivor_rank).where.call_one().get(timeout=30) == \
            before[survivor_rank]
        # a new world across the survivor and the spare
        procs2 = new.w.spawn_procs({"gpus": 1}, name="spw2")
        setup_torch_elastic_env(procs2)
        sums = procs2.spawn("reducers", Member).all_reduce.call().get(timeout=120).values()
        assert sums == [(3.0, 2, want[0]), (3.0, 2, want[1])], sums
        # remembered where the job's state is kept
        assert job_load(".hpcmesh/job_state.pkl").bad_nodes == [victim]

        # Slurm marks the silent node DOWN (SlurmdTimeout): with --no-kill the job, the
        # survivor's step and the spare's go on
        wait_until(lambda: "DOWN" in _field(_scontrol_show("node", victim), "State"), 120,
                   f"Slurm marks {victim} down")
        assert squeue_jobs([job.job_id])[job.job_id].state == "RUNNING"
        assert members.slice(hosts=survivor_rank).where.call_one().get(timeout=30) == \
            before[survivor_rank]
        assert procs2.spawn("after", Member).where.call().get(timeout=60).values()[1][0] == \
            spare[0]

        # a requeue keeps the job off the dead node
        job.requeue()
        assert victim in _field(_scontrol_show("job", job.job_id), "ExcNodeList")
        job.kill()
        # and so does the job submitted again from this cache (as one node: lands elsewhere)
        again = _job("spares", cluster, meshes={"w": 1}, timeout=120)
        st = again.state()
        assert again.bad_nodes == [victim]
        assert f"--exclude={victim}" in open(os.path.join(again.job_dir, "job.sbatch")).read()
        assert st.w.hostnames != [victim]
        again.kill()
    finally:
        job.kill()


@pytest.mark.timeout(300)   # may queue behind other runs' jobs
def test_without_spares_the_error_says_how_many_hosts_are_left(cluster, cut_node,
                                                              unhandled_faults):
    """No spare: state() says how many hosts are left and how to go on with them, which
    works (while Slurm has not yet marked the node down: a job without spare_nodes has no
    --no-kill, so Slurm then ends it, as the message says)."""
    job = _job("nospare", cluster, meshes={"w": 2}, grace=20, timeout=120)
    try:
        state = job.state()
        hosts = state.w.hostnames
        procs = state.w.spawn_procs({"gpus": 1}, name="nsw")
        members = procs.spawn("members", Member)
        before = members.where.call().get(timeout=60).values()
        seen = len(unhandled_faults)
        cut = cut_node(hosts[1])    # hosts[0] runs the batch script
        cut.cut()
        wait_until(lambda: [f for f in unhandled_faults[seen:] if f.mesh_name == "nsw"
                            and f.reason == HOST_LOST], HOST_LOST_BOUND_S + MARGIN_S,
                   "the host's loss is told")
        with pytest.raises(SlurmHostsLost) as ei:
            job.state()
        msg = str(ei.value)
        print(f"\n{msg}")
        assert f"1 of 2 host(s) left ({hosts[0]})" in msg and f"lost {hosts[1]}" in msg
        assert "fewer_hosts=True" in msg and "spare_nodes" in msg
        assert ei.value.left == {"w": 1} and job.bad_nodes == [hosts[1]]
        fewer = job.state(fewer_hosts=True)
        assert fewer.w.hostnames == [hosts[0]]
        assert members.slice(hosts=0).where.call_one().get(timeout=30) == before[0]
    finally:
        job.kill()


@pytest.mark.timeout(600)   # queue waits behind other runs' jobs, then Slurm's SlurmdTimeout
def test_a_node_slurm_marks_down_is_lost_and_replaced(cluster, cut_node, unhandled_faults):
    """Slurm takes a node out of the job (its slurmd silent past SlurmdTimeout) while our
    agent there still answers: that host is lost too (its steps there are ended by Slurm
    once slurmd is back), its processes ended, and state() replaces it from the spare."""
    job = _job("downspare", cluster, meshes={"w": 2}, spare_nodes=1, grace=20, timeout=120)
    try:
        state = job.state()
        hosts = state.w.hostnames
        nodes = squeue_jobs([job.job_id])[job.job_id].nodes
        spare = [n for n in nodes if n not in hosts][0]
        lost_rank = 1 if hosts[1] != nodes[0] else 0
        victim = hosts[lost_rank]
        procs = state.w.spawn_procs({"gpus": 1}, name="dsw")
        members = procs.spawn("members", Member)
        before = members.where.call().get(timeout=60).values()
        seen = len(unhandled_faults)
        cut_node(victim, StoppedSlurmd).cut()
        t0 = time.monotonic()
        config = subprocess.run(["scontrol", "show", "config"], capture_output=True,
                                text=True, timeout=30).stdout
        timeout = float(re.search(r"SlurmdTimeout\s*=\s*(\d+)", config).group(1))
        got = wait_until(lambda: [f for f in unhandled_faults[seen:] if f.mesh_name == "dsw"],
                         timeout + 60, "the loss of the host Slurm took is told")
        print(f"\nslurmd of {victim} stopped: MeshFailure after {time.monotonic() - t0:.1f} s "
              f"(SlurmdTimeout {timeout:g} s): {got[0]}")
        assert got[0].reason == HOST_LOST and got[0].host == victim
        assert "Slurm took node" in got[0].report()
        # its process ended with its agent (we ended them: Slurm could not)
        assert wait_gone([before[lost_rank][1]], 30) == []
        new = job.state()
        want = list(hosts)
        want[lost_rank] = spare
        assert dict(new.w.extent) == {"hosts": 2} and new.w.hostnames == want
        assert job.bad_nodes == [victim]
        assert members.slice(hosts=1 - lost_rank).where.call_one().get(timeout=30) == \
            before[1 - lost_rank]
    finally:
        job.kill()
