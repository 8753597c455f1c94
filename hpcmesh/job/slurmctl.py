"""The one place hpcmesh runs Slurm's commands (sbatch, squeue, scancel, scontrol, srun).

:mod:`hpcmesh.slurm.parsing` builds their argv and reads their output without any
I/O; this module runs them, with the same rules everywhere: the command must be on
PATH (else an error that says where to run instead), every call has a timeout (a
slurmctld that does not answer is an error, not a hang), stdin is closed. The job
kinds (SlurmJob, SlurmAllocation, SubmititJob) and ``hpcmesh status`` call these
functions instead of ``subprocess`` directly.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import time
from typing import Mapping, Sequence

from ..slurm.parsing import (JobRecord, SlurmParseError, command_for_squeue,
                             command_for_squeue_start, parse_scontrol_preempt_time,
                             parse_scontrol_restarts, parse_squeue,
                             parse_squeue_start, squeue_job_unknown)
from ..errors import HpcmeshError
from ..private_files import append_file

__all__ = ["SlurmError", "need", "run", "start_srun", "squeue_jobs", "squeue_expected_starts",
           "squeue_steps", "scancel", "scancel_once", "restart_count", "restarts_and_preemption"]


class SlurmError(HpcmeshError, RuntimeError):
    """A Slurm command failed or a Slurm job did not give us its host agents."""


def need(cmd: str) -> str:
    """The path of Slurm command ``cmd``; an error naming this host when it is missing
    (the usual cause: running on a machine that is not a Slurm login node)."""
    path = shutil.which(cmd)
    if path is None:
        raise SlurmError(f"`{cmd}` was not found on PATH, so hpcmesh cannot talk to Slurm from "
                         f"this machine ({socket.gethostname()}); run on a Slurm login node or "
                         f"inside an allocation, or add the Slurm client commands to PATH")
    return path


def run(argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run a Slurm command to its end and return what it said (text); the exit status is
    the caller's to judge. A command that does not answer in ``timeout`` s is a SlurmError."""
    need(argv[0])
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{shlex.join(argv)}` did not answer within {timeout:.0f} s "
                         f"(is slurmctld up?)") from None


def start_srun(argv: Sequence[str], env: Mapping[str, str], log_path: str) -> subprocess.Popen:
    """Start a long-running ``srun`` step in its own session, its output appended to
    ``log_path`` (never through a symlink, in a folder of this user's): the caller watches
    it (``poll()``) and stops it (scancel, then killpg)."""
    need(argv[0])
    with append_file(log_path, what="the srun log", mode=0o644) as out:
        return subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def squeue_jobs(job_ids: Sequence[str], *, timeout: float = 60.0) -> dict[str, JobRecord]:
    """squeue records by job id; ids squeue no longer knows are absent."""
    if not job_ids:
        return {}
    proc = run(command_for_squeue(list(job_ids)), timeout=timeout)
    if proc.returncode != 0:
        if squeue_job_unknown(proc.stderr):
            if len(job_ids) == 1:
                return {}
            out: dict[str, JobRecord] = {}
            for j in job_ids:       # one unknown id fails the whole call: ask one by one
                out.update(squeue_jobs([j], timeout=timeout))
            return out
        raise SlurmError(f"squeue failed (exit {proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()}")
    return {r.job_id: r for r in parse_squeue(proc.stdout)}


def squeue_expected_starts(job_ids: Sequence[str]) -> dict[str, str]:
    """Slurm's estimated start of pending jobs (``squeue --start``); {} when it has none
    or cannot say (progress only: never a reason to fail)."""
    try:
        proc = run(command_for_squeue_start(list(job_ids)), timeout=20)
        return parse_squeue_start(proc.stdout) if proc.returncode == 0 else {}
    except (SlurmError, SlurmParseError):
        return {}


def squeue_steps(job_id: str) -> list[tuple[str, str]]:
    """(step id ``job.step``, step name) of each step of a job; [] when squeue cannot say
    (a caller looking for its own step then finds none, which is what it must handle)."""
    try:
        proc = run(["squeue", "--steps", "--noheader", "--format=%i|%j", f"--jobs={job_id}"],
                   timeout=20)
    except SlurmError:
        return []
    out = []
    for line in proc.stdout.splitlines():
        sid, _, name = line.strip().partition("|")
        out.append((sid.strip(), name.strip()))
    return out


def scancel_once(ids: Sequence[str], *, signal: str | None = None,
                 timeout: float = 60.0) -> subprocess.CompletedProcess:
    """One ``scancel`` of jobs or steps, its answer unjudged, without waiting for them to
    end: for callers that watch the end their own way. ``signal`` (e.g. ``"HUP"``) sends
    that signal to the steps' tasks instead of cancelling (the batch shell gets none)."""
    return run(["scancel", *([f"--signal={signal}"] if signal else []), *ids], timeout=timeout)


def scancel(job_ids: Sequence[str], *, wait: float = 60.0) -> None:
    """Cancel jobs and wait until squeue no longer shows them pending/running/completing."""
    ids = [j for j in job_ids if j]
    if not ids:
        return
    proc = scancel_once(ids)
    if proc.returncode != 0 and "invalid job id" not in (proc.stderr or "").lower():
        raise SlurmError(f"scancel {' '.join(ids)} failed: {proc.stderr.strip()}")
    deadline = time.monotonic() + wait
    delay = 0.05
    while True:
        left = [r for r in squeue_jobs(ids).values() if r.is_active]
        if not left:
            return
        if time.monotonic() > deadline:
            raise SlurmError(f"job(s) {', '.join(r.job_id for r in left)} still "
                             f"{', '.join(r.state for r in left)} {wait:.0f} s after scancel")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def restart_count(job_id: str) -> int | None:
    """How often the job was requeued (``Restarts=N`` of ``scontrol show job``); None if
    scontrol cannot say."""
    return restarts_and_preemption(job_id)[0]


def restarts_and_preemption(job_id: str) -> tuple[int | None, str | None]:
    """``scontrol show job``'s restart count (None: it cannot say) and PreemptTime (None:
    the job was not chosen for preemption, or scontrol cannot say), in one call."""
    try:
        proc = run(["scontrol", "-o", "show", "job", job_id], timeout=20)
    except SlurmError:
        return None, None
    return parse_scontrol_restarts(proc.stdout), parse_scontrol_preempt_time(proc.stdout)
