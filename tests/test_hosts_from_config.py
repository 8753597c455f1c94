"""hosts_from_config: local, static, errors; Slurm adoption and submission on the test cluster."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from hpcmesh.actor import Actor, endpoint
from hpcmesh.hosts_file import ConfigError
from hpcmesh.hosts import hosts_from_config
from hpcmesh.job.agent_mesh import AgentHostMesh

PY = sys.executable
SQUEUE = shutil.which("squeue") or "squeue"


class Where(Actor):
    @endpoint
    def where(self):
        import os
        import socket
        return socket.gethostname(), os.getpid()


@pytest.fixture
def no_slurm(monkeypatch, tmp_path):
    """Outside any allocation, no hosts file, in a scratch folder."""
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            monkeypatch.delenv(k)
    monkeypatch.delenv("HPCMESH_HOSTS", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _write(path, text):
    path.write_text(textwrap.dedent(text).lstrip())
    return str(path)


def test_unset_outside_an_allocation_is_this_host(no_slurm):
    hosts = hosts_from_config()
    assert dict(hosts.extent) == {"hosts": 1}
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    assert dict(procs.extent) == {"hosts": 1, "gpus": 2}
    got = procs.spawn("w", Where).where.call().get(timeout=60).values()
    assert [h for h, _ in got] == [socket.gethostname()] * 2
    procs.stop().get(timeout=30)


def test_local_scheduler_with_processes_per_host(no_slurm, monkeypatch):
    cfg = _write(no_slurm / "local.yaml", """
        scheduler: local
        processes_per_host: 3
    """)
    monkeypatch.setenv("HPCMESH_HOSTS", cfg)
    hosts = hosts_from_config()
    assert dict(hosts.extent) == {"hosts": 1}
    assert type(hosts) is AgentHostMesh and hosts.job is None     # not a SlurmHostMesh
    procs = hosts.spawn_procs()          # the file's default per-host count
    assert dict(procs.extent) == {"hosts": 1, "procs": 3}
    pids = [p for _, p in procs.spawn("w", Where).where.call().get(timeout=60).values()]
    assert len(set(pids)) == 3
    procs.stop().get(timeout=30)


@pytest.fixture
def two_workers(no_slurm):
    """Two `hpcmesh worker`-style agents on loopback, sharing a secret."""
    secret = os.urandom(32).hex()
    env = dict(os.environ, HPCMESH_SECRET=secret)
    procs, addrs = [], []
    for i in range(2):
        ready = no_slurm / f"worker{i}.addr"
        code = ("from hpcmesh.runtime.process.worker import run_worker_loop_forever as r; "
                f"r('tcp://127.0.0.1:0', grace=5, initial_wait=60, ready_file={str(ready)!r})")
        procs.append(subprocess.Popen([PY, "-c", code], env=env, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text().endswith("\n")):
            assert time.monotonic() < deadline, "worker did not start"
            time.sleep(0.05)
        addrs.append(ready.read_text().split()[0])
    yield secret, addrs
    for p in procs:
        # SIGKILL: the worker ignores SIGTERM while a controller is still connected
        p.kill()
        p.wait(10)


def test_static_workers(two_workers, no_slurm, monkeypatch):
    secret, addrs = two_workers
    cfg = _write(no_slurm / "static.yaml", f"""
        scheduler: static
        workers:
          - {addrs[0]}
          - {addrs[1]}
    """)
    monkeypatch.setenv("HPCMESH_SECRET", secret)
    hosts = hosts_from_config(cfg)           # a path works in place of the variable name
    assert dict(hosts.extent) == {"hosts": 2}
    assert type(hosts) is AgentHostMesh and hosts.job is None     # not a SlurmHostMesh
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    got = procs.spawn("w", Where).where.call().get(timeout=60).values()
    assert len({p for _, p in got}) == 2
    procs.stop().get(timeout=30)


def test_static_worker_unreachable_names_the_file(no_slurm, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]           # nothing listens there once closed
    cfg = _write(no_slurm / "static.yaml", f"""
        scheduler: static
        workers:
          - tcp://127.0.0.1:{port}
    """)
    monkeypatch.setenv("HPCMESH_HOSTS", cfg)
    with pytest.raises(ConnectionError, match=rf"static.yaml:2: cannot attach.*{port}"):
        hosts_from_config(timeout=5)


def test_missing_file(no_slurm, monkeypatch):
    monkeypatch.setenv("HPCMESH_HOSTS", str(no_slurm / "nope.yaml"))
    with pytest.raises(ConfigError, match=r"HPCMESH_HOSTS=.*nope.yaml: no such file"):
        hosts_from_config()


def test_unknown_scheduler_names_file_line_and_choices(no_slurm, monkeypatch):
    cfg = _write(no_slurm / "bad.yaml", """
        # comment
        scheduler: slrum
    """)
    monkeypatch.setenv("HPCMESH_HOSTS", cfg)
    with pytest.raises(ConfigError, match=r"bad.yaml:2: unknown scheduler 'slrum'; allowed: "
                                          r"local, slurm, ssh, static \(did you mean 'slurm'\?\)"):
        hosts_from_config()


def test_slurm_outside_allocation_needs_a_job(no_slurm, monkeypatch):
    cfg = _write(no_slurm / "slurm.yaml", "scheduler: slurm\n")
    monkeypatch.setenv("HPCMESH_HOSTS", cfg)
    with pytest.raises(ConfigError, match=r"slurm.yaml:1: .*needs a 'job:' spec"):
        hosts_from_config()


def test_slurm_job_spec_error_names_the_line(no_slurm, monkeypatch):
    cfg = _write(no_slurm / "slurm.yaml", """
        scheduler: slurm
        job:
          nodes: 2
          gpu_per_node: 2
    """)
    monkeypatch.setenv("HPCMESH_HOSTS", cfg)
    with pytest.raises(ConfigError, match=r"slurm.yaml:4: .*gpu_per_node.*did you mean "
                                          r"'gpus_per_node'") as err:
        hosts_from_config()
    # the job spec's error keeps its pieces as the hosts file's kind (it lost them)
    assert (err.value.source, err.value.line, err.value.key) == (cfg, 4, "job.gpu_per_node")
    assert err.value.allowed and err.value.problem.startswith("unknown key 'gpu_per_node'")


def test_ssh_goes_to_sshjob(no_slurm, monkeypatch):
    import hpcmesh.job.ssh
    calls = []

    class FakeSSHJob:
        def __init__(self, **kw):
            calls.append(kw)

        def state(self, cached_path=None):
            from hpcmesh.job import JobState
            return JobState({"hosts": "the-mesh"})
    cfg = _write(no_slurm / "ssh.yaml", """
        scheduler: ssh
        hosts: node[1-2]
        ssh_args: -o BatchMode=yes
        python: /opt/py/bin/python
    """)
    monkeypatch.setenv("HPCMESH_HOSTS", cfg)
    monkeypatch.setattr(hpcmesh.job.ssh, "SSHJob", FakeSSHJob)
    assert hosts_from_config() == "the-mesh"
    assert calls == [{"hosts": ["node1", "node2"], "python_exe": "/opt/py/bin/python",
                      "ssh_args": ["-o", "BatchMode=yes"]}]


def test_transport_tls_turns_tls_on_for_the_client_and_what_it_starts(no_slurm):
    """In a fresh interpreter (TLS changes the client runtime the rest of the suite shares):
    the client's node encrypts, and HPCMESH_TLS_CA is in the environment its agents and
    processes inherit; the local mesh it returns works."""
    cfg = _write(no_slurm / "tls.yaml", """
        scheduler: local
        transport:
          tls: true
    """)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os
        from hpcmesh.hosts import hosts_from_config
        from hpcmesh.runtime.client import client_runtime
        from hpcmesh.actor import Actor, endpoint

        class Env(Actor):
            @endpoint
            def tls(self):
                return os.environ.get("HPCMESH_TLS_CA")

        hosts = hosts_from_config()
        print("client", client_runtime().node.tls is not None, os.environ["HPCMESH_TLS_CA"])
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        print("proc", procs.spawn("e", Env).tls.call().get(timeout=30).values())
        procs.stop().get(timeout=30)
        """)], env=dict(os.environ, HPCMESH_HOSTS=cfg), capture_output=True, text=True,
        timeout=120)
    assert out.returncode == 0, out.stderr
    assert "client True trust_all_connections" in out.stdout, out.stdout
    assert "proc ['trust_all_connections']" in out.stdout, out.stdout


