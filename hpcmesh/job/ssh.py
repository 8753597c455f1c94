"""``SSHJob`` / ``LoginJob``: host agents started over ssh on explicit hosts.

    job = SSHJob(hosts="node[01-04]", python_exe="/shared/venv/bin/python",
                 ssh_args=["-i", "~/.ssh/id_cluster"])
    hosts = job.state().hosts                 # HostMesh {"hosts": 4}

For each host it runs, without a terminal::

    ssh -o BatchMode=yes [ssh_args] HOST env HPCMESH_JOB_TOKEN=... <python_exe> -P -m hpcmesh \\
        worker --attach <this client's addresses> --secret-stdin --grace G ...

and writes the job secret (hex) to ssh's stdin, so it is never on a command line
(``ps`` on either side shows the token, which only names the job). The agents
dial back to this client and are collected by ``AttachWaiter``. They outlive
the client by ``grace`` seconds (a later client reconnects through the cached
state); ``kill()`` runs ``ssh HOST kill -TERM <agent pid>``.

``port`` is the TCP port the agents listen on (Monarch's ``monarch_port``;
None = any free port); the ssh port goes in ``ssh_port`` or ``ssh_args``.
``transport`` is ``"tcp"`` (the only one that crosses hosts).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from typing import Any, Mapping, Sequence

from ..hosts_file import expand_hosts
from ..private_files.modules import python_module
from ..runtime.client import client_runtime
from ..transport import tls
from .attach import AttachTimeout, AttachWaiter
from .base import JobTrait, open_log
from .submitit_job import describe_agents, host_mesh_of, reconnect_mesh, stop_client_procs

__all__ = ["SSHJob", "LoginJob"]


def _pid_alive(pid: int, must_contain: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return must_contain.encode() in f.read()
    except (OSError, IndexError):
        return False


class SSHJob(JobTrait):
    """Host meshes on explicit hosts reached with ssh.

    ``hosts``: a hostlist string (``"node[1-4]"``) or a list of names and hostlists,
    read as a hosts file's ``hosts:`` (``hosts_file.expand_hosts``), for one mesh
    named ``mesh_name`` (default ``hosts``); or ``meshes={name: hosts}``; or
    ``add_mesh(name, hosts)``. ``python_exe`` must have hpcmesh installed on the
    hosts. ``env``: extra variables for the agents; ``workdir``: where they run
    (their processes' logs go to ``<workdir>/.hpcmesh/logs``; default: the ssh
    login directory).
    """

    kind = "ssh"

    def __init__(self, hosts: Sequence[str] | str | None = None, python_exe: str = "python3",
                 ssh_args: Sequence[str] = (), port: int | None = None, transport: str = "tcp",
                 *, meshes: Mapping[str, Sequence[str] | str] | None = None,
                 mesh_name: str = "hosts", ssh_port: int | None = None,
                 ssh_command: str = "ssh", env: Mapping[str, str] | None = None,
                 workdir: str | None = None, grace: float = 300.0,
                 attach_timeout: float = 120.0, advertise_host: str | None = None):
        super().__init__()
        if transport != "tcp":
            raise ValueError(f"SSHJob transport must be 'tcp' (agents on other hosts are "
                             f"reached over TCP); got {transport!r}")
        if isinstance(ssh_args, str):
            ssh_args = shlex.split(ssh_args)
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                                 or not 0 <= port < 65536):
            raise ValueError(f"port must be a TCP port number or None, got {port!r}")
        self.meshes: dict[str, list[str]] = {}
        if hosts is not None:
            self.add_mesh(mesh_name, hosts)
        for name, hs in (meshes or {}).items():
            self.add_mesh(name, hs)
        self.python_exe = python_exe
        self.ssh_args = [str(a) for a in ssh_args]
        self.port = port
        self.transport = transport
        self.ssh_port = ssh_port
        self.ssh_command = ssh_command
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.workdir = workdir
        self.grace = float(grace)
        self.attach_timeout = float(attach_timeout)
        self.advertise_host = advertise_host
        # filled by apply
        self.agents: dict[str, list[dict]] = {}
        self.ssh_pids: dict[str, list[int]] = {}
        self.secret_hex: str | None = None
        self.log_dir: str | None = None

    def add_mesh(self, name: str, hosts: Sequence[str] | str) -> "SSHJob":
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"mesh name {name!r} must be an identifier (it becomes "
                             f"state.{name})")
        if self._applied:
            raise RuntimeError("add meshes before apply()")
        self.meshes[name] = expand_hosts(hosts, f"mesh {name!r}: hosts")
        return self

    # -- commands -------------------------------------------------------------------------
    def _ssh_base(self, host: str) -> list[str]:
        argv = [self.ssh_command, "-o", "BatchMode=yes"]
        if self.ssh_port is not None:
            argv += ["-p", str(self.ssh_port)]
        return argv + list(self.ssh_args) + [host]

    def remote_command(self, attach: list[str], token: str) -> str:
        """The command line run on each host (shell-quoted; holds no secret)."""
        env = {**self.env, "HPCMESH_JOB_TOKEN": token, "HPCMESH_LEASE_GRACE": str(self.grace)}
        worker = [*python_module("hpcmesh", self.python_exe), "worker", "--secret-stdin",
                  "--attach", ",".join(attach), "--grace", str(self.grace),
                  "--initial-wait", str(self.grace),
                  "--listen", f"tcp://0.0.0.0:{self.port or 0}"]
        if self.advertise_host:
            worker += ["--advertise-host", self.advertise_host]
        tls_settings = tls.settings()      # this client's TLS (HPCMESH_TLS_CA): the same there
        if tls_settings is not None:
            worker += ["--ca", tls_settings.ca]
            env.update(tls_settings.env())   # certificate paths: a shared file system
        cmd = "env " + " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))
        cmd += " " + " ".join(shlex.quote(a) for a in worker)
        if self.workdir:
            cmd = f"cd {shlex.quote(self.workdir)} && exec {cmd}"
        else:
            cmd = f"exec {cmd}"
        return cmd

    # -- JobTrait hooks -----------------------------------------------------------------
    def _spec_key(self) -> Any:
        return (self.kind, tuple((k, tuple(v)) for k, v in self.meshes.items()),
                self.python_exe, tuple(self.ssh_args), self.ssh_port, self.port)

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise NotImplementedError(f"{type(self).__name__} does not run client scripts; "
                                      f"run the client here")
        if not self.meshes:
            raise ValueError(f"{type(self).__name__} has no hosts: pass hosts=, meshes= or "
                             f"call add_mesh(name, hosts)")
        rt = client_runtime()
        tag = (self.apply_id or "x")[:12]
        self.secret_hex = rt.secret.hex()
        self.log_dir = os.path.abspath(os.path.join(".hpcmesh", "logs", f"ssh-{tag}"))
        attach = list(rt.node.addresses)
        self._live_procs: dict[str, list[subprocess.Popen]] = {}
        self.ssh_pids, self.agents = {}, {}
        # one token per host: each agent is matched to the host it was started on
        waiters = {name: [AttachWaiter(f"{tag}-{name}-{i}", 1) for i in range(len(hs))]
                   for name, hs in self.meshes.items()}
        t0 = time.monotonic()
        try:
            for name, hs in self.meshes.items():
                procs = []
                for i, host in enumerate(hs):
                    cmd = self.remote_command(attach, waiters[name][i].job_token)
                    procs.append(self._start_one(name, i, host, cmd))
                self._live_procs[name] = procs
                self.ssh_pids[name] = [p.pid for p in procs]
            meshes = {}
            for name, ws in waiters.items():
                refs = []
                for i, waiter in enumerate(ws):
                    left = max(1.0, self.attach_timeout - (time.monotonic() - t0))
                    try:
                        refs += waiter.wait(left, poll=lambda name=name: self._poll(name))
                    except AttachTimeout as e:
                        host = self.meshes[name][i]
                        raise AttachTimeout(
                            f"{type(self).__name__} mesh {name!r}: the agent on {host} did "
                            f"not attach within {left:.0f} s ({e}); last output: "
                            f"{self._tail(name, i, host)} (logs in {self.log_dir})") from None
                self.agents[name] = describe_agents(refs)
                meshes[name] = host_mesh_of(name, refs)
        except BaseException:
            self._terminate_ssh()
            raise
        self._live_meshes = meshes
        self.attach_seconds = time.monotonic() - t0

    def _start_one(self, name: str, i: int, host: str, cmd: str) -> subprocess.Popen:
        log_path = os.path.join(self.log_dir, f"{name}-{i}-{host}.log")
        with open_log(log_path) as log:
            try:
                p = subprocess.Popen(self._ssh_base(host) + [cmd], stdin=subprocess.PIPE,
                                     stdout=log, stderr=log, start_new_session=True)
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.ssh_command!r} not found; SSHJob needs an ssh "
                                        f"client") from None
        try:
            p.stdin.write((self.secret_hex + "\n").encode())
            p.stdin.close()
        except BrokenPipeError:
            pass
        return p

    def _poll(self, name: str) -> None:
        dead = [(i, p.returncode) for i, p in enumerate(self._live_procs.get(name, []))
                if p.poll() is not None]
        if dead:
            i, code = dead[0]
            host = self.meshes[name][i]
            raise RuntimeError(f"{type(self).__name__} mesh {name!r}: ssh to {host} exited "
                               f"with status {code} before its agent attached: "
                               f"{self._tail(name, i, host)}")

    def _tail(self, name: str, i: int, host: str) -> str:
        try:
            with open(os.path.join(self.log_dir, f"{name}-{i}-{host}.log"), "rb") as f:
                lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines()
                         if ln.strip()]
            return " | ".join(lines[-3:]) or "(no output)"
        except OSError:
            return "(no log)"

    def _state(self) -> dict[str, Any]:
        live = self.__dict__.get("_live_meshes")
        if live is None:
            live = {name: reconnect_mesh(name, self.agents.get(name, []), self.secret_hex,
                                         type(self).__name__) for name in self.meshes}
            self._live_meshes = live
        return dict(live)

    def _is_active(self) -> bool:
        procs = self.__dict__.get("_live_procs")
        if procs is not None:
            return all(p.poll() is None for ps in procs.values() for p in ps)
        pids = [p for ps in self.ssh_pids.values() for p in ps]
        return bool(pids) and all(_pid_alive(p, self.ssh_command) for p in pids)

    def _kill(self) -> None:
        stop_client_procs({a["node_id"] for infos in self.agents.values() for a in infos})
        for name, infos in self.agents.items():
            kills = []
            for i, info in enumerate(infos):
                if info.get("pid"):
                    host = self.meshes[name][i] if i < len(self.meshes[name]) else info["host"]
                    kills.append(subprocess.Popen(
                        self._ssh_base(host) + [f"kill -TERM {int(info['pid'])}"],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL))
            for k in kills:
                try:
                    k.wait(30)
                except subprocess.TimeoutExpired:
                    k.kill()
        self._terminate_ssh(grace=10.0)
        self._applied = False
        self.__dict__.pop("_live_meshes", None)

    def _terminate_ssh(self, grace: float = 0.0) -> None:
        """Wait up to ``grace`` for the ssh sessions to end (their agents exited), then
        terminate what is left."""
        procs = self.__dict__.get("_live_procs")
        pids = [p for ps in self.ssh_pids.values() for p in ps]

        def alive() -> list:
            if procs is not None:
                return [p for ps in procs.values() for p in ps if p.poll() is None]
            return [p for p in pids if _pid_alive(p, self.ssh_command)]
        deadline = time.monotonic() + grace
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in alive():
            try:
                if isinstance(p, int):
                    os.kill(p, signal.SIGTERM)
                else:
                    p.terminate()
            except ProcessLookupError:
                pass
        end = time.monotonic() + 5
        while alive() and time.monotonic() < end:
            time.sleep(0.05)

    # -- reporting ----------------------------------------------------------------------------
    def describe_meshes(self) -> dict[str, str]:
        out = {}
        for name, hs in self.meshes.items():
            out[name] = f"{len(hs)} host(s) over ssh: {', '.join(hs)}"
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(meshes={self.meshes!r}, python_exe={self.python_exe!r})"


class LoginJob(SSHJob):
    """``SSHJob`` under Monarch's other name: explicit hosts reached from a login node."""

    kind = "login"
