"""``SubmititJob``: host agents started through submitit's executors.

    job = SubmititJob(meshes={"workers": 2}, folder="/shared/me/submitit", cluster="slurm",
                      slurm_partition="debug", timeout_min=60)
    workers = job.state().workers          # a HostMesh {"hosts": 2}, once both attached

One submitit submission per mesh; each task runs a host agent in-process
(:func:`hpcmesh.runtime.process.agent_main.run_agent`, what ``hpcmesh worker`` runs) that
dials this client's addresses, with the job's token in ``HPCMESH_JOB_TOKEN`` and
the secret in a mode-0600 file in the job folder (``HPCMESH_SECRET_FILE``), so the
secret is never on a command line or in submitit's pickles. ``AttachWaiter``
collects the agents as they dial in.

The folder holds the secret, the logs and submitit's pickles (which the tasks and this
client load): it is made 0700 and must be this user's, as must the folders above it up
to ``.hpcmesh`` when it is inside it (checked as the job cache's are, ``private_files``).

Clusters:

* ``"slurm"`` — one task per node (``nodes=n, tasks_per_node=1``); pass Slurm
  options as submitit does (``slurm_partition="debug"``, ``gpus_per_node=8``,
  ``slurm_additional_parameters={...}``). The folder must be on a filesystem
  the nodes share (submitit needs that anyway).
* ``"local"`` — no Slurm: submitit's local executor runs the tasks as local
  processes; it supports one node only, so the mesh's n "hosts" are n agent
  processes on this machine (``tasks_per_node=n``).
* ``"debug"`` — submitit runs the task function in this process. An agent
  cannot live in the controller's process (the runtime keeps one current node
  per process, and signal handling needs the main thread), so here the task
  function starts the n agents as child processes (``python -P -m hpcmesh worker``)
  and returns; this still exercises the submission path in-process.
* ``None`` — what ``submitit.AutoExecutor`` detects (slurm if ``srun`` exists).

Agents outlive the client that applied the job by ``grace`` seconds (default
300), so a later client (``hpcmesh exec``, a restarted script) reconnects to
them from the cached state; ``kill()`` cancels the submission.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence

from ..actor.host_mesh import HostMesh
from ..private_files.modules import python_module
from ..runtime.process.agent_main import configure_logging, exit_status, run_agent
from ..runtime.client import client_runtime
from .attach import AttachTimeout, AttachWaiter
from .base import JobTrait, cache_top, open_log
from .slurmctl import SlurmError, scancel_once, squeue_jobs
from .start_limits import StartLimits, check_start_limits

__all__ = ["SubmititJob"]

CLUSTERS = (None, "local", "debug", "slurm")

# Popen objects of agents started in debug mode, by pid (debug runs in this process).
_DEBUG_AGENTS: dict[int, subprocess.Popen] = {}


# ---------------------------------------------------------------------------------------
# what runs in the submitit task
# ---------------------------------------------------------------------------------------
def _worker_argv(attach: list[str], grace: float, initial_wait: float | None,
                 listen: str | None, advertise_host: str | None) -> list[str]:
    argv = ["worker", "--attach", ",".join(attach), "--grace", str(grace)]
    if initial_wait is not None:
        argv += ["--initial-wait", str(initial_wait)]
    if listen:
        argv += ["--listen", listen]
    if advertise_host:
        argv += ["--advertise-host", advertise_host]
    return argv


def agent_task(attach: list[str], secret_file: str, token: str, grace: float,
               initial_wait: float | None = None, listen: str | None = None,
               advertise_host: str | None = None,
               restore_env: Mapping[str, str | None] | None = None) -> int:
    """The submitit task: a host agent in this process (what ``hpcmesh worker --attach``
    runs); its exit status. ``restore_env`` undoes what the executor set (None = unset)."""
    for k, v in (restore_env or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    os.environ["HPCMESH_JOB_TOKEN"] = token
    os.environ["HPCMESH_SECRET_FILE"] = secret_file
    os.environ.pop("HPCMESH_SECRET", None)
    configure_logging()
    reason = run_agent(listen or "tcp://0.0.0.0:0", attach, grace=grace,
                       initial_wait=initial_wait, advertise_host=advertise_host)
    return exit_status(reason)


def debug_start_agents(n: int, attach: list[str], secret_file: str, token: str, grace: float,
                       initial_wait: float | None, log_dir: str) -> dict:
    """The debug-mode task (runs in the controller's process): start n agents as child
    processes. Never raises: submitit's debug job would open pdb on an exception."""
    try:
        pids = []
        env = dict(os.environ, HPCMESH_JOB_TOKEN=token, HPCMESH_SECRET_FILE=secret_file)
        env.pop("HPCMESH_SECRET", None)
        for i in range(n):
            with open_log(os.path.join(log_dir, f"agent-{token}-{i}.log")) as log:
                p = subprocess.Popen([*python_module("hpcmesh"),
                                      *_worker_argv(attach, grace, initial_wait, None, None)],
                                     env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     start_new_session=True)
            _DEBUG_AGENTS[p.pid] = p
            pids.append(p.pid)
        return {"pids": pids}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


# ---------------------------------------------------------------------------------------
# small process helpers
# ---------------------------------------------------------------------------------------
def _pid_alive(pid: int, must_contain: str | None = None) -> bool:
    """Alive and not a zombie (and, if given, ``must_contain`` is in its command line)."""
    child = _DEBUG_AGENTS.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)   # our zombie child: reap it
            except ChildProcessError:
                pass
            return False
        if must_contain is not None:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if must_contain.encode() not in f.read():
                    return False
        return True
    except (OSError, IndexError):
        return False


