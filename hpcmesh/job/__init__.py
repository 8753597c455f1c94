"""Jobs (``monarch.job`` equivalents): where the host meshes come from."""

from .base import (JobState, JobTrait, activate_context, job_load, job_loads, load_current_job,
                   set_current_job)
from .local import BatchJob, LocalJob, in_batch_job
from .process import ProcessJob
from .shell import shell

__all__ = ["JobTrait", "JobState", "LocalJob", "BatchJob", "ProcessJob", "shell", "job_load",
           "job_loads", "set_current_job", "load_current_job", "activate_context",
           "in_batch_job"]

# Slurm (SlurmJob from a login node; SlurmAllocation inside salloc/sbatch)
from .slurm import (SlurmError, SlurmHostMesh, SlurmJob, SlurmJobFailed, SlurmStartTimeout,
                    SlurmSubmitError, slurm_bootstrap)
from .slurm_agent import slurm_notice
from .allocation import SlurmAllocation, current_allocation

__all__ += ["SlurmJob", "SlurmAllocation", "SlurmHostMesh", "SlurmError", "SlurmSubmitError",
            "SlurmJobFailed", "SlurmStartTimeout", "slurm_bootstrap", "slurm_notice",
            "current_allocation"]

# exec_command / BashActor, SSHJob / LoginJob, SubmititJob (submitit is imported only on apply)
from .exec import BashActor, exec_command, exec_python  # noqa: E402
from .ssh import LoginJob, SSHJob  # noqa: E402
from .submitit_job import SubmititJob  # noqa: E402

__all__ += ["BashActor", "exec_command", "exec_python", "LoginJob", "SSHJob", "SubmititJob"]

# the seed's import path (``from monarch.job import hosts_from_config``)
from ..hosts import hosts_from_config  # noqa: E402

__all__ += ["hosts_from_config"]

# the admin view's configuration (``job.enable_admin(MeshAdminConfig(...))``)
from ..admin.config import MeshAdminConfig  # noqa: E402

__all__ += ["MeshAdminConfig"]
