"""SubmititJob: submitit's local and debug executors here, its slurm executor on the test
cluster (tests/cluster/up.sh)."""

import os
import socket
import subprocess
import sys
import time

import pytest
from ci_gate import import_or_skip
from proc_helpers import wait_gone

import_or_skip("submitit")

from hpcmesh.actor import Actor, endpoint  # noqa: E402
from hpcmesh.job import SubmititJob  # noqa: E402


class Where(Actor):
    @endpoint
    def where(self):
        return socket.gethostname(), os.getpid(), os.environ.get("HPCMESH_JOB_TOKEN")


def _run_and_kill(job, expect_hosts):
    state = job.state(cached_path=None)
    workers = state.workers
    assert dict(workers.extent) == {"hosts": len(expect_hosts)}
    assert sorted(workers.hostnames) == sorted(expect_hosts)
    procs = workers.spawn_procs({"gpus": 2})
    vm = procs.spawn("where", Where).where.call().get(timeout=60)
    assert dict(vm.extent) == {"hosts": len(expect_hosts), "gpus": 2}
    hosts = [h for h, _pid, _tok in vm.values()]
    assert sorted(set(hosts)) == sorted(set(expect_hosts))
    # the job token is an agent's business: its processes do not see it
    proc_pids = [p for _h, p, _t in vm.values()]
    agent_pids = [a["pid"] for a in job.agents["workers"]]
    assert all(agent_pids)
    assert job.active
    secret_file = job.secret_file
    assert oct(os.stat(secret_file).st_mode & 0o777) == "0o600"
    job.kill()
    assert not job.active
    assert not os.path.exists(secret_file)
    return proc_pids, agent_pids


def test_bad_arguments():
    with pytest.raises(ValueError, match="positive int"):
        SubmititJob(meshes={"w": 0})
    with pytest.raises(ValueError, match="cluster must be one of"):
        SubmititJob(cluster="kubernetes")
    with pytest.raises(ValueError, match="sets nodes itself"):
        SubmititJob(nodes=3)
    with pytest.raises(ValueError, match="identifier"):
        SubmititJob(meshes={"my mesh": 1})


@pytest.mark.parametrize("state,live", [("PENDING", True), ("REQUEUE_HOLD", True),
                                        ("REQUEUE_FED", True), ("COMPLETING", False)])
def test_slurm_job_alive_follows_the_one_rule(state, live, monkeypatch):
    """A requeued Slurm job is still the cached job (it comes back); one that is winding up
    is not. The rule is slurm.parsing's JobRecord.is_live (no squeue run here)."""
    from hpcmesh.job import submitit_job
    from hpcmesh.slurm.parsing import parse_squeue

    job = SubmititJob(meshes={"w": 1}, cluster="slurm")
    job.resolved_cluster, job.job_ids = "slurm", {"w": "7"}
    recs = {r.job_id: r for r in parse_squeue(f"7|{state}|None||j|1|0:01|1:00|debug\n")}
    monkeypatch.setattr(submitit_job, "squeue_jobs", lambda ids, timeout: recs)
    # private: the job kind's liveness hook, without apply() (a Slurm job)
    assert job._is_active() is live


def test_bad_executor_parameter_is_reported(tmp_path):
    job = SubmititJob(meshes={"workers": 1}, folder=str(tmp_path), cluster="local",
                      slurm_partitionn="debug")
    with pytest.raises(ValueError, match="rejected the executor parameters"):
        job.apply()


class Gpus(Actor):
    @endpoint
    def cvd(self):
        return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_local_end_to_end_and_kill_leaves_nothing(tmp_path, monkeypatch):
    # submitit's local executor blanks CUDA_VISIBLE_DEVICES; the job keeps the caller's
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    job = SubmititJob(meshes={"workers": 2}, folder=str(tmp_path), cluster="local", grace=30,
                      progress=False)
    cvd = job.state(cached_path=None).workers.spawn_procs().spawn("g", Gpus).cvd.call()
    assert cvd.get(timeout=60).values() == ["3,5", "3,5"]
    proc_pids, agent_pids = _run_and_kill(job, [socket.gethostname()] * 2)
    controller = int(job.job_ids["workers"])
    assert wait_gone(proc_pids + agent_pids + [controller], 15) == [], "processes left after kill()"


