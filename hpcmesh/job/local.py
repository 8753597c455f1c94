"""LocalJob (every mesh is this host) and BatchJob (connect from inside the job)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

from .base import BATCH_MARKER, JobTrait, open_log, try_load


class LocalJob(JobTrait):
    """Every mesh is ``this_host()``; a client script runs as a detached local process."""

    kill_ends_processes = False          # kill() ends the client script, not this host

    def __init__(self, hosts: tuple[str, ...] | list[str] = ("hosts",), log_dir: str = ".hpcmesh/logs"):
        super().__init__()
        if isinstance(hosts, str):
            hosts = (hosts,)
        self.hosts = tuple(hosts)
        self.log_dir = log_dir
        self.client_pid: int | None = None
        self.client_log: str | None = None

    def _spec_key(self) -> Any:
        return ("local", self.hosts)

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            self._submit_client(client_script)

    def _submit_client(self, client_script: str) -> None:
        if not os.path.exists(client_script):
            raise FileNotFoundError(f"client script {client_script!r} does not exist")
        self.client_log = os.path.join(self.log_dir, f"client-{self.apply_id}.log")
        state_path = os.path.abspath(os.path.join(self.log_dir, f"job-{self.apply_id}.pkl"))
        self._applied = True
        self.dump(state_path)
        env = dict(os.environ, **{BATCH_MARKER: "1", "HPCMESH_JOB_STATE": state_path})
        with open_log(self.client_log, what="the client's log") as log:
            proc = subprocess.Popen([sys.executable, client_script], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        self.client_pid = proc.pid

    def _state(self) -> dict[str, Any]:
        from ..actor.host_mesh import this_host
        return {name: this_host() for name in self.hosts}

    def _kill(self) -> None:
        if self.client_pid is not None:
            try:
                os.killpg(self.client_pid, 15)
            except ProcessLookupError:
                pass
        self._applied = False

    def _is_active(self) -> bool:
        return True

    def describe_meshes(self) -> dict[str, str]:
        return {name: f"this host ({socket.gethostname()})" for name in self.hosts}

    def wait_client(self, timeout: float | None = None) -> int | None:
        """Wait for a submitted client script to finish; its exit code (None if unknown)."""
        if self.client_pid is None:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                pid, status = os.waitpid(self.client_pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid:
                return os.waitstatus_to_exitcode(status)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"client script (pid {self.client_pid}) still running")
            time.sleep(0.05)


def in_batch_job() -> bool:
    return os.environ.get(BATCH_MARKER) == "1"


class BatchJob(JobTrait):
    """Wraps a job so a client started inside that job's allocation (``HPCMESH_BATCH_JOB=1``)
    connects to it instead of creating a new one."""

    def __init__(self, job: JobTrait):
        super().__init__()
        if not isinstance(job, JobTrait):
            raise TypeError(f"BatchJob wraps a job, got {type(job).__name__}")
        self.job = job

    def _inner(self) -> JobTrait:
        if in_batch_job():
            path = os.environ.get("HPCMESH_JOB_STATE")
            if path:
                running = try_load(path)
                if running is not None:
                    return running
        return self.job

    def apply(self, client_script: str | None = None) -> None:
        if in_batch_job():
            return   # we are the client inside the job: it exists already
        self.job.apply(client_script)
        self.apply_id = self.job.apply_id

    def enable_admin(self, config=None, **kwargs) -> "BatchJob":
        """As ``JobTrait.enable_admin``, for the wrapped job too (its ``state()`` serves it)."""
        super().enable_admin(config, **kwargs)
        self.job.enable_admin(self._admin_config)
        return self

    def enable_telemetry(self, config=None, **kwargs) -> "BatchJob":
        """As ``JobTrait.enable_telemetry``, for the wrapped job too."""
        super().enable_telemetry(config, **kwargs)
        self.job.enable_telemetry(self._telemetry_config)
        return self

    def remote_mount(self, source, mntpoint=None, meshes=None, python_exe=".venv/bin/python",
                     **kwargs) -> "BatchJob":
        """As ``JobTrait.remote_mount``, for the wrapped job too."""
        super().remote_mount(source, mntpoint, meshes, python_exe, **kwargs)
        self.job._remote_mounts = self._remote_mounts
        return self

    def gather_mount(self, remote_mount_point, local_mount_point, meshes=None) -> "BatchJob":
        """As ``JobTrait.gather_mount``, for the wrapped job too."""
        super().gather_mount(remote_mount_point, local_mount_point, meshes)
        self.job._gather_mounts = self._gather_mounts
        return self

    def state(self, cached_path: str | None = None):
        if in_batch_job():
            return self._job_state(self._inner()._state())
        return self.job.state(cached_path) if cached_path else self.job.state()

    def _spec_key(self) -> Any:
        return ("batch", self.job._spec_key())

    def _create(self, client_script):
        self.job._create(client_script)

    def _state(self):
        return self._inner()._state()

    def _kill(self) -> None:
        self._inner().kill()

    def _is_active(self) -> bool:
        return self._inner().active

    @property
    def active(self) -> bool:
        return self._inner().active

    def describe_meshes(self) -> dict[str, str]:
        return self.job.describe_meshes()

    def slurm_job_ids(self) -> list[str]:
        return self.job.slurm_job_ids()
