"""ProcessJob: several "hosts" on this machine, each a host agent process of its own.

Monarch's ``ProcessJob({"trainers": 2, "dataloaders": 1})``: for trying multi-host programs
(a host dying, per-host state, one HostMesh per role) without ssh or a scheduler. Each host
is ``hpcmesh worker`` listening on a unix socket of its own in a private directory; the job's
secret reaches it on stdin, never on a command line. The agents outlive a client that dies
for their lease (so a restarted client reconnects through the job cache) and exit after it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any, Mapping

from ..actor.host_mesh import attach_to_workers
from ..private_files.modules import python_module
from ..runtime.client import client_runtime
from .base import JobTrait

#: Seconds an agent waits for a client after the last one went away (its lease).
DEFAULT_GRACE = 30.0
START_TIMEOUT = 60.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:                                   # a zombie child of this process is not alive
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


class ProcessJob(JobTrait):
    """Each host of each mesh is a local ``hpcmesh worker`` process (Monarch's ProcessJob)."""

    def __init__(self, meshes: Mapping[str, int], env: Mapping[str, str] | None = None, *,
                 grace: float = DEFAULT_GRACE):
        super().__init__()
        if not isinstance(meshes, Mapping) or not meshes:
            raise TypeError(f"ProcessJob needs meshes as a mapping of mesh name to number of "
                            f"hosts, like {{'trainers': 2}}; got {meshes!r}")
        for name, count in meshes.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"mesh name {name!r} must be a Python identifier (it becomes "
                                 f"an attribute of job.state())")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"mesh {name!r} needs a positive int number of hosts, got "
                                 f"{count!r}")
        self.meshes = dict(meshes)
        self.env = dict(env or {})
        self.grace = grace
        self.secret_hex: str | None = None
        self.workdir: str | None = None
        self.pids: dict[str, list[int]] = {}
        self.addresses: dict[str, list[str]] = {}

    def _spec_key(self) -> Any:
        return ("process", tuple(self.meshes.items()), tuple(sorted(self.env.items())))

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise NotImplementedError("ProcessJob does not run client scripts; run the client "
                                      "here")
        self.secret_hex = client_runtime().secret.hex()
        self.workdir = tempfile.mkdtemp(prefix="hpcmesh-process-job-")
        self.pids, self.addresses = {}, {}
        started: list[tuple[str, subprocess.Popen, str]] = []
        try:
            for name, count in self.meshes.items():
                for i in range(count):
                    host = f"{name}_{i}"
                    started.append((host, self._start(host), os.path.join(self.workdir,
                                                                            f"{host}.ready")))
                    self.pids.setdefault(name, []).append(started[-1][1].pid)
                    self.addresses.setdefault(name, []).append(
                        f"unix://{os.path.join(self.workdir, host + '.sock')}")
            deadline = time.monotonic() + START_TIMEOUT
            for host, proc, ready in started:
                while not (os.path.exists(ready) and os.path.getsize(ready)):
                    if proc.poll() is not None:
                        raise RuntimeError(f"ProcessJob host {host} exited with status "
                                           f"{proc.returncode} before it listened; see "
                                           f"{self.workdir}/{host}.log")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"ProcessJob host {host} did not listen within "
                                           f"{START_TIMEOUT:g} s; see {self.workdir}/{host}.log")
                    time.sleep(0.02)
        except BaseException:
            self._applied = True
            self._kill()
            raise

    def _start(self, host: str) -> subprocess.Popen:
        sock = os.path.join(self.workdir, f"{host}.sock")
        cmd = [*python_module("hpcmesh"), "worker", "--listen", f"unix://{sock}",
               "--secret-stdin", "--grace", str(self.grace),
               "--ready-file", os.path.join(self.workdir, f"{host}.ready")]
        env = {**os.environ, **self.env}
        with open(os.path.join(self.workdir, f"{host}.log"), "ab") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=log, env=env,
                                    start_new_session=True)
        proc.stdin.write((self.secret_hex + "\n").encode())
        proc.stdin.close()
        return proc

    def _state(self) -> dict[str, Any]:
        secret = bytes.fromhex(self.secret_hex)
        return {name: attach_to_workers(addrs, name=name, secret=secret)
                for name, addrs in self.addresses.items()}

    def _is_active(self) -> bool:
        pids = [p for ps in self.pids.values() for p in ps]
        return bool(pids) and all(_pid_alive(p) for p in pids)

    def _kill(self) -> None:
        """SIGTERM every host agent (it stops its processes), SIGKILL what is left after 10 s."""
        pids = [p for ps in self.pids.values() for p in ps]
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            for pid in pids:
                try:
                    os.killpg(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while any(_pid_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not any(_pid_alive(p) for p in pids):
                break
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self._applied = False

    def describe_meshes(self) -> dict[str, str]:
        return {name: f"{n} local host agent process(es)" for name, n in self.meshes.items()}

    def __repr__(self) -> str:
        return f"ProcessJob({self.meshes!r})"
