"""The ``hpcmesh`` command, run as a real subprocess (``python -m hpcmesh``)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proc_helpers import wait_gone

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_SPEC = REPO / "configs" / "job_spec.example.yaml"


def hm(*args, cwd=None, env=None, timeout=90, input=None):
    e = dict(os.environ)
    e.pop("HPCMESH_CONTEXT", None)
    e.pop("HPCMESH_STATE_DIR", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "hpcmesh", *args], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=timeout, input=input)


# -- help / version ------------------------------------------------------------------------
def test_version_and_help_for_every_command():
    r = hm("--version")
    assert r.returncode == 0 and r.stdout.startswith("hpcmesh ")
    for cmd in ("apply", "status", "kill", "exec", "render", "info", "worker"):
        r = hm(cmd, "--help")
        assert r.returncode == 0, (cmd, r.stderr)
        assert "usage:" in r.stdout and len(r.stdout) > 200, cmd
    r = hm()
    assert r.returncode == 2 and "COMMAND" in r.stderr


def test_unknown_command_and_bad_option_exit_2():
    r = hm("frobnicate")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = hm("exec", "--rank", "x", "--", "true")
    assert r.returncode == 2 and "invalid int value" in r.stderr


# -- render --------------------------------------------------------------------------------
def test_render_example_spec():
    r = hm("render", str(EXAMPLE_SPEC))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "#!/bin/bash"
    sbatch = [ln for ln in lines if ln.startswith("#SBATCH ")]
    for expected in ("--job-name=rl-train", "--nodes=6", "--ntasks-per-node=1",
                     "--cpus-per-task=64", "--gpus-per-node=8", "--mem=0", "--time=04:00:00",
                     "--partition=gpu", "--account=myproject", "--constraint=a100",
                     "--exclusive", "--signal=B:USR1@120", "--requeue", "--mail-type=FAIL"):
        assert f"#SBATCH {expected}" in sbatch, expected
    assert "#SBATCH --output=.hpcmesh/logs/rl-train-%j.out" in sbatch
    srun = [ln for ln in lines if ln.startswith("exec srun")]
    assert len(srun) == 2
    assert "--nodes=4" in srun[0] and "--relative=0" in srun[0]
    assert "--nodes=2" in srun[1] and "--relative=4" in srun[1]
    assert "module load cuda/12.4" in lines
    assert "export OMP_NUM_THREADS=8" in lines
    # same spec twice: same script (the render is a pure function of the spec)
    assert hm("render", str(EXAMPLE_SPEC)).stdout == r.stdout


def test_render_cli_worker_and_attach():
    r = hm("render", "--cli-worker", "--attach", "tcp://10.0.0.1:1234", str(EXAMPLE_SPEC))
    assert r.returncode == 0
    assert " -P -m hpcmesh worker --attach tcp://10.0.0.1:1234" in r.stdout


def test_render_bad_spec_names_file_line_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("job_name: x\nmeshes:\n  trainers:\n    nodes: 2\n    gpu_per_node: 4\n")
    r = hm("render", str(bad))
    assert r.returncode == 2
    assert r.stdout == ""
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{bad}:5:" in err and "gpu_per_node" in err and "gpus_per_node" in err
    assert "Traceback" not in r.stderr


def test_render_bad_value_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("meshes:\n  a:\n    nodes: -1\n")
    r = hm("render", str(bad))
    assert r.returncode == 2 and f"{bad}:3:" in r.stderr and "nodes" in r.stderr
    r = hm("render", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "no such file" in r.stderr


def test_render_separate_allocations(tmp_path):
    spec = tmp_path / "two.yaml"
    spec.write_text("job_name: x\nsame_allocation: false\nmeshes:\n  a: 1\n"
                    "  b: {nodes: 2, partition: batch}\n")
    r = hm("render", str(spec))
    assert r.returncode == 0
    assert r.stdout.count("#!/bin/bash") == 2
    assert "#SBATCH --job-name=x-a" in r.stdout and "#SBATCH --job-name=x-b" in r.stdout
    r = hm("render", "--mesh", "b", str(spec))
    assert r.stdout.count("#!/bin/bash") == 1 and "#SBATCH --nodes=2" in r.stdout
    r = hm("render", "--mesh", "zz", str(spec))
    assert r.returncode == 2 and "zz" in r.stderr


# -- info ----------------------------------------------------------------------------------
def test_info_shows_interface_table_and_choice():
    r = hm("info")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"host:        {socket.gethostname()}" in out
    assert "INTERFACE" in out and "CHOICE" in out and "KIND" in out
    assert "chosen:" in out and "chosen #0" in out
    assert "extent:" in out and "gpus:" in out and "slurm:" in out


def test_info_shows_the_gpus_nvidia_smi_reports(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-1f2e, NVIDIA H200, 37, 1024, 143771'\n")
    smi.chmod(0o755)
    r = hm("info", env={"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    assert "nvidia-smi: 1 GPU(s)\n    0, NVIDIA H200, 143771 MiB\n" in r.stdout


def test_info_explicit_interface_and_fake_allocation():
    env = {"HPCMESH_IFNAME": "lo", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-3]",
           "SLURM_JOB_NUM_NODES": "3", "SLURM_TASKS_PER_NODE": "2(x3)",
           "SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    r = hm("info", env=env)
    assert r.returncode == 0, r.stderr
    assert "HPCMESH_IFNAME=lo" in r.stdout
    assert "chosen:      lo 127.0.0.1" in r.stdout
    assert "job 77" in r.stdout and "3 (n[1-3])" in r.stdout
    assert "tasks/node: 2,2,2" in r.stdout
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in r.stdout
    r = hm("info", "--json", env=env)
    import json
    data = json.loads(r.stdout)
    assert data["slurm"]["job_id"] == "77" and data["candidates"][0]["ifname"] == "lo"
    r = hm("info", env={"HPCMESH_IFNAME": "nosuchif0"})
    assert r.returncode == 1 and "chosen:      none" in r.stdout


# -- worker --------------------------------------------------------------------------------
def test_worker_without_secret_is_a_clear_usage_error():
    env = {"HPCMESH_SECRET": "", "HPCMESH_SECRET_FILE": ""}
    r = hm("worker", "--attach", "tcp://127.0.0.1:9", env=env, timeout=30)
    assert r.returncode == 2
    assert "no job secret" in r.stderr and "HPCMESH_SECRET" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    r = hm("worker", env={"HPCMESH_SECRET": "zz"}, timeout=30)
    assert r.returncode == 2 and "secret" in r.stderr
    r = hm("worker", "--secret-stdin", input="", env=env, timeout=30)
    assert r.returncode == 2 and "stdin" in r.stderr
    r = hm("worker", "--listen", "http://x", env={"HPCMESH_SECRET": "ab" * 16}, timeout=30)
    assert r.returncode == 2 and "--listen" in r.stderr


def test_worker_serves_a_client_and_dies_cleanly_on_sigterm(tmp_path):
    """`hpcmesh worker --listen`: a client attaches, spawns processes, calls an actor; SIGTERM
    while the client is still connected stops the agent and the processes it started."""
    from hpcmesh.actor import Actor, attach_to_workers, endpoint

    class Pid(Actor):
        @endpoint
        def pid(self):
            return os.getpid()

    secret = os.urandom(32)
    ready = tmp_path / "ready"
    env = dict(os.environ, HPCMESH_SECRET=secret.hex())
    agent = subprocess.Popen([sys.executable, "-m", "hpcmesh", "worker", "--listen",
                              "tcp://127.0.0.1:0", "--ready-file", str(ready), "--grace", "30"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text().strip()):
            assert agent.poll() is None, agent.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        addr = ready.read_text().split()[0]
        hosts = attach_to_workers([addr], secret=secret, timeout=30)
        procs = hosts.spawn_procs({"p": 2})
        pids = procs.spawn("pid", Pid).pid.call().get(timeout=60).values()
        assert len(set(pids)) == 2
        for r in procs.records:
            r.stopping = True           # we are about to kill them on purpose
        t0 = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(15) == 0
        assert time.monotonic() - t0 < 10
        assert "received SIGTERM" in agent.stderr.read()
        assert wait_gone(pids, 10) == [], "processes survived their agent"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


# -- apply / status / exec / kill with a LocalJob -------------------------------------------
@pytest.fixture
def job_dir(tmp_path):
    (tmp_path / "myjobs.py").write_text(
        "from hpcmesh.job import LocalJob\n"
        "local = LocalJob()\n"
        "two = LocalJob(hosts=('trainers', 'eval'))\n"
        "def make():\n"
        "    return LocalJob()\n"
        "not_a_job = 42\n")
    return tmp_path


def test_apply_status_exec_kill_local_job(job_dir):
    env = {"PYTHONPATH": str(job_dir)}
    r = hm("status", cwd=job_dir, env=env)
    assert r.returncode == 1 and "no job" in r.stdout
    r = hm("apply", "myjobs.local", cwd=job_dir, env=env)
    assert r.returncode == 0, r.stderr
    assert "applied myjobs.local (LocalJob)" in r.stdout and "hosts:" in r.stdout
    assert os.path.islink(job_dir / ".hpcmesh" / "job_state.pkl")
    r = hm("status", cwd=job_dir, env=env)
    assert r.returncode == 0, r.stderr
    assert "kind:     LocalJob" in r.stdout and "active:   yes" in r.stdout
    assert "spec:     myjobs.local" in r.stdout and "hosts: this host" in r.stdout

    r = hm("exec", "--", "hostname", cwd=job_dir, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"[0] {socket.gethostname()}"]
    r = hm("exec", "--per-host", "gpus=2", "--", "echo $HPCMESH_SUBDIR; exit $HPCMESH_RANK_gpus",
           cwd=job_dir, env=env)
    assert r.returncode == 1
    assert sorted(r.stdout.splitlines()) == ["[gpus=0] gpus_0", "[gpus=1] gpus_1"]
    r = hm("exec", "--per-host", "gpus=2", "--rank", "1", "--", "sh", "-c", "echo r$HPCMESH_RANK",
           cwd=job_dir, env=env)
    assert r.returncode == 0 and r.stdout.splitlines() == ["[gpus=1] r1"]
    gpus = {**env, "CUDA_VISIBLE_DEVICES": "3,5"}
    r = hm("exec", "--per-host", "gpus=2", "--point", "gpus=1", "--gpu-binding", "process", "--",
           "echo $CUDA_VISIBLE_DEVICES $LOCAL_RANK $HPCMESH_LOCAL_SLOT", cwd=job_dir, env=gpus)
    assert r.returncode == 0 and r.stdout.splitlines() == ["[gpus=1] 5 0 1"], r.stderr
    r = hm("exec", "--per-host", "gpus=2", "--", "true", cwd=job_dir,
           env={**gpus, "HPCMESH_GPU_BINDING": "pinned"})
    assert r.returncode == 2 and "HPCMESH_GPU_BINDING must be one of host, process" in r.stderr
    r = hm("exec", "--rank", "5", "--", "true", cwd=job_dir, env=env)
    assert r.returncode == 2 and "out of range" in r.stderr
    r = hm("exec", "--point", "gpus=0", "--", "true", cwd=job_dir, env=env)
    assert r.returncode == 2 and "'gpus'" in r.stderr
    r = hm("exec", "--", "exit 7", cwd=job_dir, env=env)
    assert r.returncode == 7
    r = hm("exec", cwd=job_dir, env=env)
    assert r.returncode == 2 and "needs a command" in r.stderr

    r = hm("kill", cwd=job_dir, env=env)
    assert r.returncode == 0 and "killed LocalJob" in r.stdout
    r = hm("status", cwd=job_dir, env=env)
    assert r.returncode == 1 and "not applied" in r.stdout
    r = hm("kill", cwd=job_dir, env=env)
    assert r.returncode == 1 and "nothing to kill" in r.stderr


def test_exec_one_argument_is_a_shell_line_unless_no_shell(job_dir):
    """A single argument goes through `bash -c` (the help says so); --no-shell execs it as
    srun and mpiexec do, so a program path from a script is never shell text (issue 28)."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(job_dir),
                                                       os.environ.get("PYTHONPATH")]))}
    prog = job_dir / "my prog; echo INJECTED"
    prog.write_text("#!/bin/sh\necho RAN\n")
    prog.chmod(0o755)
    help_text = " ".join(hm("exec", "--help").stdout.split())
    assert "A single argument is a shell command line: each host runs it with `bash -c`" \
        in help_text and "--no-shell exec a single-argument COMMAND as a program" in help_text
    assert hm("apply", "myjobs.local", cwd=job_dir, env=env).returncode == 0
    try:
        r = hm("exec", "--no-shell", "--", str(prog), cwd=job_dir, env=env)
        assert r.returncode == 0 and r.stdout.splitlines() == ["[0] RAN"], r.stderr
        r = hm("exec", "--no-shell", "--", "echo $HPCMESH_RANK", cwd=job_dir, env=env)
        assert r.returncode == 127 and "echo $HPCMESH_RANK: command not found" in r.stderr
        r = hm("exec", "--", "echo $HPCMESH_RANK", cwd=job_dir, env=env)
        assert r.returncode == 0 and r.stdout.splitlines() == ["[0] 0"], r.stderr
    finally:
        hm("kill", cwd=job_dir, env=env)


