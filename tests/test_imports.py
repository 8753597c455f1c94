"""What importing hpcmesh pulls in: torch only where collectives are used."""

import subprocess
import sys

import pytest


def _modules_after(stmt: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{stmt}\nimport sys\nprint('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True, timeout=60)
    return set(out.stdout.split())


def test_actor_api_does_not_import_torch_or_slurm_glue():
    mods = _modules_after("import hpcmesh.actor")
    assert "torch" not in mods
    assert "submitit" not in mods and "mpi4py" not in mods


def test_worker_process_entry_does_not_import_torch():
    # the public name (runtime/proc.py) and the module it runs
    assert "torch" not in _modules_after("import hpcmesh.runtime.proc")
    assert "torch" not in _modules_after("import hpcmesh.runtime.process.proc")
    # the one maker of torch stores loads torch only when it makes one
    assert "torch" not in _modules_after("import hpcmesh.runtime.torch_store")


def test_jobs_and_cli_do_not_import_torch():
    mods = _modules_after("import hpcmesh.job, hpcmesh.cli, hpcmesh.hosts")
    assert "torch" not in mods


def test_the_slurm_agent_and_slurm_notice_load_no_login_side():
    # each srun step's host agent runs AGENT_CODE on a compute node, and actors call
    # slurm_notice(): neither needs sbatch/squeue (job/slurm.py), submitit or the actor layer
    from hpcmesh.job.slurm_agent import AGENT_CODE
    agent = "from hpcmesh.job.slurm_agent import agent_main"
    assert AGENT_CODE.startswith(agent + ";")
    for stmt in (agent, "from hpcmesh.job import slurm_notice"):
        mods = _modules_after(stmt)
        assert not {"hpcmesh.job.slurm", "hpcmesh.job.allocation", "hpcmesh.actor",
                    "submitit"} & mods, stmt


def test_the_job_face_hands_out_every_name_from_its_home():
    import hpcmesh.job
    import hpcmesh.job.remote_shell
    import hpcmesh.job.slurm
    namespace: dict = {}
    exec("from hpcmesh.job import *", namespace)
    assert set(hpcmesh.job.__all__) <= set(namespace) and set(hpcmesh.job.__all__) <= \
        set(dir(hpcmesh.job))
    # the function, whichever of its modules was imported first
    assert hpcmesh.job.shell is hpcmesh.job.remote_shell.shell and callable(hpcmesh.job.shell)
    assert hpcmesh.job.SlurmJob is hpcmesh.job.slurm.SlurmJob
    assert hpcmesh.job.slurm_notice is hpcmesh.job.slurm.slurm_notice   # its old home too
    with pytest.raises(AttributeError, match="no_such_name"):
        hpcmesh.job.no_such_name


def test_hosts_from_config_from_the_seed_and_monarch_paths():
    # the seed writes `from monarch.job import hosts_from_config`; Monarch programs also take
    # it from monarch.actor: both paths give the one function
    import hpcmesh
    import hpcmesh.actor
    import hpcmesh.hosts
    from hpcmesh.actor import hosts_from_config as from_actor
    from hpcmesh.job import hosts_from_config as from_job
    assert from_job is from_actor is hpcmesh.hosts.hosts_from_config is hpcmesh.hosts_from_config
    assert "hosts_from_config" in hpcmesh.job.__all__
    # the actor facade hands it out lazily: importing hpcmesh.actor alone loads no job layer
    assert "hpcmesh.job" not in _modules_after("import hpcmesh.actor")
    try:
        hpcmesh.actor.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("hpcmesh.actor.no_such_name should raise AttributeError")


def test_spmd_on_the_controller_does_not_import_torch():
    # setup_torch_elastic_env runs on the controller; only the actors need torch
    assert "torch" not in _modules_after("import hpcmesh.spmd")