def _controller_process(job) -> subprocess.Popen | None:
    """The process that runs a job of submitit's local cluster (None: no such job): its
    Job has no public handle on it, and this is the one place hpcmesh reads the private
    one."""
    return getattr(job, "_process", None)


def _wait_gone(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not check():
            return True
        time.sleep(0.05)
    return not check()


class _StdioToFile:
    """Point fds 1 and 2 at a log file while submitit starts a local controller: it
    inherits them, and a controller holding the caller's stdout pipe would keep e.g.
    ``subprocess.run(["hpcmesh", "apply", ...], capture_output=True)`` from returning."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        with open_log(self.path, what="the local controller's log") as log:
            self.saved = [os.dup(1), os.dup(2)]
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        return self

    def __exit__(self, *exc):
        for target, saved in zip((1, 2), self.saved):
            os.dup2(saved, target)
            os.close(saved)


# ---------------------------------------------------------------------------------------
# the job
# ---------------------------------------------------------------------------------------
class SubmititJob(JobTrait):
    """Host meshes from submitit (``cluster="slurm"``, ``"local"``, ``"debug"`` or None).

    ``meshes`` maps mesh name to node count. Other keyword arguments go to
    ``executor.update_parameters`` (``timeout_min``: the job's time limit, default 60 here
    (submitit's own defaults, 5 and 2 minutes, are too short for a mesh), ``slurm_partition``,
    ``gpus_per_node``, ``cpus_per_task``, ``mem_gb``, ``slurm_setup``, ...);
    ``nodes``/``tasks_per_node`` are set by the job. ``grace``: how long agents wait
    for a client after the last one left. ``attach_timeout``: how long ``apply`` waits
    for every agent once the job runs; the queue wait before has no limit unless
    ``job_start_timeout`` (seconds from submission, pending time included) sets one, as in
    :class:`SlurmJob`. ``listen``/``advertise_host``: passed to
    ``hpcmesh worker`` on the nodes (default: all interfaces / the chosen one).
    ``attach_addresses``: the client addresses the agents dial, in order (default: all of
    this client's, Unix socket first).
    """

    def __init__(self, meshes: Mapping[str, int] | None = None, folder: str = ".hpcmesh/submitit",
                 cluster: str | None = None, *, grace: float = 300.0,
                 attach_timeout: float = 600.0, job_start_timeout: float | None = None,
                 listen: str | None = None,
                 advertise_host: str | None = None, progress: bool = True,
                 attach_addresses: Sequence[str] | None = None, **executor_params: Any):
        super().__init__()
        meshes = {"workers": 1} if meshes is None else dict(meshes)
        if not meshes:
            raise ValueError("SubmititJob needs at least one mesh, e.g. meshes={'workers': 2}")
        for name, n in meshes.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"mesh name {name!r} must be an identifier (it becomes "
                                 f"state.{name})")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"mesh {name!r}: node count must be a positive int, got {n!r}")
        if cluster not in CLUSTERS:
            raise ValueError(f"cluster must be one of {', '.join(map(repr, CLUSTERS))}; "
                             f"got {cluster!r}")
        for key in ("nodes", "tasks_per_node"):
            if key in executor_params:
                raise ValueError(f"SubmititJob sets {key} itself (one agent per node); give "
                                 f"node counts in meshes=")
        self.meshes = meshes
        self.folder = os.path.abspath(os.fspath(folder))
        self.cluster = cluster
        self.grace = float(grace)
        self.attach_timeout, self.job_start_timeout = check_start_limits(
            "SubmititJob", "attach_timeout", attach_timeout, job_start_timeout)
        self.listen = listen
        self.advertise_host = advertise_host
        self.progress = progress
        self.attach_addresses = list(attach_addresses) if attach_addresses else None
        self.executor_params = dict(executor_params)
        # filled by apply
        self.resolved_cluster: str | None = None
        self.job_ids: dict[str, str] = {}
        self.agents: dict[str, list[dict]] = {}     # mesh -> [{host, addresses, pid, node_id}]
        self.secret_hex: str | None = None
        self.secret_file: str | None = None

    # -- JobTrait hooks -------------------------------------------------------------------
    def _spec_key(self) -> Any:
        return ("submitit", tuple(self.meshes.items()), self.folder, self.cluster,
                tuple(sorted((k, repr(v)) for k, v in self.executor_params.items())))

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise NotImplementedError("SubmititJob does not submit client scripts; run the "
                                      "client where it can reach the nodes (the login node)")
        import submitit
        from ..transport.addresses import write_secret

        rt = client_runtime()
        cluster = self.cluster or submitit.AutoExecutor.which()
        if cluster not in ("local", "debug", "slurm"):
            raise ValueError(f"submitit picked executor {cluster!r}; SubmititJob supports "
                             f"local, debug and slurm")
        self.resolved_cluster = cluster
        tag = (self.apply_id or "x")[:12]
        self.secret_hex = rt.secret.hex()
        # makes the folder 0700, or refuses it (and the way to it) unless this user's alone
        secret_file = os.path.join(self.folder, f"secret-{tag}")
        self.secret_file = write_secret(secret_file, rt.secret, top=cache_top(secret_file))
        attach = self.attach_addresses or list(rt.node.addresses)
        self.job_ids, self.agents = {}, {}
        self._live_jobs: dict[str, Any] = {}
        waiters = {name: AttachWaiter(f"{tag}-{name}", n) for name, n in self.meshes.items()}
        t0 = time.monotonic()
        # one job per mesh, so each has its own bring-up clock (submitted together)
        limits = {name: StartLimits(self.attach_timeout, self.job_start_timeout, t0)
                  for name in self.meshes}
        if cluster != "slurm":
            for lim in limits.values():
                lim.mark_running(t0)       # no queue: the agents start at once
        try:
            for name, n in self.meshes.items():
                self._submit(submitit, cluster, name, n, waiters[name].job_token, attach)
            hosts = {}
            for name, waiter in waiters.items():
                # no deadline of its own: _poll raises once a limit in `limits` has passed
                hosts[name] = waiter.wait(
                    math.inf, poll=lambda name=name, w=waiter: self._poll(name, w, limits[name]))
        except BaseException as exc:
            self._cancel_all(wait=False)
            self._drop_secret()
            if isinstance(exc, KeyboardInterrupt) and self.job_ids:
                print(f"\nhpcmesh: interrupted; asked {self.resolved_cluster} to cancel job "
                      f"{', '.join(self.job_ids.values())}", file=sys.stderr, flush=True)
            raise
        self._live_meshes = {name: self._host_mesh(name, refs) for name, refs in hosts.items()}
        self.attach_seconds = time.monotonic() - t0

    def _submit(self, submitit, cluster: str, name: str, n: int, token: str,
                attach: list[str]) -> None:
        folder = os.path.join(self.folder, "%j")
        ex = submitit.AutoExecutor(folder=folder, cluster=cluster)
        params = dict(self.executor_params)
        params.setdefault("timeout_min", 60)   # submitit: 5 (slurm) or 2 (local)
        params.setdefault("name", f"hpcmesh-{name}")
        if cluster == "slurm":
            params.update(nodes=n, tasks_per_node=1)
        elif cluster == "local":
            params.update(nodes=1, tasks_per_node=n)
        try:
            ex.update_parameters(**params)
        except (NameError, ValueError, AssertionError) as e:
            raise ValueError(f"SubmititJob: submitit rejected the executor parameters: "
                             f"{str(e).splitlines()[0]}") from None
        if cluster == "debug":
            job = ex.submit(debug_start_agents, n, attach, self.secret_file, token, self.grace,
                            self.grace, os.path.join(self.folder, "debug-logs"))
            out = job.result()     # runs in this process, right now
            if "error" in out:
                raise RuntimeError(f"SubmititJob (debug): starting the agents failed: "
                                   f"{out['error']}")
            self.job_ids[name] = job.job_id
            self.agent_pids_debug = {**getattr(self, "agent_pids_debug", {}),
                                     name: out["pids"]}
        else:
            restore = None
            if cluster == "local" and "gpus_per_node" not in self.executor_params:
                # submitit's local executor sets CUDA_VISIBLE_DEVICES="" (no GPU asked for),
                # which would hide every GPU from the mesh's processes; keep the caller's view
                restore = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
            args = (agent_task, attach, self.secret_file, token, self.grace, self.grace,
                    self.listen, self.advertise_host, restore)
            if cluster == "local":
                with _StdioToFile(os.path.join(self.folder, "local-controller.log")):
                    job = ex.submit(*args)
            else:
                job = ex.submit(*args)
            self.job_ids[name] = str(job.job_id)
        self._live_jobs[name] = job
        if self.progress:
            print(f"hpcmesh: SubmititJob mesh {name!r}: submitted {cluster} job "
                  f"{self.job_ids[name]} ({n} agent(s))", file=sys.stderr, flush=True)

    def _poll(self, name: str, waiter: AttachWaiter, limits: StartLimits) -> None:
        """Between attach waits: fail early if the submission is gone or a start limit has
        passed; show Slurm progress."""
        now = time.monotonic()
        if waiter.attached:
            limits.mark_running(now)
        which = limits.expired(now)
        if which is not None:
            raise AttachTimeout(
                f"SubmititJob mesh {name!r} ({self.resolved_cluster}): {waiter.attached} of "
                f"{waiter.expected} host agents attached {limits.describe(which)}; "
                f"{self._where_logs(name)}")
        cluster = self.resolved_cluster
        if cluster == "slurm":
            next_squeue = self.__dict__.setdefault("_live_next_squeue", {})
            if now < next_squeue.get(name, 0.0):
                return          # squeue every 2 s at most (slurmctld serves everyone)
            next_squeue[name] = now + 2.0
            rec = self._squeue().get(self.job_ids[name])
            state = rec.state if rec is not None else None
            if state == "RUNNING":
                limits.mark_running(now)
            last = getattr(self, "_live_last_state", {}).get(name)
            if self.progress and rec is not None and (state, rec.reason) != last:
                self.__dict__.setdefault("_live_last_state", {})[name] = (state, rec.reason)
                reason = (f" ({rec.reason})" if state == "PENDING" and rec.reason
                          and rec.reason != "None" else "")
                print(f"hpcmesh: slurm job {self.job_ids[name]} ({name}): {state}{reason}",
                      file=sys.stderr, flush=True)
            if rec is not None and rec.is_terminal:
                raise RuntimeError(f"SubmititJob mesh {name!r}: slurm job {self.job_ids[name]} "
                                   f"ended ({state}) before every agent attached; "
                                   f"{self._where_logs(name)}")
        elif cluster == "local":
            if not self._local_alive(name):
                raise RuntimeError(f"SubmititJob mesh {name!r}: the local submitit job "
                                   f"{self.job_ids[name]} ended before every agent attached; "
                                   f"{self._where_logs(name)}")
        elif cluster == "debug":
            pids = getattr(self, "agent_pids_debug", {}).get(name, [])
            if pids and not any(_pid_alive(p) for p in pids):
                raise RuntimeError(f"SubmititJob mesh {name!r}: the debug agents exited before "
                                   f"attaching; {self._where_logs(name)}")

    def _where_logs(self, name: str) -> str:
        if self.resolved_cluster == "debug":
            return f"see {os.path.join(self.folder, 'debug-logs')}"
        jid = self.job_ids.get(name, "?")
        tail = ""
        job = getattr(self, "_live_jobs", {}).get(name)
        if job is not None:
            try:
                err = job.stderr() or ""
                lines = [ln for ln in err.splitlines() if ln.strip()][-3:]
                if lines:
                    tail = "; last stderr lines: " + " | ".join(lines)
            except Exception:  # noqa: BLE001
                pass
        return f"logs in {os.path.join(self.folder, jid)}{tail}"

    def _host_mesh(self, name: str, refs: list):
        """HostMesh over attached agents; records where a later client can reach them."""
        self.agents[name] = describe_agents(refs)
        return HostMesh.from_hosts(refs, name)

    def _state(self) -> dict[str, Any]:
        live = self.__dict__.get("_live_meshes")
        if live is not None:
            return dict(live)
        self._live_meshes = {name: self._reconnect(name) for name in self.meshes}
        return dict(self._live_meshes)

    def _reconnect(self, name: str):
        return reconnect_mesh(name, self.agents.get(name, []), self.secret_hex,
                              type(self).__name__)

    def _is_active(self) -> bool:
        if not self.job_ids:
            return False
        cluster = self.resolved_cluster
        if cluster == "slurm":
            recs = self._squeue()
            return all(recs.get(j) is not None and recs[j].is_live
                       for j in self.job_ids.values())
        if cluster == "local":
            return all(self._local_alive(n) for n in self.job_ids)
        if cluster == "debug":
            return any(_pid_alive(p) for pids in getattr(self, "agent_pids_debug", {}).values()
                       for p in pids)
        return False

    def _kill(self) -> None:
        self._stop_client_procs()
        self._cancel_all(wait=True)
        self._drop_secret()
        self._applied = False
        self.__dict__.pop("_live_meshes", None)

    # -- helpers ----------------------------------------------------------------------------
    def slurm_job_ids(self) -> list[str]:
        return list(self.job_ids.values()) if self.resolved_cluster == "slurm" else []

    def describe_meshes(self) -> dict[str, str]:
        out = {}
        for name, n in self.meshes.items():
            hosts = [a["host"] for a in self.agents.get(name, [])]
            jid = self.job_ids.get(name)
            where = f", {self.resolved_cluster or self.cluster} job {jid}" if jid else ""
            out[name] = f"{n} host(s){where}" + (f": {', '.join(hosts)}" if hosts else "")
        return out

    def _squeue(self) -> dict:
        """squeue records of the submitted jobs; {} when squeue cannot say (callers poll)."""
        if not self.job_ids:
            return {}
        try:
            return squeue_jobs(list(self.job_ids.values()), timeout=30)
        except SlurmError:
            return {}

    def _local_alive(self, name: str) -> bool:
        proc = _controller_process(getattr(self, "_live_jobs", {}).get(name))
        if proc is not None:
            return proc.poll() is None
        jid = self.job_ids.get(name)
        return bool(jid) and _pid_alive(int(jid), "submitit")

    def _stop_client_procs(self) -> None:
        stop_client_procs({a["node_id"] for infos in self.agents.values() for a in infos})

    def _cancel_all(self, wait: bool) -> None:
        cluster = self.resolved_cluster
        ids = list(self.job_ids.values())
        if not ids:
            return
        if cluster == "slurm":
            live = lambda: any(r.is_active for r in self._squeue().values())  # noqa: E731
            if wait:
                # First SIGTERM the steps only: the agents stop their processes and exit, the
                # submitit tasks return and the job completes at once (a plain scancel also
                # works, but the job then sits in COMPLETING for seconds). Then scancel.
                scancel_once(ids, signal="TERM")
                if _wait_gone(live, 5.0):
                    return
            scancel_once(ids)
            if wait:
                _wait_gone(live, 60)
        elif cluster == "local":
            for name, jid in self.job_ids.items():
                job = getattr(self, "_live_jobs", {}).get(name)
                if _controller_process(job) is not None:
                    job.cancel()          # SIGINT to submitit's controller
                elif _pid_alive(int(jid), "submitit"):
                    os.kill(int(jid), signal.SIGINT)
            if wait:
                _wait_gone(lambda: any(self._local_alive(n) for n in self.job_ids), 15)
        elif cluster == "debug":
            pids = [p for ps in getattr(self, "agent_pids_debug", {}).values() for p in ps]
            for p in pids:
                if _pid_alive(p):
                    try:
                        os.kill(p, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            if wait and not _wait_gone(lambda: any(_pid_alive(p) for p in pids), 10):
                for p in pids:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                _wait_gone(lambda: any(_pid_alive(p) for p in pids), 5)

    def _drop_secret(self) -> None:
        if self.secret_file:
            try:
                os.unlink(self.secret_file)
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return (f"SubmititJob(meshes={self.meshes!r}, cluster={self.cluster!r}, "
                f"folder={self.folder!r})")




def _dialable(addresses, host: str) -> list[str]:
    """An agent listening on ``tcp://0.0.0.0:P`` is reachable at ``tcp://<host>:P``."""
    out = []
    for a in addresses:
        if a.startswith("tcp://0.0.0.0:") or a.startswith("tcp://[::]:"):
            port = a.rsplit(":", 1)[1]
            out.append(f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}")
        elif a.startswith("tcp://"):
            out.append(a)
    return out


# ---------------------------------------------------------------------------------------
# shared with SSHJob: recording attached agents, reconnecting, stopping our processes
# ---------------------------------------------------------------------------------------
def describe_agents(refs: list, pids: Mapping[str, int] | None = None) -> list[dict]:
    """What a later client needs to reach each agent: host, node id, dialable addresses
    (``0.0.0.0`` replaced by the agent's advertise host), pid."""
    node = client_runtime().node
    calls = [node.rpc(ref.agent, "host_info") for ref in refs]
    out = []
    for ref, call in zip(refs, calls):
        adv = None
        try:
            info = call.get(timeout=30)
            adv = info.get("advertise_host")
            pid = info.get("pid")
        except Exception:  # noqa: BLE001 - fall back to the hostname
            pid = None
        out.append({"host": ref.hostname, "node_id": ref.agent.node_id,
                    "pid": (pids or {}).get(ref.agent.node_id, pid),
                    "addresses": _dialable(ref.agent.addresses, adv or ref.hostname)})
    return out


def reconnect_mesh(name: str, agents: list[dict], secret_hex: str | None, kind: str):
    """From a fresh process: dial the recorded agents with the job's secret."""
    from ..actor.host_mesh import attach_to_workers
    secret = bytes.fromhex(secret_hex) if secret_hex else None
    refs = []
    for info in agents:
        errors = []
        for addr in info["addresses"]:
            try:
                hm = attach_to_workers([addr], secret=secret, timeout=15, wait=False)
                refs.append(hm.refs[0])
                break
            except Exception as e:  # noqa: BLE001
                errors.append(f"{addr}: {e}")
        else:
            raise ConnectionError(f"{kind} mesh {name!r}: cannot reach the agent on "
                                  f"{info['host']} (it exits once no client has been "
                                  f"connected for its grace period): "
                                  f"{'; '.join(errors) or 'no address recorded'}")
    return HostMesh.from_hosts(refs, name)


def stop_client_procs(agent_ids: set) -> None:
    """Stop the processes this client started on these agents, quietly (no supervision
    errors for processes killed on purpose)."""
    rt = client_runtime()
    by_agent: dict[str, tuple] = {}
    for rec in list(rt.procs.values()):
        if rec.agent.node_id in agent_ids and rec.failure is None and not rec.stopping:
            rec.stopping = True
            by_agent.setdefault(rec.agent.node_id, (rec.agent, []))[1].append(rec.name)
    futs = [rt.node.rpc(agent, "stop_procs", names, 0.0) for agent, names in by_agent.values()]
    for f in futs:
        try:
            f.get(timeout=10)
        except Exception:  # noqa: BLE001 - the agent may be gone already
            pass
