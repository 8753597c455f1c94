"""Slurm without I/O: SLURM_* and squeue/sacct parsing, job specs, sbatch rendering.

Everything here is pure so it can be tested on recorded output; running the
commands is the job layer's business (``hpcmesh.job``).
"""

from .parsing import (
    SACCT_FORMAT,
    SLURM_STATES_ACTIVE,
    SLURM_STATES_TERMINAL,
    SQUEUE_FORMAT,
    Allocation,
    JobRecord,
    SacctRecord,
    SlurmParseError,
    clean_env_for_nested_srun,
    command_for_sacct,
    command_for_squeue,
    compress_hostlist,
    expand_hostlist,
    normalize_state,
    parse_exit_code,
    parse_gpu_count,
    parse_sacct,
    parse_sbatch_parsable,
    parse_slurm_duration,
    parse_squeue,
    parse_tasks_per_node,
    sacct_unavailable,
    squeue_job_unknown,
)
from .render import render_sbatch, sbatch_submit_command, sbatch_test_only_command
from .spec import JobSpec, MeshSpec, SpecError, load_job_spec, parse_job_spec, parse_yaml_with_lines

__all__ = [
    "SACCT_FORMAT",
    "SLURM_STATES_ACTIVE",
    "SLURM_STATES_TERMINAL",
    "SQUEUE_FORMAT",
    "Allocation",
    "JobRecord",
    "JobSpec",
    "MeshSpec",
    "SacctRecord",
    "SlurmParseError",
    "SpecError",
    "clean_env_for_nested_srun",
    "command_for_sacct",
    "command_for_squeue",
    "compress_hostlist",
    "expand_hostlist",
    "load_job_spec",
    "normalize_state",
    "parse_exit_code",
    "parse_gpu_count",
    "parse_job_spec",
    "parse_sacct",
    "parse_sbatch_parsable",
    "parse_slurm_duration",
    "parse_squeue",
    "parse_tasks_per_node",
    "parse_yaml_with_lines",
    "render_sbatch",
    "sacct_unavailable",
    "sbatch_submit_command",
    "sbatch_test_only_command",
    "squeue_job_unknown",
]
