"""SlurmJob / SlurmAllocation end to end on the real test cluster (tests/cluster/README.md).

Every job these tests submit is named ``hpcm-e2e<pid>-*`` and is cancelled at teardown,
so nothing of ours is left in squeue (jobs of other users of the cluster are left alone).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hpcmesh.actor import Actor, endpoint
from hpcmesh.job import (SlurmAllocation, SlurmError, SlurmJob, SlurmJobFailed,
                         SlurmStartTimeout, SlurmSubmitError)
from hpcmesh.progress import Progress as _Progress
from hpcmesh.job.slurm import squeue_jobs
from hpcmesh.slurm.parsing import SlurmParseError

# unique per test process, so teardown never touches jobs of a concurrent run
PREFIX = f"hpcm-e2e{os.getpid()}"
PY = sys.executable
# absolute paths: one test empties PATH, and teardown still needs them
SQUEUE = shutil.which("squeue") or "squeue"
SCANCEL = shutil.which("scancel") or "scancel"


class Where(Actor):
    @endpoint
    def where(self):
        import os
        import socket
        return {"host": socket.gethostname(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "local_rank": os.environ.get("LOCAL_RANK"), "job": os.environ.get("SLURM_JOB_ID")}

    @endpoint
    def notice(self):
        from hpcmesh.job import slurm_notice
        return slurm_notice()


def _our_jobs() -> dict[str, str]:
    out = subprocess.run([SQUEUE, "--noheader", "--format=%i|%j|%T"], capture_output=True,
                         text=True, timeout=30).stdout
    jobs = {}
    for line in out.splitlines():
        jid, _, rest = line.strip().partition("|")
        name, _, state = rest.partition("|")
        if name.startswith(PREFIX + "-"):
            jobs[jid] = state
    return jobs


def _listed(job_id: str) -> bool:
    """Does plain squeue (pending/running/completing jobs) still list the job?"""
    out = subprocess.run([SQUEUE, "--noheader", "--format=%i", f"--jobs={job_id}"],
                         capture_output=True, text=True, timeout=30).stdout
    return job_id in out.split()


@pytest.fixture
def cluster(slurm_cluster, tmp_path, monkeypatch, request):
    """The test cluster, a scratch log dir, and a teardown that cancels our jobs."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    # A job whose last step just ended may stay COMPLETING for a moment while slurmd
    # cleans up (epilog, step teardown): it ended, so wait for it rather than blame the test.
    deadline = time.monotonic() + 30
    while (time.monotonic() < deadline and (jobs := _our_jobs())
           and all(state == "COMPLETING" for state in jobs.values())):
        time.sleep(0.2)
    left = _our_jobs()
    if left:
        print(f"\n{request.node.name} left {left}; sacct: " + subprocess.run(
            ["sacct", "-c", "-j", ",".join(left), "-o", "JobID,JobName%30,State"],
            capture_output=True, text=True).stdout)
    if left:
        subprocess.run([SCANCEL, *left], timeout=30)
        deadline = time.monotonic() + 30
        while _our_jobs() and time.monotonic() < deadline:
            time.sleep(0.2)
    assert not _our_jobs(), f"jobs left in squeue: {_our_jobs()}"
    assert not left, f"test left jobs behind (cancelled now): {left}"


def _job(name: str, tmp_path, **kw) -> SlurmJob:
    kw.setdefault("meshes", {"hosts": 1})
    kw.setdefault("progress", True)
    kw.setdefault("timeout", 60)
    return SlurmJob(job_name=f"{PREFIX}-{name}", log_dir=str(tmp_path / "logs"), **kw)