def test_debug_end_to_end(tmp_path):
    job = SubmititJob(meshes={"workers": 2}, folder=str(tmp_path), cluster="debug", grace=30,
                      progress=False)
    proc_pids, agent_pids = _run_and_kill(job, [socket.gethostname()] * 2)
    assert job.job_ids["workers"].startswith("DEBUG_")
    assert wait_gone(proc_pids + agent_pids, 15) == []


def test_agent_that_cannot_attach_fails_fast(tmp_path):
    """A task that dies before attaching: apply fails with the job's logs, not a timeout."""
    job = SubmititJob(meshes={"workers": 1}, folder=str(tmp_path), cluster="local",
                      attach_timeout=60, progress=False, local_setup=["exit 3"])
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="ended before every agent attached"):
        job.apply()
    assert time.monotonic() - t0 < 30


def _hm(*args, cwd, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(cwd))
    env.pop("HPCMESH_CONTEXT", None)
    return subprocess.run([sys.executable, "-m", "hpcmesh", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_cli_apply_then_exec_from_other_processes(tmp_path):
    """apply in one process; exec/status/kill from others reconnect with the cached state."""
    (tmp_path / "subjobs.py").write_text(
        "from hpcmesh.job import SubmititJob\n"
        f"job = SubmititJob(meshes={{'workers': 2}}, folder={str(tmp_path / 'sub')!r}, "
        "cluster='local', grace=30)\n")
    r = _hm("apply", "subjobs.job", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "SubmititJob" in r.stdout and "workers: HostMesh({'hosts': 2}" in r.stdout
    try:
        r = _hm("exec", "--", "echo $HPCMESH_RANK_hosts/$HPCMESH_SIZE_hosts", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.splitlines()) == ["[hosts=0] 0/2", "[hosts=1] 1/2"]
        r = _hm("status", cwd=tmp_path)
        assert r.returncode == 0 and "active:   yes" in r.stdout
        assert "2 host(s), local job" in r.stdout
    finally:
        r = _hm("kill", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = _hm("status", cwd=tmp_path)
    assert r.returncode == 1


@pytest.mark.slurm
def test_slurm_end_to_end(slurm_cluster, tmp_path_factory):
    folder = tmp_path_factory.mktemp("submitit-slurm")
    os.chmod(folder, 0o755)
    # TCP only: the nodes share this machine's filesystem, so the client's Unix socket
    # (first in its address list) would work too and hide a broken network path
    from hpcmesh.runtime.client import client_runtime
    tcp = [a for a in client_runtime().node.addresses if a.startswith("tcp://")]
    job = SubmititJob(meshes={"workers": 2}, folder=str(folder), cluster="slurm", grace=30,
                      progress=False, slurm_partition="debug", timeout_min=10,
                      attach_addresses=tcp)
    state = job.state(cached_path=None)
    hosts = state.workers.hostnames
    assert len(hosts) == 2 and all(h.startswith("node") for h in hosts)
    assert job.slurm_job_ids() == [job.job_ids["workers"]]
    jid = job.job_ids["workers"]
    vm = state.workers.spawn_procs({"gpus": 2}).spawn("w", Where).where.call().get(timeout=60)
    assert sorted({h for h, _p, _t in vm.values()}) == sorted(hosts)
    # the agents advertise their nodes' own addresses (not 127.0.0.1 where the nodes have
    # others: the 22.05 cluster's nodes are network namespaces; 24.11's are all 127.0.0.1)
    from slurm_cluster import CLUSTER_NODES
    node_addr = {n.name: n.addr for n in CLUSTER_NODES}
    for a in job.agents["workers"]:
        assert all(addr.startswith(f"tcp://{node_addr[a['host']]}:")
                   for addr in a["addresses"]), a
    out = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%T"], capture_output=True,
                         text=True).stdout.strip()
    assert out == "RUNNING"
    job.kill()
    out = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%T"], capture_output=True,
                         text=True).stdout.strip()
    assert out == "", f"job {jid} still in squeue after kill: {out}"
    assert not job.active
