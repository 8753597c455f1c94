"""spare_nodes without a cluster (issue 31 item 2): the spec key and its checks, the sbatch
script it renders, a spare agent's rank, the exclusion of lost nodes, what is kept with
the job, and the TCP timeout that bounds a cut-off host. The cluster side is
tests/test_slurm_spares.py."""

from __future__ import annotations

import os
import socket

import pytest

from hpcmesh.job import SlurmJob, job_load
from hpcmesh.job.slurm_agent import agent_command
from hpcmesh.job.slurm_spares import (HOST_LOST_BOUND_S, lost_message, node_name,
                                      spare_srun_argv)
from hpcmesh.slurm.render import render_sbatch
from hpcmesh.slurm.spec import JobSpec, SpecError, parse_job_spec
from hpcmesh.transport.connection import KEEPALIVE_S, tune_socket

WORKER = ["{python}", "-c", "agent"]


def _job(tmp_path, **kw) -> SlurmJob:
    kw.setdefault("meshes", {"w": 2})
    return SlurmJob(log_dir=str(tmp_path / "logs"), python_exe="/opt/py", **kw)


def test_spare_nodes_render_more_nodes_and_no_kill(tmp_path):
    job = _job(tmp_path, spare_nodes=1)
    assert job.spec.spare_nodes == 1 and job.spec.to_dict()["spare_nodes"] == 1
    text = render_sbatch(job.spec, WORKER)
    assert "#SBATCH --nodes=3\n" in text and "#SBATCH --no-kill\n" in text
    # the mesh keeps to its own nodes (the first two), and a lost node ends only its tasks
    srun = next(ln for ln in text.splitlines() if ln.startswith("exec srun"))
    assert "--nodes=2" in srun and "--relative=0" in srun and "--no-kill" in srun
    assert "--kill-on-bad-exit" not in srun
    # without spares: as before
    plain = render_sbatch(_job(tmp_path).spec, WORKER)
    assert "#SBATCH --nodes=2\n" in plain and "--no-kill" not in plain
    assert "--kill-on-bad-exit=1" in plain and "--relative" not in plain


def test_spare_nodes_in_yaml_and_back():
    spec = parse_job_spec("spare_nodes: 2\nmeshes:\n  a: 1\n  b: 3\n", "job.yaml")
    assert spec.spare_nodes == 2
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert "spare_nodes" not in JobSpec.from_dict({"meshes": {"a": 1}}).to_dict()


@pytest.mark.parametrize("value, words", [
    (-1, "spare_nodes must be a non-negative integer, got integer -1"),
    ("two", "spare_nodes must be a non-negative integer, got string 'two'"),
    (True, "spare_nodes must be a non-negative integer"),
    (10**7, "spare_nodes must be at most"),
])
def test_bad_spare_nodes_say_what_is_allowed(tmp_path, value, words):
    with pytest.raises(SpecError, match=words.replace("(", r"\(")):
        _job(tmp_path, spare_nodes=value)


def test_spare_nodes_need_one_allocation(tmp_path):
    with pytest.raises(SpecError, match="spare_nodes .1. needs the meshes in one allocation"):
        _job(tmp_path, meshes={"a": 1, "b": 1}, same_allocation=False, spare_nodes=1)
    with pytest.raises(SpecError, match="job.yaml:1: spare_nodes must be a non-negative"):
        parse_job_spec("spare_nodes: -2\nmeshes: {a: 1}\n", "job.yaml")


def test_lost_nodes_are_excluded_and_kept_with_the_job(tmp_path):
    job = _job(tmp_path, spare_nodes=1)
    text = render_sbatch(job.spec, WORKER, exclude=["node2", "gpu[3-4]"])
    assert "#SBATCH --exclude=node2,gpu[3-4]\n" in text
    with pytest.raises(ValueError, match="not a Slurm node name"):
        render_sbatch(job.spec, WORKER, exclude=["node2 --nodes=1"])
    job.mark_bad_node("node2")
    job.mark_bad_node("node2")
    assert job.bad_nodes == ["node2"]
    path = str(tmp_path / "state.pkl")
    job.dump(path)
    assert job_load(path).bad_nodes == ["node2"]
    assert SlurmJob.bad_nodes == ()      # the class default is never changed
    # submitted again (by its name, even with other meshes), the job keeps off them;
    # another job of the context does not
    again = _job(tmp_path, meshes={"w": 1})
    again.inherit_bad_nodes(job_load(path))
    assert again.bad_nodes == ["node2"]
    other = SlurmJob(meshes={"w": 1}, job_name="another")
    other.inherit_bad_nodes(job_load(path))
    assert other.bad_nodes == ()