def test_apply_errors_and_contexts(job_dir):
    env = {"PYTHONPATH": str(job_dir)}
    r = hm("apply", "myjobs.nope", cwd=job_dir, env=env)
    assert r.returncode == 2 and "no attribute 'nope'" in r.stderr
    r = hm("apply", "nosuchmodule_xyz.job", cwd=job_dir, env=env)
    assert r.returncode == 2 and "nosuchmodule_xyz" in r.stderr
    r = hm("apply", "myjobs.not_a_job", cwd=job_dir, env=env)
    assert r.returncode == 2 and "not an hpcmesh job" in r.stderr
    r = hm("apply", "noattr", cwd=job_dir, env=env)
    assert r.returncode == 2 and "module.attr" in r.stderr
    # no PYTHONPATH: the current directory is searched, like python -m
    r = hm("apply", "--context", "other", "myjobs.two", cwd=job_dir)
    assert r.returncode == 0, r.stderr
    r = hm("exec", "--context", "other", "--", "echo $HPCMESH_RANK", cwd=job_dir)
    assert r.returncode == 0
    assert sorted(r.stdout.splitlines()) == ["[eval 0] 0", "[trainers 0] 0"]
    r = hm("exec", "--context", "other", "--mesh", "eval", "--", "echo hi", cwd=job_dir)
    assert r.stdout.splitlines() == ["[0] hi"]
    r = hm("exec", "--context", "other", "--mesh", "zz", "--", "true", cwd=job_dir)
    assert r.returncode == 2 and "trainers" in r.stderr
    r = hm("status", cwd=job_dir, env={"HPCMESH_CONTEXT": "other"})
    assert r.returncode == 0 and "context:  other" in r.stdout
    r = hm("apply", "myjobs.make", cwd=job_dir)   # a function returning a job
    assert r.returncode == 0, r.stderr
    r = hm("status", cwd=job_dir)
    assert "spec:     myjobs.make" in r.stdout
