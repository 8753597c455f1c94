"""Jobs (``monarch.job`` equivalents): where the host meshes come from."""

from .base import (JobState, JobTrait, activate_context, job_load, job_loads, load_current_job,
                   set_current_job)
from .local import BatchJob, LocalJob, in_batch_job

__all__ = ["JobTrait", "JobState", "LocalJob", "BatchJob", "job_load", "job_loads",
           "set_current_job", "load_current_job", "activate_context", "in_batch_job"]