# ---------------------------------------------------------------------------------------
# the happy paths
# ---------------------------------------------------------------------------------------
def test_three_nodes_two_gpus_each(cluster):
    job = _job("gpus", cluster, meshes={"trainers": 3}, gpus_per_node=2, grace=10)
    state = job.state(cached_path=None)
    try:
        hosts = state.trainers
        assert dict(hosts.extent) == {"hosts": 3}
        assert hosts.hostnames == ["node1", "node2", "node3"]
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        assert dict(procs.extent) == {"hosts": 3, "gpus": 2}
        got = procs.spawn("where", Where).where.call().get(timeout=60)
        # torchrun's convention: the step's GPUs, LOCAL_RANK selects one
        seen = [(p["hosts"], p["gpus"], v["host"], v["cuda"], v["local_rank"], v["job"])
                for p, v in got]
        assert seen == [(h, g, f"node{h + 1}", "0,1", str(g), job.job_id)
                        for h in range(3) for g in range(2)]
        pinned = hosts.spawn_procs(per_host={"gpus": 2}, gpu_binding="process")
        got = pinned.spawn("where", Where).where.call().get(timeout=60)
        assert [(v["cuda"], v["local_rank"]) for v in got.values()] == [(str(g), "0")
                                                                         for _h in range(3)
                                                                         for g in range(2)]
        t = job.timings
        print(f"\n3 nodes: submit->RUNNING {t['submit_to_running_s']:.2f} s "
              f"({t['running_source']}), RUNNING->all attached "
              f"{t['running_to_attached_s']:.2f} s, total {t['submit_to_attached_s']:.2f} s")
        assert 0 <= t["submit_to_running_s"] < 60 and 0 <= t["running_to_attached_s"] < 60
        assert job.active
    finally:
        t0 = time.monotonic()
        job.kill()
        print(f"kill() took {time.monotonic() - t0:.2f} s")
    assert not job.active
    assert not _listed(job.job_id)
    rec = squeue_jobs([job.job_id]).get(job.job_id)
    assert rec is None or rec.state in ("COMPLETED", "CANCELLED"), rec


def test_two_meshes_share_one_allocation_and_unknown_mesh(cluster):
    job = _job("two", cluster, meshes={"a": 1, "b": 2}, grace=10)
    try:
        state = job.state(cached_path=None)
        assert len(job.job_ids) == 1
        assert state.a.hostnames == ["node1"] and dict(state.a.extent) == {"hosts": 1}
        assert state.b.hostnames == ["node2", "node3"]
        with pytest.raises(AttributeError, match=r"no mesh 'trainers'.*a, b"):
            state.trainers
        got = state.b.spawn_procs().spawn("w", Where).where.call().get(timeout=60)
        assert [v["host"] for v in got.values()] == ["node2", "node3"]
    finally:
        job.kill()
    assert not _listed(job.job_ids[0])


_SALLOC_PRELUDE = textwrap.dedent("""
    import json, os, subprocess, sys
    from hpcmesh.actor import Actor, endpoint
    from hpcmesh.job import SlurmAllocation

    class W(Actor):
        @endpoint
        def where(self):
            import os, socket
            return socket.gethostname(), os.environ.get("SLURM_JOB_ID")
""")


def _run_in_salloc(script, tag: str, **env) -> dict:
    """Run a client script under ``salloc -N2``; the dict it printed after RESULT."""
    proc = subprocess.run(["salloc", "-N2", f"--job-name={PREFIX}-{tag}", PY, str(script)],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **env))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_salloc_adopts_the_allocation(cluster):
    script = cluster / "in_salloc.py"
    script.write_text(_SALLOC_PRELUDE + textwrap.dedent("""
        job = SlurmAllocation(progress=False)
        hosts = job.state().hosts
        steps = subprocess.run(["squeue", "--steps", "--noheader", "--format=%i",
                                "--jobs=" + os.environ["SLURM_JOB_ID"]],
                               capture_output=True, text=True).stdout.split()
        got = hosts.spawn_procs().spawn("w", W).where.call().get(timeout=60).values()
        job.kill()
        after = subprocess.run(["squeue", "--steps", "--noheader", "--format=%i",
                                "--jobs=" + os.environ["SLURM_JOB_ID"]],
                               capture_output=True, text=True).stdout.split()
        print("RESULT " + json.dumps({"extent": dict(hosts.extent), "got": got,
            "alloc": os.environ["SLURM_JOB_ID"], "steps": steps, "after": after,
            "active": job.active, "nodes": job.allocation.nodes}), flush=True)
    """))
    res = _run_in_salloc(script, "salloc")
    alloc = res["alloc"]
    assert res["extent"] == {"hosts": 2}
    # the agents run in the salloc job itself: no new job was submitted
    assert len(res["nodes"]) == 2
    assert res["got"] == [[res["nodes"][0], alloc], [res["nodes"][1], alloc]]
    assert res["steps"] == [f"{alloc}.0"]
    assert res["after"] == [] and res["active"] is False
    _wait_ended(alloc, 30)       # salloc has relinquished it; it may still be completing