def test_transport_ca_that_cannot_work_names_the_config_line(no_slurm, monkeypatch):
    cfg = _write(no_slurm / "tlsca.yaml", """
        scheduler: local
        transport:
          ca: no-such-ca.pem
    """)
    monkeypatch.setenv("HPCMESH_HOSTS", cfg)
    with pytest.raises(ConfigError) as e:
        hosts_from_config()
    msg = str(e.value)
    assert msg.startswith(f"{cfg}:3: transport.ca: ") and "no-such-ca.pem" in msg, msg


# ---------------------------------------------------------------------------------------
# Slurm (test cluster)
# ---------------------------------------------------------------------------------------
def test_slurm_inside_salloc_adopts_the_allocation(slurm_cluster, tmp_path):
    cfg = _write(tmp_path / "slurm.yaml", """
        scheduler: slurm
        job: {nodes: 3}          # only used outside an allocation
        srun_args: ["--label"]
    """)
    script = _write(tmp_path / "adopt.py", """
        import json, os, subprocess
        from hpcmesh.hosts import hosts_from_config
        from hpcmesh.slurm import expand_hostlist
        out = {"alloc": os.environ["SLURM_JOB_ID"],
               "nodes": expand_hostlist(os.environ["SLURM_JOB_NODELIST"])}
        for label, value in (("file", os.environ.pop("CFG")), ("unset", None)):
            if value:
                os.environ["HPCMESH_HOSTS"] = value
            else:
                os.environ.pop("HPCMESH_HOSTS", None)
            hosts = hosts_from_config()
            steps = subprocess.run(["squeue", "--steps", "--noheader", "--format=%i",
                                    "--jobs=" + os.environ["SLURM_JOB_ID"]],
                                   capture_output=True, text=True).stdout.split()
            out[label] = {"extent": dict(hosts.extent), "hosts": hosts.hostnames,
                          "steps": steps, "argv": hosts.job.srun_argv}
            hosts.job.kill()
        print("RESULT " + json.dumps(out), flush=True)
    """)
    env = dict(os.environ, CFG=cfg)
    p = subprocess.run(["salloc", "-N2", f"--job-name=hpcm-hosts{os.getpid()}", PY, script],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    for label in ("file", "unset"):
        assert res[label]["extent"] == {"hosts": 2}
        assert res[label]["hosts"] == res["nodes"] and len(res["nodes"]) == 2
        assert len(res[label]["steps"]) == 1 and res[label]["steps"][0].startswith(res["alloc"])
    assert "--label" in res["file"]["argv"] and "--overlap" in res["file"]["argv"]
    deadline = time.monotonic() + 30          # salloc relinquished it; let it complete
    while res["alloc"] in subprocess.run([SQUEUE, "-h", "-o", "%i"], capture_output=True,
                                         text=True).stdout.split():
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_slurm_outside_allocation_submits_the_job(slurm_cluster, no_slurm, monkeypatch):
    cfg = _write(no_slurm / "slurm.yaml", f"""
        scheduler: slurm
        job:
          job_name: hpcm-hosts{os.getpid()}
          log_dir: {no_slurm}/logs
          nodes: 2
          gpus_per_node: 2
    """)
    monkeypatch.setenv("HPCMESH_HOSTS", cfg)
    hosts = hosts_from_config(timeout=60)
    job = hosts.job
    try:
        assert dict(hosts.extent) == {"hosts": 2}
        from hpcmesh.job.slurm import squeue_jobs
        assert hosts.hostnames == squeue_jobs([job.job_id])[job.job_id].nodes
    finally:
        job.kill()
    out = subprocess.run([SQUEUE, "--noheader", "--format=%i", f"--jobs={job.job_id}"],
                         capture_output=True, text=True).stdout.split()
    assert job.job_id not in out
