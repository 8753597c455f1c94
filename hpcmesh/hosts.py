"""``hosts_from_config``: a HostMesh ``{"hosts": N}`` from a hosts file, or from where we run.

* ``$HPCMESH_HOSTS`` (or the ``var`` given, or an explicit path) names a YAML file
  (schema: :mod:`hpcmesh.hosts_file`);
* unset inside a Slurm allocation (salloc, sbatch): adopt it, one host agent per
  node started with ``srun --overlap`` (:class:`~hpcmesh.job.allocation.SlurmAllocation`);
* unset outside any allocation: this host, as a ``{"hosts": 1}`` mesh.

Per scheduler: ``local`` is this host (``processes_per_host`` becomes the default
``per_host={"procs": n}`` of ``spawn_procs``); ``slurm`` adopts the allocation
inside one, else submits the file's ``job:`` spec (:class:`~hpcmesh.job.slurm.SlurmJob`)
and waits for its agents; ``static`` attaches to running agents (``workers:``;
secret from ``$HPCMESH_SECRET``/``$HPCMESH_SECRET_FILE``); ``ssh`` uses
``hpcmesh.job.SSHJob``.

The job behind a mesh (SlurmJob, SlurmAllocation) is ``mesh.job``; ``mesh.job.kill()``
releases it (a SlurmAllocation's step also ends when this process exits).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any

from .hosts_file import HostsConfig, HostsFileError, load_hosts_config

log = logging.getLogger("hpcmesh.hosts")

__all__ = ["hosts_from_config", "local_host_mesh"]


def local_host_mesh(processes_per_host: int | None = None, name: str = "hosts"):
    """This host as a ``{"hosts": 1}`` HostMesh (``this_host()`` has no dimensions)."""
    from .actor.host_mesh import HostRef
    from .job.agent_mesh import AgentHostMesh
    from .runtime.client import client_runtime
    rt = client_runtime()
    ref = HostRef(rt.local_agent(), socket.gethostname())
    per = {"procs": processes_per_host} if processes_per_host else None
    return AgentHostMesh.from_hosts([ref], name, default_per_host=per)


def _apply_network(cfg: HostsConfig) -> None:
    """The file's network choice, for this client (if its runtime has not started yet)
    and for every agent it launches (they inherit the environment)."""
    if not cfg.network_ifname:
        return
    from .runtime import client as client_mod
    current = os.environ.get("HPCMESH_IFNAME")
    if client_mod.existing_client_runtime() is not None and current != cfg.network_ifname:
        log.warning("%s: network ifname %s applies to host agents started from now on; this "
                    "client's runtime already listens on %s", cfg.where("network"),
                    cfg.network_ifname, ", ".join(client_mod.client_runtime().node.addresses))
    os.environ["HPCMESH_IFNAME"] = cfg.network_ifname


def _use_tls(cfg: HostsConfig) -> None:
    """Turn TLS on for this client before anything is launched or attached. The agents
    need the same setting: the ones Slurm starts inherit it from this process's
    environment (``HPCMESH_TLS_CA``, through sbatch/srun), SSHJob passes it on their
    command line, and static workers were started with ``hpcmesh worker --ca``."""
    if not cfg.tls:
        return
    from .actor.host_mesh import use_tls
    from .transport.tls import TRUST_ALL, TLSConfigError
    try:
        use_tls(cfg.tls_ca or TRUST_ALL)
    except TLSConfigError as e:
        key = "transport.ca" if cfg.tls_ca else "transport"
        raise cfg.error(key, f"{key}: {e}", value=cfg.tls_ca) from None


def _looks_like_path(var: str) -> bool:
    return os.sep in var or var.endswith((".yaml", ".yml")) or os.path.isfile(var)


def _in_allocation() -> bool:
    from .job.allocation import current_allocation
    return current_allocation() is not None


def hosts_from_config(var: str = "HPCMESH_HOSTS", path: str | os.PathLike | None = None, *,
                      timeout: float | None = None):
    """A HostMesh ``{"hosts": N}`` for this program (see the module docstring).

    ``var`` is the environment variable naming the hosts file. When no variable of that
    name is set and ``var`` looks like a path (has a ``/``, ends in ``.yaml``/``.yml``, or
    is an existing file), it is the file itself: ``hosts_from_config("configs/slurm.yaml")``.
    ``path`` names the file explicitly. ``timeout`` bounds the wait for host agents.
    """
    if path is None and not os.environ.get(var) and _looks_like_path(var):
        path = var
    cfg = load_hosts_config(path, var=var)
    if cfg is None:
        if _in_allocation():
            return _adopt_allocation([], timeout)
        return local_host_mesh()
    _apply_network(cfg)
    _use_tls(cfg)
    if cfg.scheduler == "local":
        return local_host_mesh(cfg.processes_per_host)
    if cfg.scheduler == "slurm":
        if _in_allocation():
            return _adopt_allocation(cfg.srun_args, timeout)
        return _submit_slurm(cfg, timeout)
    if cfg.scheduler == "static":
        return _attach_static(cfg, timeout)
    if cfg.scheduler == "ssh":
        return _ssh(cfg, timeout)
    raise HostsFileError(f"unknown scheduler {cfg.scheduler!r}", source=cfg.source)  # unreachable


def _adopt_allocation(srun_args, timeout):
    from .job.allocation import SlurmAllocation
    kw = {} if timeout is None else {"timeout": timeout}
    job = SlurmAllocation(srun_args=list(srun_args), **kw)
    return job.host_mesh()


def _submit_slurm(cfg: HostsConfig, timeout):
    from .job.slurm import SlurmJob
    from .slurm.spec import JobSpec, SpecError
    if not cfg.job:
        raise HostsFileError(
            "scheduler slurm outside an allocation needs a 'job:' spec to submit (nodes, "
            "gpus_per_node, time, partition, ...); or run inside salloc/sbatch to adopt the "
            "allocation", source=cfg.source, line=cfg.line_of("scheduler"), key="job")
    job_dict = dict(cfg.job)
    if "python" not in job_dict and "meshes" not in job_dict:
        job_dict["python"] = sys.executable      # like SlurmJob: this client's interpreter
    try:
        spec = JobSpec.from_dict(job_dict, cfg.source, lines=cfg.lines, prefix="job")
    except SpecError as e:       # the hosts file's kind of the same family, every piece kept
        raise e.recast(HostsFileError) from None
    if len(spec.meshes) != 1:
        raise cfg.error("job", f"hosts_from_config returns one mesh; the job spec has "
                        f"{len(spec.meshes)} ({', '.join(spec.meshes)}); use SlurmJob for "
                        f"several meshes")
    kw = {} if timeout is None else {"timeout": timeout}
    job = SlurmJob(spec=spec, **kw)
    state = job.state(cached_path=None)
    return getattr(state, next(iter(spec.meshes)))    # extent {"hosts": N}


def _attach_static(cfg: HostsConfig, timeout):
    from .actor.host_mesh import attach_to_workers
    from .job.agent_mesh import AgentHostMesh
    from .transport.addresses import secret_from_env
    secret = secret_from_env()
    try:
        mesh = attach_to_workers(list(cfg.workers), secret=secret,
                                 timeout=timeout if timeout is not None else 30.0)
    except Exception as e:  # noqa: BLE001 - name the file and the key
        raise ConnectionError(f"{cfg.where('workers')}: cannot attach to the workers "
                              f"{', '.join(cfg.workers)}: {e}") from e
    return AgentHostMesh.from_hosts(mesh.refs, "hosts")


def _ssh(cfg: HostsConfig, timeout):
    from .job.ssh import SSHJob
    kw: dict[str, Any] = {"hosts": list(cfg.hosts)}
    if cfg.python:
        kw["python_exe"] = cfg.python
    if cfg.ssh_args:
        kw["ssh_args"] = list(cfg.ssh_args)
    try:
        job = SSHJob(**kw)
    except TypeError as e:
        raise NotImplementedError(f"{cfg.where('scheduler')}: hpcmesh.job.SSHJob does not take "
                                  f"{sorted(kw)} ({e})") from e
    state = job.state(cached_path=None)
    names = state.names()
    return getattr(state, "hosts" if "hosts" in names else names[0])
