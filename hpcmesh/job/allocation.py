"""SlurmAllocation: adopt the Slurm allocation this client already runs in.

Inside ``salloc`` or an sbatch script, the allocation is read from the
``SLURM_*`` variables (:meth:`hpcmesh.slurm.parsing.Allocation.from_env`) and one
host agent per node is started with::

    srun --overlap --nodes=N --ntasks=N --ntasks-per-node=1 \\
         (--cpus-per-task=C | --cpu-bind=none) --kill-on-bad-exit=1 --job-name=hpcmesh-agents-XXXX \\
         <python> -c "from hpcmesh.job.slurm_agent import agent_main; agent_main()" --attach <client>

with the environment cleaned for a nested launch (``clean_env_for_nested_srun``:
no inherited step ids, CPU binding, conflicting ``SLURM_MEM_PER_*``...). No new
job is submitted: the agents are one step of the existing allocation, and they
dial back to this client. ``kill()`` ends that step; so does the client's exit
(at exit, or ``grace`` seconds after a crash through the agents' lease).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import time
import weakref
from typing import Any, Sequence

from ..log_tail import log_tail
from ..private_files import private_dir
from ..settings import env_number
from ..slurm.parsing import (Allocation, SlurmParseError, clean_env_for_nested_srun,
                             slurm_restart_count)
from .base import JobState, JobTrait, cache_top
from ..progress import Progress
from .start_limits import check_seconds
from . import slurmctl
from .slurm import SlurmHostMesh, SlurmJobFailed, SlurmStartTimeout, client_attach_addresses
from .slurm_agent import agent_command, agent_token
from .slurmctl import SlurmError

log = logging.getLogger("hpcmesh.job.allocation")

__all__ = ["SlurmAllocation", "current_allocation"]


def current_allocation(env=os.environ) -> Allocation | None:
    """The allocation this process runs in (None outside Slurm); errors name the variable."""
    try:
        return Allocation.from_env(env)
    except SlurmParseError as e:
        raise SlurmParseError(f"cannot read this process's Slurm allocation from its "
                              f"environment: {e}") from None


class SlurmAllocation(JobTrait):
    """One host agent per node of the current Slurm allocation, as a HostMesh.

    ``SlurmAllocation().state().hosts`` (or ``.host_mesh()``) is ``{"hosts": N}`` over
    the allocation's nodes in Slurm order. ``nodes`` limits it to the first N nodes;
    ``cpus_per_task`` is passed to srun explicitly (srun no longer inherits it); with
    none known, ``--cpu-bind=none`` keeps the agent's processes off a single CPU.
    ``srun_args`` are added verbatim. Not cached across processes: its agents are a
    step owned by this client.
    """

    def __init__(self, mesh_name: str = "hosts", *, nodes: int | None = None,
                 cpus_per_task: int | None = None, srun_args: Sequence[str] = (),
                 python_exe: str | None = None, grace: float | None = None,
                 timeout: float = 120.0, log_dir: str = ".hpcmesh/logs",
                 env: dict[str, str | None] | None = None, progress: bool | None = None):
        super().__init__()
        if not isinstance(mesh_name, str) or not mesh_name.isidentifier():
            raise ValueError(f"mesh_name must be an identifier like 'hosts', got {mesh_name!r}")
        if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int)
                                  or nodes < 1):
            raise ValueError(f"nodes must be a positive integer or None, got {nodes!r}")
        if isinstance(srun_args, str):
            import shlex
            srun_args = shlex.split(srun_args)
        self.mesh_name = mesh_name
        self.nodes = nodes
        self.cpus_per_task = cpus_per_task
        self.srun_args = list(srun_args)
        self.python_exe = python_exe or sys.executable
        self.grace = float(grace) if grace is not None else env_number("HPCMESH_LEASE_GRACE", 30, finite=True)
        # no queue here (the allocation is ours): one limit, on the srun step's bring-up
        self.timeout = check_seconds("SlurmAllocation", "timeout", timeout)
        self.log_dir = os.path.abspath(log_dir)
        self.env = dict(env or {})
        self.progress = progress
        self.job_id: str | None = None
        self.step_name: str | None = None
        self.srun_log: str | None = None
        self.srun_argv: list[str] = []
        self.timings: dict[str, float] = {}
        self.allocation: Allocation | None = None

    def slurm_job_ids(self) -> list[str]:
        return [self.job_id] if self.job_id else []

    def _spec_key(self) -> Any:
        return ("slurm-allocation", self.mesh_name, self.nodes, self.cpus_per_task,
                tuple(self.srun_args), self.python_exe)

    # -- life cycle ---------------------------------------------------------------------
    def state(self, cached_path: str | None = None) -> JobState:
        """The allocation's HostMesh (never cached: the agents belong to this process)."""
        return super().state(cached_path)

    def host_mesh(self) -> SlurmHostMesh:
        return getattr(self.state(), self.mesh_name)

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise ValueError("SlurmAllocation runs inside the allocation already; run the "
                             "client script directly (client_script is for SlurmJob)")
        from ..runtime.client import client_runtime
        from .attach import AttachWaiter
        alloc = current_allocation()
        if alloc is None:
            raise SlurmError("SlurmAllocation must run inside a Slurm allocation (salloc, or "
                             "an sbatch script): SLURM_JOB_ID is not set in this process. "
                             "From a login node use SlurmJob, which submits a job")
        slurmctl.need("srun")
        n = self.nodes or alloc.num_nodes
        if n > alloc.num_nodes:
            raise ValueError(f"nodes={n} but allocation {alloc.job_id} has only "
                             f"{alloc.num_nodes} node(s): {', '.join(alloc.nodes)}")
        self.allocation = alloc
        self.job_id = alloc.job_id
        rt = client_runtime()
        token = self.apply_id or os.urandom(16).hex()
        restart = str(slurm_restart_count(os.environ))
        job_dir = os.path.join(self.log_dir, f"alloc-{alloc.job_id}-{token[:12]}")
        self.srun_log = os.path.join(job_dir, "agents.log")
        private_dir(job_dir, top=cache_top(job_dir), what="the job folder")   # log_dir checked too
        self.step_name = f"hpcmesh-agents-{token[:8]}"
        env, extra = clean_env_for_nested_srun(os.environ, self.cpus_per_task)
        env.update({"HPCMESH_SECRET": rt.secret.hex(), "HPCMESH_JOB_TOKEN": token,
                    "HPCMESH_LEASE_GRACE": f"{self.grace:g}", "HPCMESH_MESH_NAME": self.mesh_name,
                    "HPCMESH_JOB_DIR": job_dir})
        env.pop("HPCMESH_SECRET_FILE", None)
        env.pop("HPCMESH_BATCH_JOB", None)
        for k, v in self.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        argv = ["srun", "--overlap", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1",
                *extra, "--kill-on-bad-exit=1", f"--job-name={self.step_name}", *self.srun_args,
                *agent_command(self.python_exe, attach=client_attach_addresses(),
                               grace=self.grace, job_dir=job_dir, mesh=self.mesh_name)]
        self.srun_argv = argv
        waiter = AttachWaiter(agent_token(token, self.mesh_name, restart), n)
        t0 = time.time()
        self.timings = {"launch": t0}
        proc = slurmctl.start_srun(argv, env, self.srun_log)
        self._live_srun = proc
        _register_exit_kill(self)
        progress = Progress(self.progress)
        mono0 = time.monotonic()

        def poll() -> None:
            code = proc.poll()
            if code is not None and waiter.attached < n:
                time.sleep(0.2)
                raise SlurmJobFailed(
                    f"the srun step starting host agents in allocation {alloc.job_id} exited "
                    f"with status {code} after {waiter.attached} of {n} agents attached; "
                    f"srun log: {self.srun_log}\n{log_tail(self.srun_log, 15)}")
            progress.show((waiter.attached,), f"allocation {alloc.job_id}: {waiter.attached}/{n}"
                          f" hosts attached {time.monotonic() - mono0:.1f}s")
        try:
            hosts = waiter.wait(self.timeout, poll=poll, poll_interval=0.1)
        except TimeoutError:
            self._stop_step()
            raise SlurmStartTimeout(
                f"only {waiter.attached} of {n} host agents in allocation {alloc.job_id} "
                f"attached within {self.timeout:.0f} s; the step was stopped; srun log: "
                f"{self.srun_log}\n{log_tail(self.srun_log, 15)}") from None
        except BaseException:
            self._stop_step()
            raise
        finally:
            progress.done()
        self.timings["attached"] = time.time()
        self.timings["launch_to_attached_s"] = self.timings["attached"] - t0
        self._live_hosts = hosts
        self._applied = True

    def _state(self) -> dict[str, Any]:
        hosts = getattr(self, "_live_hosts", None)
        if not hosts:
            raise SlurmError("this SlurmAllocation has no running host agents; call apply()")
        return {self.mesh_name: SlurmHostMesh.from_hosts(hosts, self.mesh_name, job=self)}

    def _is_active(self) -> bool:
        proc = getattr(self, "_live_srun", None)
        return proc is not None and proc.poll() is None

    def _kill(self) -> None:
        self._stop_step()
        self._applied = False
        self._live_hosts = None

    # -- stopping the step ----------------------------------------------------------------
    def _step_ids(self) -> list[str]:
        """Ids (``job.step``) of our agents' step, found by its name."""
        if not self.job_id or not self.step_name:
            return []
        return [sid for sid, name in slurmctl.squeue_steps(self.job_id) if name == self.step_name]

    def _stop_step(self, wait: float = 15.0) -> None:
        """HUP the agents (they exit 0, srun ends); then cancel the step; then kill srun.
        Returns once srun has exited and squeue lists no step of ours."""
        proc = getattr(self, "_live_srun", None)
        if proc is None:
            return
        steps = self._step_ids()
        if proc.poll() is None and steps:
            slurmctl.scancel_once(steps, signal="HUP", timeout=20)
            if _wait_exit(proc, 5.0) is None:
                slurmctl.scancel_once(steps, timeout=20)
        if _wait_exit(proc, wait) is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(5)
        deadline = time.monotonic() + wait
        while self._step_ids():
            if time.monotonic() > deadline:
                raise SlurmError(f"step(s) {', '.join(self._step_ids())} of allocation "
                                 f"{self.job_id} still listed by squeue {wait:.0f} s after "
                                 f"kill()")
            time.sleep(0.1)
        self._live_srun = None

    def __repr__(self) -> str:
        return f"SlurmAllocation({self.mesh_name}, job {self.job_id or '?'})"


def _wait_exit(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


_to_kill: "weakref.WeakSet[SlurmAllocation]" = weakref.WeakSet()
_exit_hook = []


def _register_exit_kill(job: SlurmAllocation) -> None:
    if not _exit_hook:
        atexit.register(_kill_all_at_exit)
        _exit_hook.append(True)
    _to_kill.add(job)


def _kill_all_at_exit() -> None:
    for job in list(_to_kill):
        try:
            if job._is_active():
                job._stop_step(wait=5.0)
        except Exception as e:  # noqa: BLE001 - best effort at exit
            log.warning("could not stop the host agents of %r at exit: %s", job, e)