def test_tls_across_nodes(cluster):
    # HPCMESH_TLS_CA in the client's environment reaches the agents srun starts and the
    # processes they spawn: every TCP connection between "nodes" is TLS.
    script = cluster / "tls_client.py"
    script.write_text(_SALLOC_PRELUDE + textwrap.dedent("""
        job = SlurmAllocation(progress=False)
        procs = job.state().hosts.spawn_procs(per_host={"gpus": 2})
        got = procs.spawn("w", W).where.call().get(timeout=60).values()
        from hpcmesh.runtime.client import client_runtime
        conns = [c for p in client_runtime().node.peers.values() for c in [p.conn, *p.extras]
                 if c is not None and not c.closed]
        import socket
        tcp = [c for c in conns if c.sock.family != socket.AF_UNIX]
        print("RESULT " + json.dumps({"got": got, "tcp": len(tcp),
                                      "tls": sum(c.encrypted for c in tcp)}), flush=True)
        job.kill()
    """))
    res = _run_in_salloc(script, "tls", HPCMESH_TLS_CA="trust_all_connections")
    assert len(res["got"]) == 4 and len({host for host, _ in res["got"]}) == 2
    assert res["tcp"] >= 2 and res["tls"] == res["tcp"], res


def test_client_script_runs_inside_the_allocation(cluster):
    client = cluster / "client.py"
    log_dir = cluster / "logs"
    client.write_text(textwrap.dedent(f"""
        import os
        from hpcmesh.actor import Actor, endpoint
        from hpcmesh.job import BatchJob, SlurmJob
        from hpcmesh.slurm import expand_hostlist

        class W(Actor):
            @endpoint
            def where(self):
                import socket
                return socket.gethostname()

        job = BatchJob(SlurmJob(meshes={{"workers": 2}}, job_name="{PREFIX}-client",
                                log_dir="{log_dir}"))
        state = job.state()
        hosts = state.workers.spawn_procs().spawn("w", W).where.call().get(timeout=60)
        print("IN-ALLOCATION CLIENT", os.environ["SLURM_JOB_ID"], os.environ["HPCMESH_BATCH_JOB"],
              list(hosts.values()) == expand_hostlist(os.environ["SLURM_JOB_NODELIST"]),
              flush=True)
    """))
    job = SlurmJob(meshes={"workers": 2}, job_name=f"{PREFIX}-client", log_dir=str(log_dir),
                   progress=False)
    job.apply(client_script=str(client))
    jid = job.job_id
    deadline = time.monotonic() + 90
    while _listed(jid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _listed(jid), "the job should end when its client script ends"
    assert not job.active
    out = open(job.log_paths()[0]).read()
    assert f"IN-ALLOCATION CLIENT {jid} 1 True" in out, \
        out + open(job.log_paths()[0][:-4] + ".err").read()
    assert squeue_jobs([jid])[jid].state == "COMPLETED"


def test_sigkilled_client_releases_the_job(cluster):
    script = cluster / "victim.py"
    script.write_text(textwrap.dedent(f"""
        import time
        from hpcmesh.job import SlurmJob
        job = SlurmJob(meshes={{"hosts": 2}}, job_name="{PREFIX}-victim",
                       log_dir="{cluster / 'logs'}", progress=False)
        state = job.state(cached_path=None)
        procs = state.hosts.spawn_procs(per_host={{"gpus": 2}})
        procs.initialized.get(timeout=60)
        print("READY", job.job_id, flush=True)
        time.sleep(600)     # sleep: lives on until the test kills it
    """))
    env = dict(os.environ, HPCMESH_LEASE_GRACE="3")
    proc = subprocess.Popen([PY, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), line
        jid = line.split()[1]
        assert _listed(jid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        t0 = time.monotonic()
        while _listed(jid) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        gone = time.monotonic() - t0
        print(f"\njob {jid} gone {gone:.1f} s after its client was SIGKILLed (grace 3 s)")
        assert not _listed(jid)
        assert gone < 3 + 6
        # the agents' lease ended it: the job completed, nobody cancelled it
        assert squeue_jobs([jid])[jid].state == "COMPLETED"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_new_client_process_reconnects_and_notices(cluster):
    script = cluster / "client.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        from hpcmesh.actor import Actor, endpoint
        from hpcmesh.job import SlurmJob

        class W(Actor):
            @endpoint
            def who(self):
                import os, socket
                from hpcmesh.job import slurm_notice
                return socket.gethostname(), os.getpid(), slurm_notice()

        job = SlurmJob(meshes={{"hosts": 2}}, job_name="{PREFIX}-reconnect",
                       log_dir="{cluster / 'logs'}", grace=20, progress=False)
        state = job.state()              # cached in .hpcmesh/job_state.pkl
        got = state.hosts.spawn_procs().spawn("w", W).who.call().get(timeout=60).values()
        print("RESULT " + json.dumps({{"job": job.job_id, "got": got,
                                       "notices": job.notices()}}), flush=True)
        if sys.argv[1] == "kill":
            job.kill()
    """))

    def run(arg):
        p = subprocess.run([PY, str(script), arg], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
        return json.loads(line[7:])

    first = run("keep")
    jid = first["job"]
    try:
        assert first["notices"] is None and [g[2] for g in first["got"]] == [None, None]
        # Slurm's time-limit warning, by hand: the batch shell traps it and forwards it
        subprocess.run(["scancel", "--signal=USR1", "--batch", jid], check=True, timeout=30)
        nodes = squeue_jobs([jid])[jid].nodes
        assert [g[0] for g in first["got"]] == nodes
        second = run("kill")
        assert second["job"] == jid, "the second client should reuse the running job"
        assert [g[0] for g in second["got"]] == nodes
        notices = second["notices"]
        assert sorted(n["host"] for n in notices) == sorted(nodes)
        assert {n["signal"] for n in notices} == {"SIGUSR1"}
        assert [len(g[2]) for g in second["got"]] == [2, 2]   # actors see it too
    finally:
        if _listed(jid):
            subprocess.run(["scancel", jid], timeout=30)
    assert not _listed(jid)


# ---------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------
def test_partition_slurm_rejects(cluster):
    job = _job("badpart", cluster, partition="nosuchpartition")
    with pytest.raises(SlurmSubmitError, match=r"(?i)invalid partition.*nothing was queued"):
        job.apply()
    assert not _our_jobs()


def test_sbatch_missing_from_path(cluster, monkeypatch):
    monkeypatch.setenv("PATH", str(cluster))
    job = _job("nopath", cluster)
    with pytest.raises(SlurmError, match=r"`sbatch` was not found on PATH"):
        job.apply()


def test_python_that_does_not_exist_fails_fast(cluster):
    job = _job("nopython", cluster, python_exe="/nonexistent/bin/python3")
    t0 = time.monotonic()
    with pytest.raises(SlurmJobFailed) as ei:
        job.apply()
    msg = str(ei.value)
    assert time.monotonic() - t0 < 60       # well before the 60 s start timeout
    jid = job.job_ids[0]
    assert f"Slurm job {jid} ended (FAILED" in msg
    assert f"{PREFIX}-nopython-{jid}.out" in msg
    assert "/nonexistent/bin/python3" in msg     # srun's execve error, from the job's stderr
    assert not _listed(jid)


def test_allocation_with_malformed_nodelist(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-")
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    with pytest.raises(SlurmParseError, match=r"SLURM_JOB_NODELIST.*node\[1-"):
        SlurmAllocation().apply()


def test_allocation_outside_slurm(monkeypatch):
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            monkeypatch.delenv(k)
    with pytest.raises(SlurmError, match="must run inside a Slurm allocation"):
        SlurmAllocation().apply()


def test_progress_line_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    s = Tty()
    p = _Progress(None, s)
    p.show(("PENDING", 0), "job 1 PENDING (Resources) 0/3 hosts attached 0.1s")
    p.show(("RUNNING", 3), "job 1 RUNNING 3/3 hosts attached 1.0s")
    p.done()
    assert s.getvalue() == ("\rjob 1 PENDING (Resources) 0/3 hosts attached 0.1s"
                            "\rjob 1 RUNNING 3/3 hosts attached 1.0s" + " " * 12 + "\n")
    plain = io.StringIO()
    p = _Progress(None, plain)
    for _ in range(3):
        p.show(("PENDING", 0), "job 1 PENDING 0/3")
    p.show(("RUNNING", 0), "job 1 RUNNING 0/3")
    assert plain.getvalue() == "hpcmesh: job 1 PENDING 0/3\nhpcmesh: job 1 RUNNING 0/3\n"


# ---------------------------------------------------------------------------------------
# the ready-made scripts and the examples
# ---------------------------------------------------------------------------------------
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _wait_ended(jid: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _listed(jid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _listed(jid)


def test_sbatch_workers_script_and_static_hosts(cluster, monkeypatch):
    from hpcmesh.hosts import hosts_from_config
    env = dict(os.environ, PYTHON=PY)
    p = subprocess.run(["sbatch", "--parsable", "-N2", f"--job-name={PREFIX}-workers",
                        os.path.join(REPO, "sbatch", "workers.sh")],
                       capture_output=True, text=True, env=env, timeout=30)
    assert p.returncode == 0, p.stderr
    jid = p.stdout.strip()
    job_dir = cluster / ".hpcmesh" / f"workers-{jid}"
    try:
        deadline = time.monotonic() + 60
        while not (job_dir / "hosts.yaml").exists():
            assert time.monotonic() < deadline, open(cluster / f"hpcmesh-workers-{jid}.out").read()
            time.sleep(0.1)
        assert oct((job_dir / "secret").stat().st_mode & 0o777) == "0o600"
        monkeypatch.setenv("HPCMESH_HOSTS", str(job_dir / "hosts.yaml"))
        monkeypatch.setenv("HPCMESH_SECRET_FILE", str(job_dir / "secret"))
        hosts = hosts_from_config()
        assert dict(hosts.extent) == {"hosts": 2}
        got = hosts.spawn_procs(per_host={"gpus": 1}).spawn("w", Where).where.call() \
            .get(timeout=60).values()
        assert [g["host"] for g in got] == squeue_jobs([jid])[jid].nodes
        assert {g["job"] for g in got} == {jid}
    finally:
        # HUP = "stop now" for the agents: the step ends, the script ends, the job completes
        subprocess.run(["scancel", "--signal=HUP", jid], timeout=30)
        deadline = time.monotonic() + 10
        while _listed(jid) and time.monotonic() < deadline:
            time.sleep(0.1)
        subprocess.run(["scancel", jid], timeout=30)
    _wait_ended(jid)
    assert squeue_jobs([jid])[jid].state == "COMPLETED"


def test_client_in_allocation_script_runs_the_salloc_example(cluster):
    env = dict(os.environ, PYTHON=PY)
    p = subprocess.run(["sbatch", "--parsable", "-N2", "--gpus-per-node=2",
                        f"--job-name={PREFIX}-cia",
                        os.path.join(REPO, "sbatch", "client_in_allocation.sh"),
                        os.path.join(REPO, "examples", "slurm_salloc.py")],
                       capture_output=True, text=True, env=env, timeout=30)
    assert p.returncode == 0, p.stderr
    jid = p.stdout.strip()
    _wait_ended(jid, 90)
    out = open(cluster / f"hpcmesh-client-{jid}.out").read()
    assert squeue_jobs([jid])[jid].state == "COMPLETED", out
    assert f"allocation {jid}: nodes" in out and "agents stopped" in out, out
    assert out.count(f"(job {jid}, step 0, CUDA_VISIBLE_DEVICES=") == 4, out


def test_sbatch_example_from_the_login_node(cluster):
    p = subprocess.run([PY, os.path.join(REPO, "examples", "slurm_sbatch.py"), "--nodes", "2",
                        "--grace", "10"], capture_output=True, text=True, timeout=120,
                       cwd=cluster)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "trained steps: [1000, 1000, 1000, 1000]" in p.stdout
    assert p.stdout.count("CUDA_VISIBLE_DEVICES=0,1 LOCAL_RANK=0") == 2
    assert "cancelled" in p.stdout