def test_a_spare_agent_stands_in_for_the_lost_ranks(tmp_path):
    assert agent_command("py", mesh="w", rank_base=3)[-2:] == ["--rank-base", "3"]
    assert "--rank-base" not in agent_command("py", mesh="w")
    job = _job(tmp_path, spare_nodes=1, setup=["module load x"])
    job.job_dir, job.job_ids, job.token = str(tmp_path / "jd"), ["77"], "t"
    argv = spare_srun_argv(job, "w", "node3", 1, ["tcp://10.0.0.1:5"])
    assert argv[:5] == ["srun", "--jobid=77", "--nodes=1", "--nodelist=node3", "--ntasks=1"]
    assert "module load x" in argv[argv.index("-euc") + 1]
    assert argv[-2:] == ["--rank-base", "1"] and "tcp://10.0.0.1:5" in argv


def test_agent_ready_file_carries_the_rank_base(tmp_path, monkeypatch):
    """The spare's ready file is named for the rank it stands in for, so a client that
    reconnects later finds the mesh in its order."""
    import hpcmesh.job.slurm_agent as sa
    seen = {}

    def fake_run_agent(listen, attach, **kw):
        seen.update(kw)
        return "received SIGHUP"
    monkeypatch.setattr(sa, "run_agent", fake_run_agent)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    with pytest.raises(SystemExit):
        sa.agent_main(["--job-dir", str(tmp_path), "--mesh", "w", "--rank-base", "1"])
    assert os.path.basename(seen["ready_file"]) == "agent-w-r0-1.addr"


def test_the_error_without_spares_says_how_many_hosts_are_left(tmp_path):
    job = _job(tmp_path)
    job.job_ids = ["9"]
    job.bad_nodes = ["node2"]
    msg = lost_message(job, {"w": ["node1"]}, {"w": ["node2"]}, "has no spare nodes")
    assert "mesh 'w': 1 of 2 host(s) left (node1), lost node2" in msg
    assert "job.state(fewer_hosts=True)" in msg and "spare_nodes=k" in msg
    assert "Slurm ends it once it marks the node down" in msg
    assert node_name("node2.cluster.local", ["node1", "node2"]) == "node2"


def test_a_cut_off_peer_is_bounded_with_data_in_flight():
    """Keepalive probes only an idle connection; TCP_USER_TIMEOUT bounds one whose data
    goes unacknowledged (a peer cut off mid-send), at the same KEEPALIVE_S."""
    if not hasattr(socket, "TCP_USER_TIMEOUT") or KEEPALIVE_S <= 0:
        pytest.skip("no TCP_USER_TIMEOUT here, or keepalive turned off")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        tune_socket(s)
        got = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
        assert got == int(KEEPALIVE_S) * 1000
        assert HOST_LOST_BOUND_S is not None and HOST_LOST_BOUND_S <= 10
    finally:
        s.close()


def test_a_node_slurm_took_out_of_the_job_is_told_once(monkeypatch):
    """The squeue watch of a job with spares: an agent whose node the running job no
    longer has is reported lost, once; a job that is not running reports nothing."""
    from types import SimpleNamespace

    from proc_helpers import wait_until

    import hpcmesh.job.slurm_spares as spares
    from hpcmesh.slurm.parsing import JobRecord

    calls = []

    def squeue(ids, timeout=60):
        calls.append(ids)       # the first answer: pending (a requeue), then running
        state = "PENDING" if len(calls) == 1 else "RUNNING"
        return {"7": JobRecord("7", state, "None", ["node1", "node3"], "j", 2, "0:01",
                               "1:00", "debug")}
    monkeypatch.setattr(spares.slurmctl, "squeue_jobs", squeue)
    refs = [SimpleNamespace(hostname=h, agent=SimpleNamespace(node_id=f"agent@{h}"))
            for h in ("node1", "node2")]
    told = []
    stop = spares.watch_removed_nodes("7", lambda: {"w": refs},
                                      lambda ref, node, why: told.append(
                                          (ref.hostname, node, why, len(calls))),
                                      interval=0.01)
    try:
        wait_until(lambda: len(calls) >= 6, 10, "the watch polls squeue on")
    finally:
        stop.set()
    assert len(told) == 1 and told[0][:2] == ("node2", "node2") and told[0][3] >= 2, told
    assert "Slurm took node node2 out of job 7" in told[0][2]
