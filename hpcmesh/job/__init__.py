"""Jobs (``monarch.job`` equivalents): where the host meshes come from.

Every name here is handed out on first use (PEP 562), from the module that defines it.
Importing any module of this package runs this file first, and the compute-node side
imports some: each Slurm host agent runs ``hpcmesh.job.slurm_agent``, and actors read
``slurm_notice``. A face that imported every job kind up front would load the login side
(sbatch and squeue, submitit, ssh, the actor layer) into every agent and actor process.
"""

from __future__ import annotations

import importlib

#: Name -> the module that defines it (relative to this package).
_HOMES = {
    **dict.fromkeys(("JobState", "JobTrait", "activate_context", "job_load", "job_loads",
                     "load_current_job", "set_current_job"), ".base"),
    **dict.fromkeys(("LocalJob", "BatchJob", "in_batch_job"), ".local"),
    "ProcessJob": ".process",
    "shell": ".remote_shell",
    # Slurm (SlurmJob from a login node; SlurmAllocation inside salloc/sbatch)
    **dict.fromkeys(("SlurmJob", "SlurmHostMesh", "SlurmSubmitError", "SlurmJobFailed",
                     "SlurmStartTimeout", "slurm_bootstrap"), ".slurm"),
    "SlurmError": ".slurmctl",
    "slurm_notice": ".slurm_agent",
    "JobEvent": ".events",
    **dict.fromkeys(("SlurmAllocation", "current_allocation"), ".allocation"),
    # exec_command / BashActor, SSHJob / LoginJob, SubmititJob (submitit loads on apply)
    **dict.fromkeys(("BashActor", "exec_command", "exec_python"), ".exec"),
    **dict.fromkeys(("LoginJob", "SSHJob"), ".ssh"),
    "SubmititJob": ".submitit_job",
    # the seed's import path (``from monarch.job import hosts_from_config``)
    "hosts_from_config": "..hosts",
    # the admin view's configuration (``job.enable_admin(MeshAdminConfig(...))``)
    "MeshAdminConfig": "..admin.config",
}

__all__ = list(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'hpcmesh.job' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value         # once: the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
