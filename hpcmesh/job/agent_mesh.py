"""``AgentHostMesh``: the HostMesh the job layer hands out for hosts whose agents it found
or started (a local host, static workers, a Slurm job's nodes).

Beside a plain HostMesh it knows the job behind it (``mesh.job``, None for local and static
hosts) and two ``spawn_procs`` defaults: ``per_host`` (a hosts file's
``processes_per_host``) and the python each process runs, the host agent's own
(:func:`agent_bootstrap`): on a compute node the controller's interpreter path may not
exist. Nothing here is Slurm's; ``SlurmHostMesh`` is the subclass for a Slurm job's hosts.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..actor.host_mesh import HostMesh, HostRef
from ..runtime.process.bootstrap import BootstrapCommand, agent_python_command
from ..shapes import Shape

def agent_bootstrap(*, python: str | None = None,
                    env: Mapping[str, str | None] | None = None) -> Callable:
    """A ``bootstrap_command`` callable for ``spawn_procs``: each process runs the host
    agent's own python (``$HPCMESH_AGENT_PYTHON``, else ``python``, else the controller's
    interpreter), chosen on the host by a ``/bin/sh`` wrapper. The command still ends in
    ``-m hpcmesh.runtime.proc``, so the agent binds GPUs as ``spawn_procs``' ``gpu_binding``
    says, unless ``env`` sets CUDA_VISIBLE_DEVICES."""
    cmd = agent_python_command(python, env)

    def make(point) -> BootstrapCommand:
        return cmd
    return make


class AgentHostMesh(HostMesh):
    """A HostMesh whose ``spawn_procs`` defaults to ``default_per_host`` and to the host
    agent's python (:func:`agent_bootstrap`; ``with_python_executable``'s where given);
    ``job`` is the job it belongs to."""

    def __init__(self, hosts: list[HostRef], shape: Shape, name: str = "hosts", *,
                 default_per_host: dict | None = None, job: Any = None):
        super().__init__(hosts, shape, name)
        self.default_per_host = dict(default_per_host) if default_per_host else None
        self._job = job

    def _new_with_shape(self, shape: Shape) -> "AgentHostMesh":
        mesh = type(self)(self._hosts, shape, self.name,
                          default_per_host=self.default_per_host, job=self._job)
        mesh._python = self.__dict__.get("_python")
        return mesh

    @property
    def job(self):
        """The job these hosts belong to (None when unknown)."""
        return self._job

    def spawn_procs(self, per_host=None, bootstrap_command=None, name=None, *,
                    forward_logs: bool = True, gpu_binding: str | None = None):
        if per_host is None and self.default_per_host:
            per_host = dict(self.default_per_host)
        if bootstrap_command is None and not self.__dict__.get("_python"):
            bootstrap_command = agent_bootstrap()   # else with_python_executable's python
        return super().spawn_procs(per_host, bootstrap_command, name, forward_logs=forward_logs,
                                   gpu_binding=gpu_binding)

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_job"] = None
        return d

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.extent)}, hosts={self.hostnames})"
