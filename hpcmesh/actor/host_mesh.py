"""HostMesh: the hosts a job runs on, as a mesh; ``spawn_procs`` starts processes on them.

Where hosts come from: ``this_host()``, ``attach_to_workers`` (running ``hpcmesh worker``
agents), or a job (``hpcmesh.job``). ``use_tls`` turns on TLS for what follows.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Awaitable, Callable, Self

from ..runtime.process.bootstrap import BootstrapCommand, default_bootstrap_cmd
from ..runtime.observe import telemetry_recorder as _tel
from ..runtime.client import ProcRecord, client_runtime, existing_client_runtime
from ..runtime.future import Future, completed, failed, gather, on_runtime_thread
from ..runtime.process.gpu_binding import BINDING_VAR, SLOT_VAR, choose_binding
from ..runtime.process.zygote import PRELOAD_VAR, ZYGOTE_IMPORTS_VAR
from ..runtime.observe.introspect import ADMIN_URL_VARS
from ..runtime.node import NodeRef
from ..runtime.observe.spans import start_span
from ..runtime.torchrun_env import MemberPlace, places, torchrun_env
from ..errors import HpcmeshError
from ..progress import Progress
from ..shapes import Extent, MeshTrait, Point, Shape, point_label
from ..transport import tls
from ..transport.addresses import parse_worker_address
from ..transport.handshake import HandshakeBusy, HandshakeError
from .controllers import offer_controllers
from .mesh_view import chain, spawning_actor
from .proc_mesh import ProcMesh, ProcMeshState, run_bootstrap

_mesh_counter = itertools.count()
log = logging.getLogger("hpcmesh.actor")


class HostRef:
    """A host agent: where to send spawn requests for this host."""
    __slots__ = ("agent", "hostname", "secret")

    def __init__(self, agent: NodeRef, hostname: str, secret: bytes | None = None):
        self.agent = agent
        self.hostname = hostname
        self.secret = secret

    def __repr__(self) -> str:
        return f"HostRef({self.hostname})"


class HostMesh(MeshTrait):
    """Hosts that run an hpcmesh host agent."""

    def __init__(self, hosts: list[HostRef], shape: Shape, name: str = "hosts"):
        self._hosts = hosts
        self._shape = shape
        self.name = name
        self._python: str | None = None     # see with_python_executable
        # the processes spawned through this mesh and its views: what its stop() stops
        self._spawned: set[str] = set()
        # a copy that travelled (pickled) is no owner: only the owner shuts the hosts down
        self._owner = True

    def _same_owner(self, mesh: "HostMesh") -> "HostMesh":
        """``mesh`` (a view of this one: a slice, another interpreter) as this mesh's: the
        processes spawned through either are stopped by either's ``stop()``."""
        mesh._spawned = self.__dict__.setdefault("_spawned", set())
        mesh._owner = self.__dict__.get("_owner", False)
        return mesh

    def __getstate__(self):
        """A copy elsewhere spawned nothing and owns nothing (Monarch: only the owner may
        shut a host mesh down)."""
        return {**self.__dict__, "_spawned": set(), "_owner": False}

    @classmethod
    def from_hosts(cls, hosts: Sequence[HostRef], name: str = "hosts", **kw: Any) -> Self:
        """The 1-D mesh ``{"hosts": len(hosts)}`` over ``hosts`` in their order (Monarch's
        one dimension, whatever the mesh is called): how every job kind, attach and mount
        makes one. A subclass gets its own keywords through ``kw``."""
        hosts = list(hosts)
        if not hosts:
            raise ValueError(f"host mesh {name!r} needs at least one host; got none")
        bad = [h for h in hosts if not isinstance(h, HostRef)]
        if bad:
            raise TypeError(f"host mesh {name!r} is made of HostRefs (a mesh's .refs); got "
                            f"{type(bad[0]).__name__} {bad[0]!r}")
        return cls(hosts, Shape.from_extent(Extent({"hosts": len(hosts)})), name, **kw)

    def _new_with_shape(self, shape: Shape) -> "HostMesh":
        mesh = HostMesh(self._hosts, shape, self.name)
        mesh._python = self.__dict__.get("_python")
        return self._same_owner(mesh)

    def with_python_executable(self, path: str) -> "HostMesh":
        """This mesh, but its processes start with the interpreter at ``path`` on each host
        (a venv synced or mounted there) instead of the agent's own. Monarch's name. That
        interpreter must be able to import hpcmesh; a path that is not executable on a host
        fails that spawn with an error naming the host."""
        if not isinstance(path, str) or not path:
            raise TypeError(f"with_python_executable takes the interpreter's path on the hosts "
                            f"as a non-empty string, got {path!r}")
        mesh = self._new_with_shape(self._shape)    # a job's mesh stays one (its .job...)
        mesh._python = path
        return mesh

    def sync_workspace(self, workspace: Any, conda: bool = False,
                       auto_reload: bool = False) -> Future:
        """Copy client directories onto every host of this mesh (Monarch's name): only what
        a host lacks travels, down a chain of hosts. ``workspace``: a directory, a list of
        them (each lands at its own path), a ``{source: destination}`` dict, or an object
        with ``dirs``; ``conda=True`` adds the running environment (``sys.prefix``). Files
        removed on the client are removed on the hosts the next time; files the sync never
        wrote are left alone. Without FUSE this is what ``remote_mount`` falls back to. A
        Future of a ``SyncResult`` (bytes uploaded, files written per host)."""
        from .workspace import in_thread, sync_workspace, workspace_dirs
        if auto_reload:
            raise NotImplementedError(
                "sync_workspace(auto_reload=True) is not supported: hpcmesh does not reload "
                "modules in running actors; start new processes after the sync")
        workspace_dirs(workspace, conda)        # bad input fails here, not on a thread
        return in_thread(sync_workspace, self, workspace, conda)

    @property
    def hostnames(self) -> list[str]:
        return [self._hosts[g].hostname for g in self._shape.ranks()]

    @property
    def refs(self) -> list[HostRef]:
        """The host agents of this view, in its order (to build another HostMesh on them)."""
        return [self._hosts[g] for g in self._shape.ranks()]

    def spawn_procs(self, per_host: dict[str, int] | None = None,
                    bootstrap: Callable[[], None] | Callable[[], Awaitable[None]] | None = None,
                    name: str | None = None, proc_bind: list[dict[str, str]] | None = None,
                    bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] |
                    None = None, *,
                    forward_logs: bool = True, gpu_binding: str | None = None) -> "ProcMesh":
        """Start processes on every host of this mesh; per-host dims are appended.
        Monarch's arguments, in Monarch's order:

        ``bootstrap``: a callable (``def`` or ``async def``, no arguments) run once in each
        new process before any actor is spawned there (``current_rank()`` is the process's
        point); the mesh is ready once it returned everywhere, and fails with its error.
        ``proc_bind``: one dict per process of a host (``len`` = processes per host), the
        host's i-th process getting the i-th: ``cpus`` (``taskset -c``), ``cpunodebind``,
        ``membind``, ``physcpubind`` (``numactl --KEY=VALUE``, which must be installed on
        the hosts), the process started through those tools as Monarch's are.
        ``bootstrap_command``: how each process is started (see ``BootstrapCommand``).

        ``gpu_binding`` (default ``$HPCMESH_GPU_BINDING``, else "host"): "host" gives every
        process its host's GPUs and LOCAL_RANK selects its own, as torchrun does; "process"
        pins each to its GPU (CUDA_VISIBLE_DEVICES=<it>, LOCAL_RANK=0). Either way
        HPCMESH_LOCAL_SLOT is its slot on the host (see ``hpcmesh.runtime.process.gpu_binding``)."""
        self._check_not_shut_down()
        if bootstrap is not None and not callable(bootstrap):
            raise TypeError(f"spawn_procs(bootstrap=...) takes a callable run in each new "
                            f"process before its actors, got {type(bootstrap).__name__}")
        binding = choose_binding(gpu_binding)
        if per_host is not None and not isinstance(per_host, Mapping):
            raise TypeError(f"per_host must be a mapping of dimension names to sizes, like "
                            f"per_host={{'gpus': 8}}; got {type(per_host).__name__} "
                            f"{per_host!r}")
        per_host = dict(per_host or {})
        for k, v in per_host.items():
            if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"per_host must map dimension names to positive ints; got "
                                 f"{k!r}: {v!r}")
            if k in self._shape.extent:
                raise ValueError(f"per_host dimension {k!r} is already a dimension of the host "
                                 f"mesh {dict(self.extent)}; pick another name")
        rt = client_runtime()
        node = rt.node
        offer_controllers(node)
        owner = spawning_actor()
        extent = Extent({**dict(self._shape.extent), **per_host})
        mesh_name = name or f"procs{next(_mesh_counter)}"
        # telemetry's span: from the request until every process has connected
        sp = (start_span("hpcmesh.spawn_procs", mesh=mesh_name, extent=dict(extent),
                         host_mesh=self.name) if _tel.RECORDER is not None else None)
        uid = uuid.uuid4().hex[:8]
        per = Extent(per_host).nelem
        binds = checked_proc_bind(proc_bind, per)
        host_ranks = self._shape.ranks()
        member_places = places([i // per for i in range(extent.nelem)])
        records: list[ProcRecord] = []
        by_host: dict[int, list] = {}
        for i in range(extent.nelem):
            point = Point(i, extent)
            cmd = bootstrap_command(point) if callable(bootstrap_command) and not isinstance(
                bootstrap_command, BootstrapCommand) else bootstrap_command
            if cmd is None:
                cmd = default_bootstrap_cmd(self.__dict__.get("_python"))
            if not isinstance(cmd, BootstrapCommand):
                raise TypeError(f"bootstrap_command must be a BootstrapCommand or a callable "
                                f"returning one; for {point_label(point)} got {type(cmd).__name__}")
            if binds is not None:
                cmd = bound_command(cmd, binds[i % per])
            host = self._hosts[host_ranks[i // per]]
            rec = ProcRecord(f"{mesh_name}-{uid}-{i}", mesh_name, point, host.agent,
                             point_label(point), forward_logs=forward_logs, owner=owner)
            rec.host = host.hostname
            records.append(rec)
            rt.procs[rec.name] = rec
            self.__dict__.setdefault("_spawned", set()).add(rec.name)
            by_host.setdefault(i // per, []).append((rec.name, cmd, point_label(point), i))
        first_agent = self._hosts[host_ranks[0]].agent

        launched = Future()

        def spawn_all(rdv: Future) -> None:
            """Once host 0 named MASTER_ADDR/PORT, ask every host's agent to start its share."""
            master = rdv.value() if rdv.exception() is None else None
            if master is None:
                log.warning("mesh %s: no rendezvous port from host %s (%s); its processes get "
                            "no MASTER_ADDR/MASTER_PORT", mesh_name,
                            self._hosts[host_ranks[0]].hostname, rdv.exception())
            answers = []
            for hi, reqs in by_host.items():
                host = self._hosts[host_ranks[hi]]
                recs = [r for r in records if r.agent == host.agent]
                try:
                    reqs = [(n, c, lbl, _mesh_env(member_places[i], master, binding),
                             forward_logs) for n, c, lbl, i in reqs]
                    f = node.rpc(host.agent, "spawn_procs", reqs, node.ref, rt.events,
                                 rt.secret.hex(), rt.lease_grace, f"{mesh_name}-{uid}")
                except BaseException as e:  # noqa: BLE001 - fail these procs, never hang them
                    f = failed(e)
                f.add_done_callback(lambda fut, recs=recs: on_spawned(fut, recs))
                answers.append(f)
            # stop() waits for this: the agents have answered, whether they started all
            if not answers:
                launched.set_result(None)
            left = itertools.count(len(answers) - 1, -1)
            for a in answers:
                a.add_done_callback(lambda _a: next(left) == 0 and launched.set_result(None))

        def on_spawned(f: Future, recs: list[ProcRecord]) -> None:
            if f.exception() is not None:
                # The agent killed what it had started of these (spawn_procs cleans up
                # after itself): ends hpcmesh caused on purpose, no failures to report.
                # Its answer comes before their exit reports, on the same connection.
                for r in recs:
                    r.stopping = True
                    r.stop_reason = f"its start failed on host {r.host}: {f.exception()}"
                    r.ready.set_exception(f.exception())
                return
            info = {n: (pid, paths) for n, pid, paths in f.value()}
            for r in recs:
                if r.name in info:
                    r.pid, r.log_paths = info[r.name]
        node.rpc(first_agent, "reserve_master_port").add_done_callback(spawn_all)
        ready = gather([r.ready for r in records])
        node.call_soon(show_spawn_progress, node.loop, records, len(host_ranks), ready)
        state = ProcMeshState(mesh_name, records, ready, self, launched)
        if (tel := _tel.RECORDER) is not None:
            tel.mesh(mesh_name, "proc", "ProcMesh", mesh_name, json.dumps(dict(extent)),
                     self.name)
        mesh = ProcMesh(state, Shape.from_extent(extent))
        if bootstrap is not None:
            run_bootstrap(mesh, bootstrap)
        if sp is not None:
            sp.end_after(state.ready)
        return mesh

    @property
    def stream_logs(self) -> bool:
        """Whether the output of the processes spawned here reaches this client (Monarch's
        name): hpcmesh streams it by default (``spawn_procs(forward_logs=)``,
        ``ProcMesh.logging_option``), so True; Monarch 0.7's hosts say False."""
        return True

    @property
    def is_fake_in_process(self) -> bool:
        """Monarch's name for a mesh of hosts simulated inside the client's process:
        hpcmesh's hosts are always real (``this_proc()`` runs actors in this process)."""
        return False

    def _check_not_shut_down(self) -> None:
        if self.__dict__.get("_shut_down"):
            raise RuntimeError("HostMesh has already been shut down")

    async def __aenter__(self) -> Self:
        """``async with hosts:``: the hosts are shut down (``shutdown()``) on leaving the
        block, as in Monarch; using this mesh afterwards raises a RuntimeError."""
        self._check_not_shut_down()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if not self.__dict__.get("_shut_down"):     # nested blocks shut down once
            await self.shutdown()

    @property
    def initialized(self) -> Future:
        """Resolves to True once the hosts are reachable (Monarch's ``initialized``): an
        hpcmesh HostMesh is made of agents it has reached already, so at once."""
        self._check_not_shut_down()
        return completed(True)

    def stop(self) -> Future:
        """Stop the processes spawned through this mesh (any view of it) on these hosts (as
        ``ProcMesh.stop`` does: ``__cleanup__`` runs), not those another HostMesh of the
        same hosts spawned (as in Monarch); the host agents go on, ready for new processes
        or a new controller. A Future of None."""
        return _stop_procs_on({h.agent.node_id for h in self.refs},
                              names=self.__dict__.get("_spawned", set())).then(lambda _: None)

    def shutdown(self) -> Future:
        """``stop()``, then end the host agents themselves: they exit (an agent started by
        ``run_worker_loop_until_shutdown`` returns from it) and take no new controller.
        ``this_host()``'s agent lives in this process: there this is ``stop()``. Only the
        owner may: a copy of the mesh that was pickled (passed to an actor, say) raises a
        RuntimeError, as in Monarch. A Future of None."""
        if not self.__dict__.get("_owner", False):
            raise RuntimeError(
                f"shutdown() of host mesh {self.name!r}: this copy of it was unpickled, and "
                f"only the HostMesh its hosts were given to (its owner) may shut them down")
        rt = client_runtime()
        agents = [h.agent for h in self.refs if h.agent.node_id != rt.node.node_id]
        self._shut_down = True

        return chain(self.stop(), lambda: gather(
            [rt.node.rpc(a, "shutdown_agent") for a in agents])).then(lambda _: None)

    def __repr__(self) -> str:
        return f"HostMesh({dict(self.extent)}, hosts={self.hostnames})"


#: proc_bind's keys (Monarch's): ``cpus`` through ``taskset -c``, the others through numactl.
PROC_BIND_KEYS = ("cpus", "cpunodebind", "membind", "physcpubind")


def checked_proc_bind(proc_bind, per_host: int) -> list[dict[str, str]] | None:
    """``spawn_procs(proc_bind=)`` checked: one dict of str per process of a host."""
    if proc_bind is None:
        return None
    if isinstance(proc_bind, (str, bytes, Mapping)) or not isinstance(proc_bind, Sequence):
        raise TypeError(f"proc_bind is a list of dicts, one per process of a host, like "
                        f"[{{'cpus': '0-7'}}, {{'cpus': '8-15'}}]; got {proc_bind!r}")
    if len(proc_bind) != per_host:
        raise ValueError(f"proc_bind length ({len(proc_bind)}) must equal procs_per_host "
                         f"({per_host})")
    out = []
    for i, bind in enumerate(proc_bind):
        if not isinstance(bind, Mapping):
            raise TypeError(f"proc_bind[{i}] is a dict of {', '.join(PROC_BIND_KEYS)}; got "
                            f"{bind!r}")
        for k, v in bind.items():
            if k not in PROC_BIND_KEYS:
                # Monarch ignores a key it does not know: a typo would bind nothing, silently
                raise ValueError(f"proc_bind[{i}] has key {k!r}; the keys are "
                                 f"{', '.join(PROC_BIND_KEYS)}")
            if not isinstance(v, str) or not v:
                raise ValueError(f"proc_bind[{i}][{k!r}] is a non-empty string such as "
                                 f"'0-3' or '0,2'; got {v!r}")
        out.append(dict(bind))
    return out


def bound_command(cmd: BootstrapCommand, bind: Mapping[str, str]) -> BootstrapCommand:
    """``cmd`` started through ``numactl`` and/or ``taskset`` as ``bind`` says (Monarch's
    way); the same command when ``bind`` is empty."""
    prefix = [f"--{k}={bind[k]}" for k in PROC_BIND_KEYS[1:] if k in bind]
    if prefix:
        prefix.insert(0, "numactl")
    if "cpus" in bind:
        prefix += ["taskset", "-c", bind["cpus"]]
    if not prefix:
        return cmd
    return BootstrapCommand(prefix[0], [*prefix[1:], cmd.program, *cmd.args], cmd.env,
                            cmd.inherit_env)


def _call_on(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:        # the runtime has closed: nobody to tell
        pass


#: A spawn still waiting after this many seconds says how far it is, each second.
SPAWN_PROGRESS_AFTER_S = 2.0


def show_spawn_progress(loop: asyncio.AbstractEventLoop, records: list[ProcRecord], hosts: int,
                        ready: Future, stream=None) -> None:
    """From ``SPAWN_PROGRESS_AFTER_S`` on, until every process of a spawn has connected (or
    the spawn failed): ``spawned 128/256 processes on 32 hosts 3.1s`` on stderr, rewritten
    in place on a terminal, a line per quarter of the way in a log (the queue wait's
    ``Progress``). Runs on the controller's loop: a timer, no thread."""
    start = loop.time()
    shown: list[Progress] = []          # the line, once the wait is long enough for one

    def say() -> None:
        up = sum(1 for r in records if r.ready.done())
        shown[0].show(("spawn", 4 * up // max(1, len(records))),
                      f"spawned {up}/{len(records)} processes on {hosts} host"
                      f"{'s' if hosts != 1 else ''} {loop.time() - start:.1f}s")

    def tick() -> None:
        if ready.done():
            return
        if not shown:
            shown.append(Progress(None, stream))
            ready.add_done_callback(lambda _f: _call_on(loop, finish))
        say()
        loop.call_later(1.0, tick)

    def finish() -> None:               # the last word is how it ended
        say()
        shown[0].done()
    loop.call_later(SPAWN_PROGRESS_AFTER_S, tick)


def _stop_procs_on(agent_ids: set[str], grace: float | None = None,
                   names: set[str] | None = None) -> Future:
    """Stop the live processes this controller started through the agents ``agent_ids``
    (of those, the ones named in ``names`` if given)."""
    rt = client_runtime()
    recs = [r for r in rt.procs.values() if r.agent.node_id in agent_ids and not r.stopping
            and r.failure is None and (names is None or r.name in names)]
    if not recs:
        return completed({})
    mesh = ProcMesh.from_records("host-procs", recs, Extent({"procs": len(recs)}), None)
    return mesh.stop(grace)


_shutdown_claimed = False


def shutdown_context(host_timeout: float | None = None) -> Future:
    """End this process's hpcmesh client (Monarch's ``shutdown_context``): stop the
    processes ``this_host()`` started (``host_timeout`` s of grace, default 10), kill what
    is left, close the client's connections. Processes on other hosts end by their lease.
    Later calls, or a call with no client, return a settled Future at once. A Future of
    None."""
    global _shutdown_claimed
    if host_timeout is not None and (isinstance(host_timeout, bool) or not isinstance(
            host_timeout, (int, float)) or not math.isfinite(host_timeout) or host_timeout < 0):
        raise ValueError(f"shutdown_context(host_timeout={host_timeout!r}): seconds, finite "
                         f"and >= 0, or None for 10")
    rt = existing_client_runtime()
    if rt is None or _shutdown_claimed:
        return completed(None)
    if on_runtime_thread():
        raise RuntimeError("shutdown_context() cannot run on the hpcmesh event-loop thread "
                           "(it waits for that loop to end); call it from the controller's "
                           "own code")
    _shutdown_claimed = True
    grace = 10.0 if host_timeout is None else float(host_timeout)
    try:
        _stop_procs_on({rt.node.node_id}, grace).get(timeout=grace + 20)
    except Exception as e:  # noqa: BLE001 - the shutdown goes on: what is left is killed
        log.warning("shutdown_context: stopping this host's processes: %s", e)
    rt.shutdown()
    return completed(None)


def _mesh_env(place: MemberPlace, master: tuple[str, int] | None,
              binding: str) -> dict[str, str]:
    """torchrun's variables, so a user's own ``init_process_group()`` works, and the GPU
    binding the agent applies; they sit under the bootstrap command's env (which can
    override or remove them)."""
    admin = {var: os.environ[var] for var in (*ADMIN_URL_VARS, _tel.TELEMETRY_VAR, PRELOAD_VAR)
             if var in os.environ}
    # every actor process unpickles its actor with this package: its host's fork server
    # imports it once, before forking them (zygote.py)
    return {**torchrun_env(place, master), SLOT_VAR: str(place.local_rank),
            BINDING_VAR: binding, ZYGOTE_IMPORTS_VAR: __package__,
            **admin}    # admin URL, telemetry, the user's preloads: for other hosts too


def this_host() -> HostMesh:
    """The local host as a HostMesh with no dimensions."""
    rt = client_runtime()
    ref = HostRef(rt.local_agent(), socket.gethostname())
    mesh = HostMesh([ref], Shape.from_extent(Extent({})), "this_host")
    # every this_host() of one client is the same host mesh: one's stop() stops what
    # another spawned, as Monarch's one this_host() does
    owner = _this_hosts.get(rt.node.node_id)
    if owner is None:
        owner = _this_hosts[rt.node.node_id] = mesh
    return owner._same_owner(mesh)


#: the client's node id -> its first this_host(): whose processes every later one shares
_this_hosts: dict[str, HostMesh] = {}


def use_tls(ca) -> None:
    """Encrypt this client's TCP connections from now on (``ca``: a CA bundle path or
    ``"trust_all_connections"``), and have the agents and processes it starts from now
    on do the same (``HPCMESH_TLS_CA`` in the environment they inherit)."""
    settings = tls.settings(ca)
    node = client_runtime().node
    if settings is not None and settings != node.tls:
        node.use_tls(settings)
        os.environ.update(settings.env())


class AttachFailed(HpcmeshError, ConnectionError, RuntimeError):
    """No worker came to an address ``attach_to_workers`` was given (Monarch raises a
    RuntimeError "attach failed: ..."; hpcmesh's attach errors were ConnectionErrors)."""


def attach_to_workers(workers: list[str], *, name: str = "hosts", secret: bytes | None = None,
                      timeout: float = 30.0, ca: Any = None, wait: bool = True) -> HostMesh:
    """Connect to running host agents (``hpcmesh worker --listen ADDR``); a HostMesh over them.

    ``ca``: TLS for TCP connections, as the agents were started with (``--ca``): a CA
    bundle path that certifies the agents, or ``"trust_all_connections"`` (encrypt,
    verify nothing). It applies to this client's connections from now on and to the
    processes it starts. ``ca="trust_all_connections"`` without a ``secret`` attaches to
    workers started the same way without one (Monarch's trust model: the worker accepts
    any client; see ``tls.TRUST_ALL_KEY``).

    A worker that is not listening yet (no socket file, connection refused) is waited for
    until ``timeout``; then an ``AttachFailed`` (a ConnectionError and a RuntimeError,
    "attach failed: ...", as Monarch's ``initialized`` raises). ``wait=False``: fail at once
    instead (a reconnect to agents that were running, trying each of their addresses)."""
    if ca is not None:
        use_tls(ca)
    secret = secret or tls.trust_all_key(ca, None)
    if isinstance(workers, str):
        workers = [workers]
    rt = client_runtime()
    node = rt.node
    hosts = []

    for addr in workers:
        parse_worker_address(addr)   # ValueError naming the URL, the fault and the forms

    async def connect_all():
        async def dial(addr: str):
            # An agent at its cap of connections in their handshake (a flood, many
            # clients at once) turns new ones away: dial() tries again on its BUSY; a reset
            # (it closed us unread) is "busy" too, so try again until the timeout; every
            # other error is final.
            # A worker not listening yet (no socket file, nothing on the port) is waited
            # for the same way: Monarch's attach waits for workers that start later.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            pause = 0.05
            while True:
                left = deadline - loop.time()
                try:
                    return await node.connect(addr, timeout=max(0.1, left), secret=secret)
                except ConnectionResetError:
                    if loop.time() + pause >= deadline:
                        raise
                except (ConnectionRefusedError, FileNotFoundError) as e:
                    if not wait:
                        raise
                    if loop.time() + pause >= deadline:
                        raise AttachFailed(f"attach failed: cannot attach to host agent at "
                                           f"{addr}: no worker listening there within "
                                           f"{timeout:g} s ({os.strerror(e.errno)})") from None
                await asyncio.sleep(pause)
                pause = min(2 * pause, 1.0)

        async def one(addr: str):
            try:
                conn = await dial(addr)
            except AttachFailed:
                raise
            except HandshakeBusy as e:
                raise ConnectionError(f"cannot attach to host agent at {addr}: {e}") from None
            except HandshakeError as e:
                raise ConnectionError(f"cannot attach to host agent at {addr}: {e} (was it "
                                      f"started with this job's secret, or both with "
                                      f"ca='trust_all_connections' and none?)") from None
            except (asyncio.TimeoutError, TimeoutError):
                raise ConnectionError(f"cannot attach to host agent at {addr}: no hpcmesh "
                                      f"handshake within {timeout} s (is an hpcmesh worker "
                                      f"listening there?)") from None
            except OSError as e:
                reason = (os.strerror(e.errno) if isinstance(e.errno, int) and e.errno > 0
                          else e.strerror or str(e))
                raise ConnectionError(f"cannot attach to host agent at {addr}: {reason}") from e
            info = conn.info.get("peer_info", {})
            if info.get("role") != "agent":
                raise ConnectionError(f"{addr} is a {info.get('role')!r} node, not a host agent")
            return HostRef(NodeRef(conn.info["peer_id"], (addr,)), info.get("host", addr), secret)
        return await asyncio.gather(*(one(a) for a in workers))
    return HostMesh.from_hosts(node.run_sync(connect_all(), timeout + 5), name)
