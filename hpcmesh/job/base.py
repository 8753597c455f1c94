"""Jobs: a declarative spec of the host meshes a program needs, plus its live state.

Follows ``monarch.job``: ``apply()`` makes the job exist (no-op if it does),
``state()`` returns its HostMeshes, reusing a cached running job when it can
serve the spec (``can_run``) so a restarted client reconnects instead of
queueing again. The cache lives in ``.hpcmesh/<context>/state.pkl`` with
``.hpcmesh/job_state.pkl`` a symlink to the active context's file.

The cache is a pickle: loading it runs whatever code it names. So it is read and written
only through ``private_files``: the file, the ``.hpcmesh`` folder and the folders between
must be this user's and not writable by others (a ``.hpcmesh`` another user made in a
shared project folder or in /tmp is refused, naming it, its owner and mode).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pickle
import uuid
from abc import ABC, abstractmethod
from typing import Any

import cloudpickle

from ..private_files import (UntrustedPathError, append_file, private_dir, read_file,
                             remove_file, write_file, write_link)
from ..runtime.client import expect_exits

DEFAULT_CACHE = ".hpcmesh/job_state.pkl"
#: what ``enable_*``/``*_mount`` declare on a job: carried to the running job it connects to
COMPONENTS = ("_admin_config", "_telemetry_config", "_remote_mounts", "_gather_mounts")
BATCH_MARKER = "HPCMESH_BATCH_JOB"


class JobState:
    """The HostMeshes of an applied job, one attribute per mesh name, and the URLs of its
    services (Monarch's fields): ``admin_url`` once ``enable_admin()`` was called;
    ``query_engine``, ``query_engine_client``, ``telemetry_url`` (and ``dashboard_url``
    with ``include_dashboard``) once ``enable_telemetry()`` was."""

    def __init__(self, hosts: dict[str, Any], query_engine: Any = None,
                 query_engine_client: Any = None, telemetry_url: str | None = None,
                 dashboard_url: str | None = None, admin_url: str | None = None,
                 mounts: list[Any] | None = None, gathers: list[Any] | None = None):
        self._meshes = dict(hosts)
        #: the live ``remote_mount``s (each has ``refresh()``) and ``gather_mount``s
        self.mounts = list(mounts or [])
        self.gathers = list(gathers or [])
        self.query_engine = query_engine
        self.query_engine_client = query_engine_client
        self.telemetry_url = telemetry_url
        self.dashboard_url = dashboard_url
        self.admin_url = admin_url

    def __getattr__(self, name: str):
        meshes = self.__dict__.get("_meshes", {})
        if name in meshes:
            return meshes[name]
        raise AttributeError(f"this job has no mesh {name!r}; its meshes are: "
                             f"{', '.join(sorted(meshes)) or '(none)'}")

    def __dir__(self):
        return sorted(self._meshes)

    def names(self) -> list[str]:
        return list(self._meshes)

    def __repr__(self) -> str:
        from ..token_http import redacted     # a repr ends up in logs: no token
        extra = "".join(f", {k}={redacted(getattr(self, k))!r}" for k in
                        ("telemetry_url", "dashboard_url", "admin_url") if getattr(self, k))
        return f"JobState({', '.join(f'{k}={v!r}' for k, v in self._meshes.items())}{extra})"


class JobTrait(ABC):
    """Base of every job kind. Subclasses implement ``_create``, ``_state``, ``_kill``,
    ``_is_active`` and ``_spec_key`` (what must match for a cached job to be reused)."""

    #: Does ``kill()`` end the host agents (and so every process on them)? Not for a job
    #: whose hosts outlive it (LocalJob: this host).
    kill_ends_processes = True
    #: The host agents of the meshes ``state()`` last connected to, to tell the runtime at
    #: ``kill()`` that their processes end on purpose (a ``_live`` name: never pickled).
    _live_agent_ids: set[str]
    #: ``_live`` names a job kind keeps for the program across ``state()`` connecting
    #: through the cached job (who watches its events): handed to that job first.
    _live_carried: tuple[str, ...] = ()

    def __init__(self):
        self.apply_id: str | None = None
        self._applied = False

    # -- services of the job ------------------------------------------------------------
    def enable_admin(self, config: Any = None, **kwargs: Any) -> "JobTrait":
        """Serve the admin view (hosts, processes, actors, stacks) from the next ``state()``
        on, and again whenever a client reconnects to this job. Configuration only; returns
        the job, for chaining. ``config``: a ``MeshAdminConfig``, or its fields as keywords
        (``admin_addr="0.0.0.0:0"``)."""
        from ..admin.config import MeshAdminConfig
        from ..token_http import parse_addr
        config = _config_of("enable_admin", MeshAdminConfig, config, kwargs)
        parse_addr(config.admin_addr, "admin_addr")    # a bad address fails here, not at state()
        self._admin_config = config
        return self

    def enable_telemetry(self, config: Any = None, **kwargs: Any) -> "JobTrait":
        """Record what every process of the job does (calls, failures, logs, CPU, memory,
        GPUs) from the next ``state()`` on, and again whenever a client reconnects, which
        finds what was recorded before. Configuration only; returns the job, for chaining.
        ``config``: a ``TelemetryConfig``, or its fields as keywords (``retention_secs``,
        ``include_dashboard``, ``dashboard_port``, ``snapshot_interval_secs``)."""
        from ..telemetry.config import TelemetryConfig
        config = _config_of("enable_telemetry", TelemetryConfig, config, kwargs)
        self._telemetry_config = config.check()     # a bad value fails here, not at state()
        return self

    @property
    def admin_config(self) -> Any:
        """The ``MeshAdminConfig`` the last ``enable_admin()`` set; None if not enabled."""
        return self.__dict__.get("_admin_config")

    @property
    def telemetry_config(self) -> Any:
        """The ``TelemetryConfig`` the last ``enable_telemetry()`` set; None if not enabled."""
        return self.__dict__.get("_telemetry_config")

    # -- code and data to and from the hosts (hpcmesh.mounts) ----------------------------
    def remote_mount(self, source: str, mntpoint: str | None = None, meshes: Any = None,
                     python_exe: str | None = ".venv/bin/python", **kwargs: Any) -> "JobTrait":
        """Mount the client directory ``source`` read-only at ``mntpoint`` (default: the
        same path) on every host of ``meshes`` (default: all), over FUSE, from the next
        ``state()`` on; a later ``state()`` (a reconnect too) ships what changed.
        ``python_exe``, relative to the mount point, is the interpreter those meshes'
        processes start with (None: the agent's own). Configuration only; returns the job.
        Where FUSE is not usable the error says so and names ``sync_workspace``."""
        from ..mounts.remote_mount import RemoteMountSpec
        if kwargs:
            raise TypeError(f"remote_mount got unknown options {', '.join(sorted(kwargs))}; "
                            f"it takes source, mntpoint, meshes, python_exe")
        spec = RemoteMountSpec.make(source, mntpoint, meshes, python_exe)
        others = [m for m in self.__dict__.get("_remote_mounts", [])
                  if m.mntpoint != spec.mntpoint]
        self._remote_mounts = [*others, spec]
        return self

    def gather_mount(self, remote_mount_point: str, local_mount_point: str,
                     meshes: Any = None) -> "JobTrait":
        """Show each host's ``remote_mount_point`` read-only under ``local_mount_point`` on
        the client, one folder per host named by its mesh coordinates (``hosts_0``); a
        ``$SUBDIR`` in ``remote_mount_point`` becomes that same key on each host.
        Configuration only, applied on the next ``state()``; returns the job."""
        from ..mounts.gather import GatherMountSpec
        spec = GatherMountSpec.make(remote_mount_point, local_mount_point, meshes)
        others = [g for g in self.__dict__.get("_gather_mounts", [])
                  if g.local_mount_point != spec.local_mount_point]
        self._gather_mounts = [*others, spec]
        return self

    def _apply_mounts(self, meshes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Make or refresh what ``remote_mount``/``gather_mount`` declared; the meshes (the
        mounted ones start their processes with the mounted python) and JobState fields."""
        specs = self.__dict__.get("_remote_mounts") or []
        gathers = self.__dict__.get("_gather_mounts") or []
        if not specs and not gathers:
            return meshes, {}
        fields: dict[str, Any] = {}
        if specs:
            from ..mounts.remote_mount import apply_mounts
            meshes, fields["mounts"] = apply_mounts(self.apply_id, specs, meshes)
        if gathers:
            from ..mounts.gather import apply_gathers
            fields["gathers"] = apply_gathers(self.apply_id, gathers, meshes)
        return meshes, fields

    def _close_mounts(self, ask_hosts: bool) -> None:
        """End this client's mounts of the job. ``ask_hosts``: unmount on the hosts and stop
        the mount processes; without it (the kill ends them anyway) only this client's own
        side goes, and the agents unmount what their processes mounted when they exit."""
        if self.__dict__.get("_remote_mounts") or self.__dict__.get("_gather_mounts"):
            from ..mounts.gather import close_gathers
            from ..mounts.remote_mount import close_mounts
            close_gathers(self.apply_id, ask_hosts)
            close_mounts(self.apply_id, ask_hosts)

    def _start_services(self, meshes: dict[str, Any] | None = None,
                        cached_path: str | None = None) -> dict[str, Any]:
        """Start what ``enable_admin()``/``enable_telemetry()`` configured; the JobState
        fields they fill. Telemetry is kept beside the job's cache file, for a reconnect."""
        fields: dict[str, Any] = {}
        telemetry = self.__dict__.get("_telemetry_config")
        if telemetry is not None:
            from ..telemetry.server import start_telemetry
            save_to = (os.path.join(os.path.dirname(os.path.realpath(cached_path)),
                                    "telemetry") if cached_path else None)
            fields.update(start_telemetry(telemetry, save_to=save_to, meshes=meshes,
                                          job_status=self._job_status))
        config = self.__dict__.get("_admin_config")
        if config is not None:
            from ..admin.server import start_admin
            fields["admin_url"] = start_admin(config)
        if fields and cached_path:      # for `hpcmesh top` in another terminal
            from ..admin.services import write_services_file
            write_services_file(os.path.dirname(os.path.realpath(cached_path)), fields)
        return fields

    def _job_status(self) -> dict[str, Any]:
        """What the dashboard shows of the job: its kind, and its Slurm jobs' state and
        time left where it has any."""
        doc: dict[str, Any] = {"kind": type(self).__name__}
        ids = self.slurm_job_ids()
        if not ids:
            return doc
        from .slurmctl import squeue_jobs
        recs = squeue_jobs(ids, timeout=10)
        jobs = []
        for jid in ids:
            r = recs.get(jid)
            if r is None:
                jobs.append({"job_id": jid, "state": "unknown (not in squeue)"})
                continue
            used, limit = r.time_used_seconds, r.time_limit_seconds
            jobs.append({"job_id": jid, "state": r.state, "reason": r.reason,
                         "nodes": r.nodes, "time_used": r.time_used,
                         "time_limit": r.time_limit,
                         "time_left_s": None if used is None or limit is None else limit - used})
        doc["slurm_jobs"] = jobs
        return doc

    # -- the public life cycle ----------------------------------------------------------
    def apply(self, client_script: str | None = None) -> None:
        """Create the job if it is not running; always gives it a fresh ``apply_id``."""
        self.apply_id = uuid.uuid4().hex
        if not self.active:
            self._create(client_script)
            self._applied = True
        elif client_script is not None:
            self._submit_client(client_script)

    def state(self, cached_path: str | None = DEFAULT_CACHE) -> JobState:
        """The job's HostMeshes: from the cached running job if it can serve this spec,
        else after killing the stale one and applying this one."""
        job: JobTrait = self
        if cached_path is not None:
            cached = try_load(cached_path)
            if cached is not None and cached is not self:
                if cached.active and cached.can_run(self):
                    job = cached
                else:
                    if cached.active:
                        cached.kill()
                    remove_cache(cached_path)
        if not job.active:
            job.apply()
        for service in COMPONENTS:
            config = self.__dict__.get(service) or job.__dict__.get(service)
            if config is not None:
                setattr(job, service, config)   # dumped below: a reconnect serves it again
        for name in self._live_carried:
            if job is not self and name in self.__dict__:
                job.__dict__[name] = self.__dict__[name]
        meshes = job._state()
        job._live_agent_ids = {ref.agent.node_id for mesh in meshes.values()
                               for ref in getattr(mesh, "refs", ())}
        if cached_path is not None:
            job.dump(cached_path)     # after _state(): what it learned (addresses) is kept
        if job is not self:
            self.__dict__.update({k: v for k, v in job.__dict__.items()})
        return self._job_state(meshes, cached_path)

    def _job_state(self, meshes: dict[str, Any], cached_path: str | None = None) -> JobState:
        """The JobState of connected ``meshes``: with what ``remote_mount``/``gather_mount``
        declared made or refreshed, and the services ``enable_*`` asked for started."""
        meshes, mounted = self._apply_mounts(meshes)
        return JobState(meshes, **mounted, **self._start_services(meshes, cached_path))

    def running_state(self) -> JobState:
        """The JobState of this job as it runs now: its HostMeshes connected to, with no
        apply and no mounts or services set up (``hpcmesh exec`` into the current job)."""
        return JobState(self._state())

    def kill(self) -> None:
        """End the job. What this client started on its hosts ends with it, on purpose: no
        supervision failure (``unhandled_fault_hook``) for those processes."""
        if self.kill_ends_processes:
            expect_exits(self.__dict__.get("_live_agent_ids", set()))
        try:
            # first where the hosts outlive the job (their mounts must go now); else the
            # kill itself takes them, and dead hosts cannot hold it up
            self._close_mounts(ask_hosts=not self.kill_ends_processes)
        finally:
            self._kill()

    @property
    def active(self) -> bool:
        return self._applied and self._is_active()

    def can_run(self, spec: "JobTrait") -> bool:
        """Can this (running) job serve ``spec``? Same kind and same spec key."""
        return type(spec) is type(self) and spec._spec_key() == self._spec_key()

    # -- persistence -----------------------------------------------------------------
    def dumps(self) -> bytes:
        return cloudpickle.dumps(self)

    def dump(self, path: str) -> None:
        """Write atomically with mode 0600, following a symlink at ``path`` when it is this
        user's and leads into a folder of this user, making missing folders (0700). A
        folder or link somebody else owns or can write raises ``UntrustedPathError``."""
        write_file(path, self.dumps(), top=cache_top(path), what="the job cache")

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_live")}

    # -- description, without connecting to anything (``hpcmesh status``) ---------------
    def describe_meshes(self) -> dict[str, str]:
        """Mesh name -> a one-line description; {} when the kind has nothing to say before
        it connects. Kinds override it: the CLI must not guess from attribute names."""
        return {}

    def slurm_job_ids(self) -> list[str]:
        """The Slurm jobs this job runs in (for squeue); [] for kinds without Slurm."""
        return []

    # -- subclass hooks -------------------------------------------------------------
    @abstractmethod
    def _create(self, client_script: str | None) -> None: ...

    @abstractmethod
    def _state(self) -> dict[str, Any]: ...

    @abstractmethod
    def _kill(self) -> None: ...

    @abstractmethod
    def _is_active(self) -> bool: ...

    @abstractmethod
    def _spec_key(self) -> Any: ...

    def _submit_client(self, client_script: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot submit a client script into "
                                  f"an already running job")


def _config_of(method: str, cls: type, config: Any, kwargs: dict) -> Any:
    """What an ``enable_*`` method was given: ``config``, an instance of the dataclass
    ``cls``, or one made of its fields as ``kwargs``; not both, nothing else."""
    if config is not None and kwargs:
        raise TypeError(f"{method} takes a {cls.__name__} or its fields as keywords, not "
                        f"both (got config and {', '.join(sorted(kwargs))})")
    if config is None:
        try:
            config = cls(**kwargs)
        except TypeError:
            fields = ", ".join(f.name for f in dataclasses.fields(cls))
            raise TypeError(f"{method} got unknown options {', '.join(sorted(kwargs))}; "
                            f"{cls.__name__} has {fields}") from None
    if not isinstance(config, cls):
        raise TypeError(f"{method}'s config must be a {cls.__name__}, got "
                        f"{type(config).__name__}")
    return config


def job_loads(data: bytes) -> JobTrait:
    job = pickle.loads(data)
    if not isinstance(job, JobTrait):
        raise TypeError(f"the data holds a {type(job).__name__}, not an hpcmesh job")
    return job


def job_load(path: str) -> JobTrait:
    """The job cached at ``path``; ``UntrustedPathError`` (before anything is unpickled)
    when the file or a folder on its way is not this user's, or others can write it."""
    return job_loads(read_file(path, top=cache_top(path), what="the job cache"))


def try_load(path: str) -> JobTrait | None:
    """The job cached at ``path``, or None if there is none or it cannot be read (a stale
    cache must not block a new job: it is logged and ignored). One another user could
    have planted raises: overwriting it would not make its folder safe."""
    try:
        return job_load(path)
    except FileNotFoundError:
        return None
    except UntrustedPathError:
        raise
    except Exception as e:  # noqa: BLE001 - see the docstring
        import logging
        logging.getLogger("hpcmesh.job").warning("ignoring unreadable job cache %s: %s", path, e)
        return None


def remove_cache(path: str) -> None:
    """Remove the state file (the one our symlink at ``path`` points to); keep the link."""
    remove_file(path, top=cache_top(path), what="the job cache")


# -- contexts: which cached job is "current" -------------------------------------------------
def state_root() -> str:
    """The folder of the contexts: ``$HPCMESH_STATE_DIR``, default ``.hpcmesh``."""
    return os.environ.get("HPCMESH_STATE_DIR", ".hpcmesh")


def cache_top(path: str) -> str:
    """Where the folders of ``path`` that must be this user's start: the state folder
    (``.hpcmesh``) for a path inside it, else the file's own folder. The folders above are
    the user's choice (a shared project, /tmp): only what hpcmesh keeps there is checked."""
    root, path = os.path.abspath(state_root()), os.path.abspath(path)
    return root if path.startswith(root + os.sep) else os.path.dirname(path)


def open_log(path: str, what: str = "the log file"):
    """``path`` opened to append a job's log to (binary, unbuffered), in folders checked as
    the cache's are (from :func:`cache_top`) and made if missing; a symlink at ``path`` is
    refused, never followed (``private_files.append_file``)."""
    return append_file(path, top=cache_top(path), what=what, mode=0o644)


def current_context() -> str:
    return os.environ.get("HPCMESH_CONTEXT", "default")


def context_state_path(context: str | None = None) -> str:
    return os.path.join(state_root(), context or current_context(), "state.pkl")


def activate_context(context: str | None = None) -> str:
    """Point ``.hpcmesh/job_state.pkl`` at the context's state file; returns the link path."""
    target = context_state_path(context)
    private_dir(os.path.dirname(target), top=state_root(), private=False,
                what="the context folder")
    link = os.path.join(state_root(), "job_state.pkl")
    write_link(link, os.path.relpath(target, os.path.dirname(link)), top=state_root(),
               what="the context link")
    return link


def _current_job_path(context: str | None) -> str:
    return os.path.join(state_root(), context or current_context(), "current_job")


def set_current_job(spec_ref: str, context: str | None = None) -> None:
    """Remember ``module.attr`` as the job spec of this context."""
    _resolve(spec_ref)   # fail now, not later, if it does not resolve
    write_file(_current_job_path(context), (spec_ref + "\n").encode(), top=state_root(),
               what="the current job file")
    activate_context(context)


def current_job_ref(context: str | None = None) -> str | None:
    """The ``module.attr`` set by ``set_current_job`` for the context, or None."""
    try:   # it names a module to import: read only when nobody else could have written it
        text = read_file(_current_job_path(context), top=state_root(),
                         what="the current job file")
    except FileNotFoundError:
        return None
    return text.decode().strip() or None


def load_current_job(context: str | None = None) -> JobTrait:
    ref = current_job_ref(context)
    if ref is None:
        raise LookupError(f"no current job in context {context or current_context()!r}; run "
                          f"`hpcmesh apply module.attr` first")
    return _resolve(ref)


def _resolve(spec_ref: str) -> JobTrait:
    mod_name, _, attr = spec_ref.rpartition(".")
    if not mod_name or not attr:
        raise ValueError(f"job spec reference must look like 'module.attr', got {spec_ref!r}")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ImportError(f"cannot import module {mod_name!r} for job spec {spec_ref!r}: {e}") from e
    try:
        job = getattr(mod, attr)
    except AttributeError:
        raise AttributeError(f"module {mod_name!r} has no attribute {attr!r} (job spec "
                             f"{spec_ref!r})") from None
    if callable(job) and not isinstance(job, JobTrait):
        job = job()
    if not isinstance(job, JobTrait):
        raise TypeError(f"{spec_ref} is a {type(job).__name__}, not an hpcmesh job")
    return job
