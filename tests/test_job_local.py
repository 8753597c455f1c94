"""LocalJob / BatchJob / the job cache, with real processes."""

import os
import stat
import textwrap

import pytest

from hpcmesh.job import (LocalJob, activate_context, job_load, job_loads,
                         load_current_job, set_current_job)


def test_state_attributes_and_wrong_name(tmp_path):
    job = LocalJob(hosts=("trainers", "evaluators"))
    state = job.state(cached_path=str(tmp_path / "state.pkl"))
    assert state.trainers.extent == {}
    assert state.evaluators.hostnames == [os.uname().nodename]
    with pytest.raises(AttributeError, match="no mesh 'generators'.*evaluators, trainers"):
        state.generators


def test_apply_gives_fresh_apply_id():
    job = LocalJob()
    job.apply()
    first = job.apply_id
    job.apply()
    assert job.apply_id != first and job.active


def test_dump_follows_symlink_creates_dirs_mode_0600(tmp_path):
    job = LocalJob(hosts=("a",))
    job.apply()
    target = tmp_path / "ctx" / "deep" / "state.pkl"
    link = tmp_path / "link.pkl"
    os.makedirs(target.parent)
    os.symlink(target, link)
    job.dump(str(link))
    assert os.path.islink(link) and target.exists()
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    loaded = job_load(str(link))
    assert isinstance(loaded, LocalJob) and loaded.hosts == ("a",)
    assert job_loads(job.dumps()).apply_id == job.apply_id


def test_cached_job_reused_or_replaced(tmp_path):
    cache = str(tmp_path / "job_state.pkl")
    a = LocalJob(hosts=("x",))
    a.state(cached_path=cache)
    a_id = job_load(cache).apply_id
    LocalJob(hosts=("x",)).state(cached_path=cache)
    assert job_load(cache).apply_id == a_id           # same spec: the running job serves it
    LocalJob(hosts=("y",)).state(cached_path=cache)
    assert job_load(cache).hosts == ("y",)            # other spec: replaced


def test_contexts_and_current_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "myjobs.py").write_text("from hpcmesh.job import LocalJob\nJOB = LocalJob(hosts=('w',))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HPCMESH_CONTEXT", "exp1")
    set_current_job("myjobs.JOB")
    assert os.readlink(".hpcmesh/job_state.pkl") == os.path.join("exp1", "state.pkl")
    assert load_current_job().hosts == ("w",)
    with pytest.raises(AttributeError, match="no attribute 'NOPE'"):
        set_current_job("myjobs.NOPE")
    with pytest.raises(LookupError, match="no current job in context 'other'"):
        load_current_job("other")
    assert activate_context("other").endswith("job_state.pkl")


def test_client_script_connects_via_batch_detection(tmp_path):
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent("""
        from hpcmesh.actor import Actor, endpoint
        from hpcmesh.job import BatchJob, LocalJob, in_batch_job

        class Echo(Actor):
            @endpoint
            def echo(self, x):
                return x * 2

        job = BatchJob(LocalJob(hosts=("w",)))
        assert in_batch_job()
        state = job.state()
        procs = state.w.spawn_procs({"gpus": 2})
        print("RESULT", procs.spawn("e", Echo).echo.call(21).get(timeout=30).values(), flush=True)
        procs.stop().get(timeout=30)
    """))
    job = LocalJob(hosts=("w",), log_dir=str(tmp_path / "logs"))
    job.apply(client_script=str(script))
    assert job.wait_client(timeout=60) == 0
    with open(job.client_log) as f:
        assert "RESULT [42, 42]" in f.read()


def test_what_a_job_says_of_itself_before_it_connects():
    """``hpcmesh status`` asks each kind (describe_meshes, slurm_job_ids): a kind that says
    nothing gets the JobTrait defaults, a BatchJob answers for the job it wraps."""
    import socket

    from hpcmesh.job import BatchJob, JobTrait, SlurmAllocation, SlurmJob

    class Bare(JobTrait):
        _create = _state = _kill = _is_active = _spec_key = lambda self, *a: None

    assert Bare().describe_meshes() == {} and Bare().slurm_job_ids() == []
    local = LocalJob(hosts=("trainers", "eval"))
    here = f"this host ({socket.gethostname()})"
    assert local.describe_meshes() == {"trainers": here, "eval": here}
    assert local.slurm_job_ids() == []
    slurm = SlurmJob(meshes={"trainers": 2, "eval": 1})
    assert slurm.describe_meshes() == {"trainers": "2 node(s)", "eval": "1 node(s)"}
    assert slurm.slurm_job_ids() == []          # not submitted yet
    slurm.job_ids = ["41", "42"]
    assert BatchJob(slurm).slurm_job_ids() == ["41", "42"]
    assert BatchJob(slurm).describe_meshes() == slurm.describe_meshes()
    alloc = SlurmAllocation()
    assert alloc.slurm_job_ids() == []
    alloc.job_id = "7"
    assert alloc.slurm_job_ids() == ["7"]


def test_a_group_writable_umask_still_gives_a_cache_hpcmesh_trusts(tmp_path):
    # the cache is refused in a folder group or others can write (test_shared_node_files):
    # so hpcmesh's own folders must not be, whatever the umask. Under umask 002 a plain
    # os.makedirs of .hpcmesh/logs (the agent's, the client script's) made .hpcmesh 0775.
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (tmp_path / "client.py").write_text("print('client ran')\n")
    code = textwrap.dedent("""
        import os
        os.umask(0o002)
        from hpcmesh.actor import this_host
        from hpcmesh.job import LocalJob
        this_host().spawn_procs(per_host={"gpus": 1})     # the agent makes .hpcmesh/logs/...
        job = LocalJob()
        job.apply(client_script="client.py")             # its state file goes there too
        print("client", job.wait_client(timeout=60))
        LocalJob().state()
        print("cached")
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": repo})
    assert r.returncode == 0 and r.stdout.split() == ["client", "0", "cached"], r.stderr
    for folder in (".hpcmesh", ".hpcmesh/logs"):
        assert stat.S_IMODE(os.stat(tmp_path / folder).st_mode) & 0o022 == 0, folder
    assert isinstance(job_load(str(tmp_path / ".hpcmesh" / "job_state.pkl")), LocalJob)
