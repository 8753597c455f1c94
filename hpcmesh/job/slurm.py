"""SlurmJob: submit host agents with sbatch from a login node, and connect to them.

How it works (``apply()``):

1. A job folder ``<log_dir>/<job_name>-<apply id>/`` (0700, this user's) gets the job
   secret (``secret``, hex, mode 0600), the rendered sbatch script (``job.sbatch``,
   rendered by :mod:`hpcmesh.slurm.render` from a :class:`~hpcmesh.slurm.spec.JobSpec`)
   and, later, one ready file per host agent and any time-limit notice.
2. ``sbatch --parsable`` submits it. Each mesh is one ``srun`` step that starts
   one host agent per node (``ntasks_per_node`` per node if asked); the agents
   listen on the node's chosen interface (``hpcmesh.transport.netif``) and dial
   back to this client, saying hello with the job token.
3. While the job is pending, ``squeue`` (text format, never JSON) shows
   progress (state, reason, Slurm's expected start); a job that ends before every
   agent attached fails at once with its id, state, reason and log. Waiting in the
   queue is never a failure unless ``job_start_timeout`` says so; bring-up after
   RUNNING has its own ``timeout``, and passing either cancels the job.

The agents hold a lease: once no controller has been connected for ``grace``
seconds they exit, the steps end, the batch script ends and the job
completes, so a crashed client leaves no allocation behind. A new client
process within the grace period reconnects (``state()`` loads the cached job
and dials the recorded agent addresses with the job secret).

Time limits and preemption: the script asks ``--signal=B:USR1@90`` (spec key
``signal``); the batch shell traps it and forwards it to every ``srun``, which
passes it to the host agents. An agent does not die from it: it appends a line
to ``<job dir>/notice`` (path also in ``$HPCMESH_SLURM_NOTICE`` for its
processes). Actors call :func:`slurm_notice` (e.g. between training steps),
the controller calls ``job.notices()`` or ``job.watch_notices(callback)``, and
can then tell actors to checkpoint through an endpoint. ``requeue: true`` makes
the job requeue-able; after a requeue the agents come back (restart count in
their token) and ``job.state()`` connects to the new ones.

Lost hosts: ``spare_nodes=k`` keeps k more nodes in the allocation; ``job.state()`` after
a host was lost replaces it with one (:mod:`.slurm_spares`). Lost nodes are kept in
``job.bad_nodes`` and excluded from the job's next submission and requeue.

Job events (SPEC §12): the job's agents are registered with the runtime
(``watch_job_ends``), so an end of one of them or of a process on one is first
explained here from Slurm's view (``_explain_end``: squeue's state and reason,
scontrol's restart count). If the job itself moved (requeued, preempted, timed
out, cancelled, ended), every process of the run ends with it, no MeshFailure:
calls on the old meshes raise SupervisionError(reason=ENDED_BY_SLURM) saying
what to do, and one :class:`~hpcmesh.job.events.JobEvent` goes to
``job.watch_events`` callbacks, the log and telemetry.
"""

from __future__ import annotations

import contextvars
import dataclasses
import glob
import json
import logging
import math
import os
import sys
import threading
import time
import uuid
from typing import Any, Callable, Mapping, Sequence

from ..actor.host_mesh import HostRef, attach_to_workers
from ..log_tail import log_tail
from ..private_files import make_dirs, write_file
from ..settings import env_number
from ..slurm.parsing import (JobRecord, SlurmParseError, parse_sbatch_parsable, slurm_job_id,
                             slurm_restart_count)
from ..slurm.render import render_sbatch
from ..slurm.spec import JobSpec
from .agent_mesh import AgentHostMesh, agent_bootstrap
from .base import COMPONENTS, DEFAULT_CACHE, JobState, JobTrait, cache_top, try_load
from .events import (REQUEUED, RUNNING_AGAIN, JobEvent, JobEvents, classify, runs_again,
                     slurm_end_line)
from .local import in_batch_job
from ..progress import Progress
# agent_main and slurm_notice also by their names here from before slurm_agent.py: launch
# scripts users wrote run `from hpcmesh.job.slurm import agent_main` (sbatch/workers.sh did)
from .slurm_agent import (agent_command, agent_main, agent_token, read_notices, ready_name,
                          slurm_notice)
from .slurm_spares import (HOST_LOST_BOUND_S, LOST_PROBE_S, SlurmHostsLost, SpareLaunch,
                           on_bad_node, replace_lost, watch_removed_nodes)
from . import slurmctl
from .slurmctl import SlurmError, scancel, squeue_expected_starts, squeue_jobs
from .start_limits import StartLimits, check_start_limits

log = logging.getLogger("hpcmesh.job.slurm")

__all__ = [
    "SlurmJob", "SlurmError", "SlurmSubmitError", "SlurmJobFailed", "SlurmStartTimeout",
    "SlurmHostMesh", "slurm_bootstrap", "slurm_notice", "agent_main", "agent_command",
    "SlurmHostsLost", "HOST_LOST_BOUND_S",
]

#: How long a job that ended before its agents attached may stay COMPLETING before the
#: error names that state instead of the final one.
COMPLETING_WAIT = 5.0
#: How long a job that ended under a client (a job event) may stay COMPLETING before the
#: event is told as "ended" instead of waiting for Slurm's final word (cancelled, ...).
EVENT_FINAL_WAIT = 30.0


class SlurmSubmitError(SlurmError):
    """sbatch refused the job (nothing was queued)."""


class SlurmJobFailed(SlurmError):
    """The job ended before every host agent attached."""


class SlurmStartTimeout(SlurmError, TimeoutError):
    """The host agents did not attach in time (the job was cancelled)."""


# ---------------------------------------------------------------------------------------
# processes on Slurm hosts: the node's python (the agent binds the step's GPUs)
# ---------------------------------------------------------------------------------------
class SlurmHostMesh(AgentHostMesh):
    """A Slurm job's hosts (SlurmJob, SlurmAllocation): processes run the agents' python by
    default; ``mesh.job`` is the job."""


#: The name ``hpcmesh.job`` has always exported for :func:`~.agent_mesh.agent_bootstrap`.
slurm_bootstrap = agent_bootstrap


_exit_hup: set = set()

#: What the running ``SlurmJob.state()`` call asked (fewer_hosts) and the hosts its caller
#: holds, for ``_connect`` on the job it loads from the cache (a copy without them).
_CONNECTING: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "hpcmesh_slurm_connecting", default=None)

#: Job token -> this process's watch of that job's nodes (jobs with spares): the hosts it
#: watches, the nodes it found taken out of the job, and the Event that stops it.
_NODE_WATCH: dict[str, dict] = {}


def _stop_agents_at_exit(job_ids: Sequence[str]) -> None:
    """The client inside the job's allocation: when it exits, stop the job's agents at once
    (``scancel --signal=HUP``, the steps only), so the steps end with the client instead
    of at Slurm's teardown of the job."""
    import atexit
    ids = [j for j in job_ids if j not in _exit_hup]
    if not ids:
        return
    _exit_hup.update(ids)

    def stop() -> None:
        try:
            slurmctl.scancel_once(ids, signal="HUP", timeout=10)
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
    atexit.register(stop)


def attach_hosts(addresses: Sequence[Sequence[str]], secret: bytes | None,
                 timeout: float = 10.0) -> list[HostRef]:
    """Connect to running agents, one address list per agent (tried in order)."""
    return [attach_host(addrs, secret, timeout) for addrs in addresses]


def attach_host(addrs: Sequence[str], secret: bytes | None, timeout: float = 10.0) -> HostRef:
    """Connect to one running agent at the first of ``addrs`` that answers."""
    errors = []
    for a in addrs:
        try:
            return attach_to_workers([a], secret=secret, timeout=timeout,
                                     wait=False).refs[0]
        except Exception as e:  # noqa: BLE001 - try the agent's next address
            errors.append(f"{a}: {e or type(e).__name__}")
    raise ConnectionError(f"cannot reach host agent at {', '.join(addrs)}: "
                          f"{'; '.join(errors)}")


def client_attach_addresses() -> list[str]:
    """This client's addresses that another host can dial (no unix sockets)."""
    from ..runtime.client import client_runtime
    addrs = [a for a in client_runtime().node.addresses if a.startswith("tcp://")]
    if not addrs:
        raise SlurmError("this client listens on no TCP address, so host agents on other nodes "
                         "cannot reach it; check HPCMESH_IFNAME / the hosts config network")
    return addrs


# ---------------------------------------------------------------------------------------
# SlurmJob
# ---------------------------------------------------------------------------------------
class SlurmJob(JobTrait):
    """Host meshes from Slurm, submitted with sbatch (Monarch's ``SlurmJob`` signature).

    ``meshes`` maps mesh names to a node count, a dict of mesh keys (see
    :mod:`hpcmesh.slurm.spec`: ``nodes``, ``gpus_per_node``, ``cpus_per_task``, ``setup``,
    ``env``, ...) or a :class:`MeshSpec`. The other keywords are defaults for every mesh.
    Alternatively pass ``spec=`` (a :class:`JobSpec`, e.g. from ``load_job_spec``).
    Several meshes share one allocation (node ranges in Slurm's node order) unless
    ``same_allocation=False``, which submits one job per mesh.

    Differences from Monarch: ``python_exe`` defaults to this interpreter (right when
    login and compute nodes share the software tree); ``grace`` is the agents' lease
    (seconds without a controller before they exit, default ``$HPCMESH_LEASE_GRACE`` or
    60).

    Waiting: the queue wait has no limit unless ``job_start_timeout`` (seconds from
    submission to every agent attached) sets one, as in Monarch; ``timeout`` (default
    300 s) bounds the bring-up once the job is RUNNING. Either passing cancels the job
    and raises :class:`SlurmStartTimeout`; so does Ctrl-C (KeyboardInterrupt), which says
    which job it cancelled.

    Lost hosts: ``spare_nodes=k`` asks Slurm for k more nodes, kept idle, and for
    ``--no-kill``. A host that stops answering (its agent killed, its node down or cut
    off) is a ``MeshFailure`` with reason ``HOST_LOST`` within ``HOST_LOST_BOUND_S``; the
    next ``state()`` gives meshes of the same extent with a spare in its place (the other
    hosts and their processes untouched). ``bad_nodes`` lists the nodes lost, kept with
    the job's state and excluded when it is submitted again or requeued
    (:meth:`requeue`). Without a spare left, ``state()`` raises
    :class:`~.slurm_spares.SlurmHostsLost` saying how many hosts are left;
    ``state(fewer_hosts=True)`` goes on with them.
    """

    #: Nodes this job lost (Slurm node names), never given to it again; a tuple until the
    #: first is recorded (jobs pickled before it existed read it too).
    bad_nodes: Sequence[str] = ()
    #: Each mesh's agents' hostnames, in rank order, as last connected.
    agent_hostnames: Mapping[str, list[str]] = {}

    def __init__(self, meshes: Mapping[str, Any] | None = None, python_exe: str | None = None,
                 slurm_args: Sequence[str] = (), job_name: str = "monarch_job",
                 ntasks_per_node: int = 1, time_limit: str | int | None = None,
                 partition: str | None = None, log_dir: str | None = None,
                 exclusive: bool = True, gpus_per_node: int | None = None,
                 cpus_per_task: int | None = None, mem: str | None = None,
                 account: str | None = None, qos: str | None = None, *,
                 constraint: str | None = None, setup: Sequence[str] = (),
                 env: Mapping[str, str | None] | None = None, signal: str | None = "USR1@90",
                 requeue: bool = False, grace: float | None = None, timeout: float = 300.0,
                 same_allocation: bool = True, spec: JobSpec | None = None,
                 progress: bool | None = None, monarch_port: int | None = None,
                 job_start_timeout: float | None = None, spare_nodes: int = 0):
        super().__init__()
        del monarch_port  # Monarch's fixed worker port: hpcmesh ports are ephemeral
        if spec is None:
            if not meshes:
                raise ValueError("SlurmJob needs meshes={name: nodes} (or spec=JobSpec)")
            if isinstance(slurm_args, str):
                slurm_args = [slurm_args]
            defaults: dict[str, Any] = {
                "python": python_exe or sys.executable, "ntasks_per_node": ntasks_per_node,
                "exclusive": exclusive, "sbatch_extra": list(slurm_args), "signal": signal,
                "requeue": requeue}
            for key, value in (("time", time_limit), ("partition", partition),
                               ("gpus_per_node", gpus_per_node),
                               ("cpus_per_task", cpus_per_task), ("mem", mem),
                               ("account", account), ("qos", qos), ("constraint", constraint)):
                if value is not None:
                    defaults[key] = value
            if setup:
                defaults["setup"] = [setup] if isinstance(setup, str) else list(setup)
            if env:
                defaults["env"] = dict(env)
            data = {"job_name": job_name, "meshes": dict(meshes), "defaults": defaults,
                    "same_allocation": same_allocation, "spare_nodes": spare_nodes,
                    "log_dir": os.path.abspath(log_dir or ".hpcmesh/logs")}
            spec = JobSpec.from_dict(data, "SlurmJob(...)")
        elif not isinstance(spec, JobSpec):
            raise TypeError(f"spec must be a hpcmesh.slurm.JobSpec, got {type(spec).__name__}")
        else:
            if not os.path.isabs(spec.log_dir):
                spec = dataclasses.replace(spec, log_dir=os.path.abspath(spec.log_dir))
            if spare_nodes:
                spec = dataclasses.replace(spec, spare_nodes=spare_nodes)   # checked there
        self.spec = spec
        self.grace = float(grace) if grace is not None else env_number("HPCMESH_LEASE_GRACE", 60, finite=True)
        self.timeout, self.job_start_timeout = check_start_limits(
            "SlurmJob", "timeout", timeout, job_start_timeout)
        self.progress = progress
        # filled by apply()
        self.job_ids: list[str] = []
        self.job_dir: str | None = None
        self.secret_hex: str | None = None
        self.token: str | None = None
        self.agent_addresses: dict[str, list[list[str]]] = {}
        self.restart_count = 0
        self.client_script: str | None = None
        self.timings: dict[str, float] = {}

    # -- description ----------------------------------------------------------------
    @property
    def mesh_names(self) -> list[str]:
        return list(self.spec.meshes)

    @property
    def job_id(self) -> str | None:
        """The (first) Slurm job id; inside the job's own allocation, SLURM_JOB_ID."""
        ids = self._ids()
        return ids[0] if ids else None

    def describe_meshes(self) -> dict[str, str]:
        return {name: f"{m.nodes} node(s)" for name, m in self.spec.meshes.items()}

    def slurm_job_ids(self) -> list[str]:
        return [j for j in self.job_ids if j]

    def _ids(self) -> list[str]:
        if self.job_ids:
            return list(self.job_ids)
        job_id = slurm_job_id(os.environ) if in_batch_job() else None
        if job_id is not None:
            return [job_id]
        return []

    def log_paths(self) -> list[str]:
        """stdout logs of the job(s) (``<log_dir>/<job name>-<id>.out``)."""
        out = []
        groups = self.spec.allocation_groups()
        for gi, jid in enumerate(self._ids()):
            name = self.spec.job_name if len(groups) == 1 else \
                f"{self.spec.job_name}-{groups[gi][0]}"
            out.append(os.path.join(self.spec.log_dir, f"{name}-{jid}.out"))
        return out

    def _err_path(self, job_id: str) -> str | None:
        """The stderr log of job ``job_id`` (where slurmstepd says why Slurm ended a run)."""
        for jid, out in zip(self._ids(), self.log_paths()):
            if jid == job_id:
                return out[:-4] + ".err"
        return None

    def _log_hint(self, index: int = 0) -> str:
        paths = self.log_paths()
        if index < len(paths):
            out = paths[index]
            return f"{out} (stderr: {out[:-4]}.err)"
        return self.spec.log_dir

    def _spec_key(self) -> Any:
        return json.dumps(self.spec.to_dict(), sort_keys=True, default=str)

    def _expected(self, mesh: str) -> int:
        m = self.spec.meshes[mesh]
        return m.nodes * m.ntasks_per_node

    # -- creation -------------------------------------------------------------------
    def _create(self, client_script: str | None) -> None:
        from ..runtime.client import client_runtime
        from ..transport.addresses import write_secret
        slurmctl.need("sbatch")
        slurmctl.need("squeue")
        if client_script is not None and not os.path.exists(client_script):
            raise FileNotFoundError(f"client script {client_script!r} does not exist")
        rt = client_runtime()
        self.job_ids = []
        self.agent_addresses = {}
        self.restart_count = 0
        self.timings = {}
        self.client_script = os.path.abspath(client_script) if client_script else None
        self.token = self.apply_id or uuid.uuid4().hex
        make_dirs(self.spec.log_dir)     # Slurm writes the job's --output there
        self.job_dir = os.path.join(self.spec.log_dir, f"{self.spec.job_name}-{self.token[:12]}")
        # the job folder (0700, this user's, checked as the cache's folders are) holds the
        # secret and the batch script: nobody else can have put a file or a link there
        secret_path = os.path.join(self.job_dir, "secret")
        # checked from the log folder itself when it is not under .hpcmesh: a job folder in a
        # folder others can write could be swapped for theirs while the job is pending
        top = cache_top(self.job_dir)
        write_secret(secret_path, rt.secret, top=top)
        self.secret_hex = rt.secret.hex()
        attach = [] if client_script else client_attach_addresses()
        initial_wait = self.timeout if client_script else None
        worker = agent_command("{python}", attach=attach, grace=self.grace,
                               initial_wait=initial_wait, job_dir=self.job_dir, mesh="{mesh}")
        state_file = os.path.join(self.job_dir, "job_state.pkl")
        env = self._agent_env()
        if client_script:
            env["HPCMESH_JOB_STATE"] = state_file
        # time-stamp the start of the batch script (for submit->RUNNING timings)
        stamp = ('date +%s.%N > "$HPCMESH_JOB_DIR/batch-started-r${SLURM_RESTART_COUNT:-0}" '
                 '2>/dev/null || true')
        groups = self.spec.allocation_groups()
        scripts = []
        for gi, group in enumerate(groups):
            first = self.spec.meshes[group[0]]
            meshes = dict(self.spec.meshes)
            meshes[group[0]] = dataclasses.replace(first, setup=[stamp, *first.setup])
            spec = dataclasses.replace(self.spec, meshes=meshes)
            client_cmd = None
            if client_script and gi == 0:
                client_cmd = [first.python, self.client_script]
            text = render_sbatch(spec, worker, env, meshes=group if len(groups) > 1 else None,
                                 client_command=client_cmd, exclude=self.bad_nodes)
            path = os.path.join(self.job_dir, f"job{'' if len(groups) == 1 else '-' + group[0]}"
                                f".sbatch")
            write_file(path, text.encode(), top=top, what="the batch script")
            scripts.append(path)
        self._applied = True
        if client_script:
            self.dump(state_file)

        waiters = {}
        hello_times: list[float] = []
        if not client_script:
            from .attach import AttachWaiter
            waiters = {m: AttachWaiter(agent_token(self.token, m, 0), self._expected(m))
                       for m in self.mesh_names}

            def on_hello(node, ref, info, conn):
                tok = info.get("job_token") or ""
                if info.get("role") == "agent" and tok.startswith(self.token + "/"):
                    hello_times.append(time.time())
            rt.node.on_peer_hello.append(on_hello)
        try:
            self.timings["submit"] = time.time()
            for path in scripts:
                self.job_ids.append(self._submit(path))
            if client_script:
                self.dump(state_file)
                print(f"hpcmesh: submitted job {', '.join(self.job_ids)} with client "
                      f"{client_script}; its output goes to {self._log_hint()}",
                      file=sys.stderr)
                return
            self._wait_for_agents(waiters, hello_times)
        except BaseException as exc:
            if self.job_ids:
                try:
                    scancel(self.job_ids, wait=30)
                    if isinstance(exc, KeyboardInterrupt):
                        # Ctrl-C asks nothing: the user wants out, and a job left in the queue
                        # would later hold nodes for an agent lease with nobody to serve
                        print(f"\nhpcmesh: interrupted; cancelled Slurm job "
                              f"{', '.join(self.job_ids)}", file=sys.stderr, flush=True)
                except SlurmError as e:
                    log.warning("could not cancel job(s) %s: %s", self.job_ids, e)
            for w in waiters.values():
                w.stop()
            self._applied = False
            raise
        finally:
            if not client_script:
                try:
                    rt.node.on_peer_hello.remove(on_hello)
                except ValueError:
                    pass

    def _agent_env(self) -> dict[str, str]:
        """What every agent of the job finds in its environment (the batch script's
        exports; a spare's srun gives the same)."""
        return {"HPCMESH_SECRET_FILE": os.path.join(self.job_dir, "secret"),
                "HPCMESH_JOB_TOKEN": self.token, "HPCMESH_LEASE_GRACE": f"{self.grace:g}",
                "HPCMESH_JOB_DIR": self.job_dir}

    def _submit(self, script: str) -> str:
        proc = slurmctl.run(["sbatch", "--parsable", script])
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
            raise SlurmSubmitError(f"sbatch refused job {self.spec.job_name!r}: {msg} "
                                   f"(script: {script}; nothing was queued)")
        try:
            job_id, _cluster = parse_sbatch_parsable(proc.stdout)
        except SlurmParseError as e:
            raise SlurmSubmitError(str(e)) from None
        log.info("submitted %s as Slurm job %s", script, job_id)
        return job_id

    def _wait_for_agents(self, waiters: dict, hello_times: list[float]) -> None:
        total = sum(w.expected for w in waiters.values())
        progress = Progress(self.progress)
        t_submit = self.timings["submit"]
        mono0 = time.monotonic()
        limits = StartLimits(self.timeout, getattr(self, "job_start_timeout", None), mono0)
        ids = list(self.job_ids)
        state = {"records": {}, "next": 0.0, "interval": 0.1, "running_at": None,
                 "starts": {}, "next_start": 0.0}

        def attached() -> int:
            return sum(w.attached for w in waiters.values())

        def poll() -> None:
            now = time.monotonic()
            if now >= state["next"]:
                recs = squeue_jobs(ids)
                state["records"] = recs
                pending = [j for j in ids if j in recs and recs[j].state == "PENDING"]
                # fast at first (to see RUNNING early), then back off to spare slurmctld;
                # a job that waits in the queue is asked less often still
                cap = 5.0 if pending else 2.0
                state["interval"] = min(state["interval"] * 1.5, cap)
                state["next"] = time.monotonic() + state["interval"]
                for jid in ids:
                    r = recs.get(jid)
                    if r is None or not r.is_live:
                        if attached() >= total:
                            return
                        self._fail_ended(jid, r)
                    if r.state == "RUNNING" and state["running_at"] is None and \
                            all(recs.get(j) is not None and recs[j].state == "RUNNING"
                                for j in ids):
                        state["running_at"] = time.time()
                        limits.mark_running(time.monotonic())
                if pending and time.monotonic() >= state["next_start"]:
                    state["starts"] = squeue_expected_starts(pending)
                    state["next_start"] = time.monotonic() + 15.0
            if hello_times and len(ids) == 1:
                # an agent runs, so its job does (with several jobs, squeue must see all)
                limits.mark_running(time.monotonic())
            which = limits.expired(time.monotonic())
            if which is not None and attached() < total:
                self._fail_timeout(waiters, total, limits.describe(which))
            recs = state["records"]
            states = sorted({f"{r.state}" + (f" ({r.reason})" if r.reason and r.reason not in
                                             ("None", "(null)") else "")
                             for r in recs.values()}) or ["SUBMITTED"]
            starts = [state["starts"][j] for j in ids if j in state["starts"]
                      and recs.get(j) is not None and recs[j].state == "PENDING"]
            n = attached()
            key = (tuple(states), n, tuple(starts))
            est = f" expected start {min(starts)}" if starts else ""
            text = (f"job {','.join(ids)} {' '.join(states)}{est} {n}/{total} hosts attached "
                    f"{time.monotonic() - mono0:.1f}s")
            progress.show(key, text)

        self._live_hosts = {}
        try:
            poll()
            for mesh, w in waiters.items():
                # no deadline of its own: poll() raises once a limit in `limits` has passed
                hosts = w.wait(math.inf, poll=poll, poll_interval=0.05)
                self._record_hosts(mesh, hosts)
            state["next"] = 0.0
            poll()
        finally:
            progress.done()
        t_attached = max(hello_times) if hello_times else time.time()
        running = self._batch_started() or state["running_at"]
        if running is None or running > t_attached:
            running = min(hello_times) if hello_times else t_attached
            self.timings["running_source"] = "first agent hello"
        else:
            self.timings["running_source"] = ("batch script" if self._batch_started()
                                              else "squeue")
        self.timings["running"] = running
        self.timings["attached"] = t_attached
        self.timings["submit_to_running_s"] = max(0.0, running - t_submit)
        self.timings["running_to_attached_s"] = max(0.0, t_attached - running)
        self.timings["submit_to_attached_s"] = t_attached - t_submit
        log.info("job %s: submit->RUNNING %.2f s, RUNNING->attached %.2f s",
                 ",".join(ids), self.timings["submit_to_running_s"],
                 self.timings["running_to_attached_s"])

    def _batch_started(self, restart: int | None = None) -> float | None:
        """When the batch script of run ``restart`` (default: the current) started."""
        if not self.job_dir:
            return None
        run = self.restart_count if restart is None else restart
        try:
            with open(os.path.join(self.job_dir, f"batch-started-r{run}")) as f:
                return float(f.read().strip())
        except (OSError, ValueError):
            return None

    def _fail_ended(self, job_id: str, rec: JobRecord | None) -> None:
        idx = self.job_ids.index(job_id) if job_id in self.job_ids else 0
        deadline = time.monotonic() + COMPLETING_WAIT
        while rec is not None and rec.state == "COMPLETING" and time.monotonic() < deadline:
            # ended, but Slurm is still winding it up: its final state (FAILED, CANCELLED,
            # TIMEOUT, ...) says more to the user than COMPLETING, and is a moment away
            time.sleep(0.25)
            try:
                recs = squeue_jobs([job_id])
            except SlurmError:
                break
            if job_id not in recs:
                break           # purged meanwhile: COMPLETING is the last state we saw
            rec = recs[job_id]
        state = rec.state if rec is not None else "GONE (no longer known to squeue)"
        reason = rec.reason if rec is not None and rec.reason not in ("", "None") else "-"
        paths = self.log_paths()
        err = paths[idx][:-4] + ".err" if idx < len(paths) else ""
        tail = log_tail(err, 15)
        if not tail and idx < len(paths):
            time.sleep(0.3)        # the log may still be landing on a shared filesystem
            tail = log_tail(err, 15) or log_tail(paths[idx], 15)
        raise SlurmJobFailed(
            f"Slurm job {job_id} ended ({state}, reason {reason}) before its host agents "
            f"attached; job log: {self._log_hint(idx)}" +
            (f"\nlast lines of its stderr:\n{tail}" if tail else ""))

    def _fail_timeout(self, waiters: dict, total: int, limit: str) -> None:
        n = sum(w.attached for w in waiters.values())
        recs = {}
        try:
            recs = squeue_jobs(self.job_ids)
        except SlurmError:
            pass
        states = ", ".join(f"{j} {recs[j].state}" + (f" ({recs[j].reason})"
                                                      if recs[j].reason not in ("", "None")
                                                      else "")
                           if j in recs else f"{j} unknown" for j in self.job_ids)
        ids = list(self.job_ids)
        try:
            scancel(ids, wait=30)
            cancelled = "it was cancelled"
        except SlurmError as e:
            cancelled = f"cancelling it failed: {e}"
        raise SlurmStartTimeout(
            f"only {n} of {total} host agents of Slurm job {', '.join(ids)} attached {limit} "
            f"(job state: {states}); {cancelled}; job log: "
            f"{self._log_hint()}")

    # -- state ----------------------------------------------------------------------
    def state(self, cached_path: str | None = DEFAULT_CACHE, *,
              fewer_hosts: bool = False) -> JobState:
        """As JobTrait.state; inside the job's own allocation (client_script) it connects to
        the job's agents instead of submitting another job. A lost host is replaced by a
        spare node; without one it raises SlurmHostsLost, unless ``fewer_hosts``: then the
        meshes are the hosts that answer (and stay so)."""
        asked = {"fewer_hosts": bool(fewer_hosts), "token": self.token,
                 "live": self.__dict__.get("_live_hosts") or {}}
        token = _CONNECTING.set(asked)
        try:
            return self._state_of(cached_path)
        except SlurmHostsLost:
            # the nodes lost are the job's to remember, even when it cannot go on
            job = asked.get("job", self)
            if job is not self:
                self.bad_nodes = list(dict.fromkeys([*self.bad_nodes, *job.bad_nodes]))
            if cached_path is not None:
                job.dump(cached_path)
            raise
        finally:
            _CONNECTING.reset(token)

    def inherit_bad_nodes(self, cached: Any) -> None:
        """A job submitted again keeps away from the nodes its cached self lost: the same
        job (by its name, however its meshes or limits changed), not whatever other job the
        context ran before. Said in the log, with the way out."""
        if (isinstance(cached, SlurmJob) and cached.bad_nodes
                and cached.spec.job_name == self.spec.job_name):
            self.bad_nodes = list(dict.fromkeys([*self.bad_nodes, *cached.bad_nodes]))
            log.warning("Slurm job %r keeps off the nodes it lost before: %s (a node back in "
                        "service: set job.bad_nodes = [] before state())", self.spec.job_name,
                        ", ".join(self.bad_nodes))

    def _state_of(self, cached_path: str | None) -> JobState:
        if cached_path is not None and not self.__dict__.get("_live_hosts"):
            self.inherit_bad_nodes(try_load(cached_path))
        if in_batch_job():
            path = os.environ.get("HPCMESH_JOB_STATE")
            running = try_load(path) if path else None
            if isinstance(running, SlurmJob):
                for service in COMPONENTS:
                    if self.__dict__.get(service) is not None:
                        setattr(running, service, getattr(self, service))
                return running._job_state(running._state())
        st = super().state(cached_path)
        if cached_path is not None and self.__dict__.get("_redump"):
            self._redump = False
            self.dump(cached_path)
        return st

    def _state(self) -> dict[str, Any]:
        if in_batch_job() and not getattr(self, "_live_hosts", None):
            _stop_agents_at_exit(self._ids())
        return self._connect()

    def _connect(self) -> dict[str, Any]:
        from ..runtime.client import client_runtime
        node = client_runtime().node
        live = getattr(self, "_live_hosts", None) or {}
        restart = self._current_restart()
        moved_from = None
        if restart != self.restart_count:
            log.warning("Slurm job %s was requeued (restart %d); connecting to its new agents",
                        self.job_id, restart)
            self.exclude_bad_nodes()    # if it still waits: keep it off the nodes it lost
            # (restart_count changes once the new run's agents attached: until then, its
            # watchers still see the run they knew end)
            moved_from = self.restart_count
            self.agent_addresses = {}
            self._forget_hosts()
            live = {}
            self._redump = True
        for bad in (_NODE_WATCH.get(self.token) or {}).get("bad", ()):
            self.mark_bad_node(bad)       # found by this process's watch of the job's nodes
        if live and set(live) == set(self.mesh_names) and all(
                node.peer_connected(h.agent.node_id) and not on_bad_node(h.hostname,
                                                                         self.bad_nodes)
                for hs in live.values() for h in hs):
            self._watch_nodes(live)
            return self._meshes(live)
        asked = _CONNECTING.get() or {}
        asked["job"] = self
        if not live and moved_from is None and asked.get("token") == self.token:
            live = asked.get("live") or {}    # this process's own, on a job loaded from cache
        secret = bytes.fromhex(self.secret_hex) if self.secret_hex else None
        hosts: dict[str, list[HostRef | None]] = {}
        errors: list[str] = []
        for mesh in self.mesh_names:
            addrs = self.agent_addresses.get(mesh)
            if not addrs:
                addrs = self._wait_ready_files(mesh, restart)
                self.agent_addresses[mesh] = addrs
                self._redump = True
            known = {tuple(h.agent.addresses): h for h in live.get(mesh, ())}
            hosts[mesh] = []
            for a in addrs:
                ref = known.get(tuple(a))
                if ref is None or not node.peer_connected(ref.agent.node_id):
                    try:    # an agent this process saw go: its host is lost unless it answers
                        ref = attach_host(a, secret, 10.0 if ref is None else LOST_PROBE_S)
                    except ConnectionError as e:
                        hosts[mesh].append(None)
                        errors.append(f"mesh {mesh!r}: {e}")
                        continue
                if on_bad_node(ref.hostname, self.bad_nodes):
                    hosts[mesh].append(None)      # Slurm took its node: lost, answer or not
                    errors.append(f"mesh {mesh!r}: {ref.hostname} was taken out of the job")
                    continue
                hosts[mesh].append(ref)       # it answers: its processes stay as they are
        if errors and not any(r is not None for refs in hosts.values() for r in refs):
            raise SlurmError(
                f"cannot reconnect to the host agents of Slurm job {self.job_id} "
                f"({'; '.join(errors)}). They exit {self.grace:g} s after their last "
                f"controller left; kill the job (job.kill()) and apply it again")
        if errors:
            log.warning("Slurm job %s: host agent(s) lost: %s", self.job_id, "; ".join(errors))
            hosts = replace_lost(self, hosts, SpareLaunch(client_attach_addresses(),
                                                          self._agent_env(), restart),
                                 fewer_hosts=bool(asked.get("fewer_hosts")))
        for mesh, refs in hosts.items():
            self._record_hosts(mesh, refs)
        self.restart_count = restart
        self._watch_nodes(hosts)
        meshes = self._meshes(hosts)
        if moved_from is not None:
            self._tell_running_again(moved_from, hosts)
        return meshes

    def _watch_nodes(self, hosts: dict[str, list[HostRef]]) -> None:
        """With spares, Slurm may take a node out of the running job (--no-kill) while its
        agent still answers (its slurmd silent): watch for it (one watch per job in this
        process, whichever copy of the job connects), and count that host lost."""
        if not self.spec.spare_nodes or not self.job_id or not self.token:
            return
        from ..runtime.client import client_runtime
        watch = _NODE_WATCH.get(self.token)
        if watch is None:
            watch = _NODE_WATCH[self.token] = {"hosts": {}, "bad": []}
            job_id = self.job_id

            def lost(ref: HostRef, node: str, why: str) -> None:
                log.warning("Slurm job %s: %s", job_id, why)
                watch["bad"].append(node)
                client_runtime().host_lost(ref.agent.node_id, why)
            rt_node = client_runtime().node

            def answering() -> dict[str, list[HostRef]]:
                # an agent that stopped answering is the runtime's to report (keepalive),
                # and one a requeue ended is no loss: only those that still answer
                return {m: [r for r in refs if rt_node.peer_connected(r.agent.node_id)]
                        for m, refs in watch["hosts"].items()}
            watch["stop"] = watch_removed_nodes(job_id, answering, lost)
        watch["hosts"] = {m: list(refs) for m, refs in hosts.items()}

    def _record_hosts(self, mesh: str, hosts: Sequence[HostRef]) -> None:
        """``mesh``'s agents now: what a reconnect dials, and whose host a loss names."""
        addrs = [list(h.agent.addresses) for h in hosts]
        names = [h.hostname for h in hosts]
        if addrs != self.agent_addresses.get(mesh) or names != self.agent_hostnames.get(mesh):
            self._redump = True
        self.agent_addresses[mesh] = addrs
        self.agent_hostnames = {**self.agent_hostnames, mesh: names}
        live = self.__dict__.get("_live_hosts")
        if live is None:
            live = self._live_hosts = {}
        live[mesh] = list(hosts)

    def mark_bad_node(self, node: str) -> None:
        """Slurm node ``node`` lost a host of this job (or you know it is bad): kept in
        ``bad_nodes`` with the job, and never given to it again."""
        if node not in self.bad_nodes:
            log.warning("Slurm job %s: node %s is lost; excluded from this job from now on",
                        self.job_id, node)
            self.bad_nodes = [*self.bad_nodes, node]
            self._redump = True

    def _meshes(self, hosts: dict[str, list[HostRef]]) -> dict[str, SlurmHostMesh]:
        self._watch_ends([h.agent.node_id for hs in hosts.values() for h in hs])
        return {m: SlurmHostMesh.from_hosts(hosts[m], m, job=self) for m in self.mesh_names}

    def requeue(self, wait: float = 60.0) -> None:
        """Requeue the running job (``scontrol requeuehold``, then ``release``): its agents
        end, the job waits in the queue, and ``state()`` connects to the new ones. The nodes
        in ``bad_nodes`` are excluded (``ExcNodeList``) while it is held, so it cannot land
        on them again. Needs ``requeue=True``."""
        ids = self._ids()
        if not ids:
            raise SlurmError("this job was not submitted; nothing to requeue")
        if not self.spec.meshes[self.mesh_names[0]].requeue:
            raise SlurmError(f"Slurm job {self.job_id} is not requeue-able: make it with "
                             f"SlurmJob(..., requeue=True)")
        for jid in ids:
            proc = slurmctl.run(["scontrol", "requeuehold", jid])
            if proc.returncode != 0:
                raise SlurmError(f"scontrol requeuehold {jid} failed: "
                                 f"{(proc.stderr or proc.stdout).strip()}")
        self._forget_hosts()
        deadline = time.monotonic() + wait
        excluded = self.exclude_bad_nodes()
        while not excluded and time.monotonic() < deadline:
            time.sleep(0.2)         # sleep: Slurm takes ExcNodeList once the job is pending
            excluded = self.exclude_bad_nodes()
        for jid in ids:
            slurmctl.run(["scontrol", "release", jid])
        if not excluded:
            raise SlurmError(f"Slurm job {self.job_id} was requeued, but did not wait in the "
                             f"queue within {wait:g} s, so its lost nodes "
                             f"({', '.join(self.bad_nodes)}) could not be excluded from it")

    def _forget_hosts(self) -> None:
        """The job's agents are ending (a requeue): neither used nor watched any more."""
        self._live_hosts = {}
        watch = _NODE_WATCH.get(self.token) if self.token else None
        if watch is not None:
            watch["hosts"] = {}

    def exclude_bad_nodes(self) -> bool:
        """Tell Slurm to keep the job off ``bad_nodes`` (``scontrol update ExcNodeList``:
        Slurm takes it only while the job is pending); True once it took it (or there is
        nothing to exclude)."""
        if not self.bad_nodes:
            return True
        ok = True
        for jid in self._ids():
            proc = slurmctl.run(["scontrol", "update", f"JobId={jid}",
                                 f"ExcNodeList={','.join(self.bad_nodes)}"])
            ok = ok and proc.returncode == 0
        return ok

    def _current_restart(self) -> int:
        if in_batch_job() and os.environ.get("SLURM_RESTART_COUNT", "").strip():
            return slurm_restart_count(os.environ)
        if not self.spec.meshes[self.mesh_names[0]].requeue or not self.job_ids:
            return self.restart_count
        counts = [c for c in (slurmctl.restart_count(j) for j in self.job_ids) if c is not None]
        return max(counts) if counts else self.restart_count

    def _wait_ready_files(self, mesh: str, restart: int) -> list[list[str]]:
        """Addresses of ``mesh``'s agents of run ``restart`` from their ready files, in
        Slurm task order.

        After a requeue the job waits in the queue again: that wait is not bounded (nor
        counted against the bring-up ``timeout``) unless the job is gone from Slurm."""
        if not self.job_dir:
            raise SlurmError(f"job {self.job_id} has no job folder recorded; cannot find its "
                             f"agents")
        expected = self._expected(mesh)
        ids = self._ids()
        limits = StartLimits(self.timeout, None, time.monotonic())
        if in_batch_job() or not ids:
            limits.mark_running(time.monotonic())   # we run inside the job itself
        progress = Progress(self.progress)
        pattern = os.path.join(self.job_dir, ready_name(mesh, restart, "*"))
        delay, next_squeue, recs = 0.05, 0.0, {}
        try:
            while True:
                found = []
                for path in glob.glob(pattern):
                    try:
                        with open(path) as f:
                            text = f.read()
                    except OSError:
                        continue
                    if not text.endswith("\n"):
                        continue          # still being written
                    procid = path.rsplit("-", 1)[1].split(".")[0]
                    found.append((int(procid) if procid.isdigit() else 0,
                                  [a for a in text.split() if a]))
                if len(found) >= expected:
                    return [a for _, a in sorted(found)[:expected]]
                if ids and time.monotonic() >= next_squeue:   # a job may end (or be requeued)
                    recs = squeue_jobs(ids)
                    next_squeue = time.monotonic() + 2.0
                    for jid in ids:
                        r = recs.get(jid)
                        # COMPLETING: a requeued run is wound up before the job is queued
                        # again (a job that really ends shows COMPLETED at the next look)
                        if r is None or not (r.is_live or r.state == "COMPLETING"):
                            self._fail_ended(jid, r)
                    if all(recs[j].state == "RUNNING" for j in ids):
                        limits.mark_running(time.monotonic())
                    progress.show(tuple((j, r.state, r.reason) for j, r in recs.items()),
                                  f"job {','.join(ids)} " + " ".join(
                                      f"{r.state}" + (f" ({r.reason})" if r.reason not in
                                                      ("", "None") else "")
                                      for r in recs.values()) +
                                  f" waiting for the agents of mesh {mesh!r}")
                if limits.expired(time.monotonic()):
                    st = ", ".join(f"{j} {r.state}" for j, r in recs.items()) or "RUNNING"
                    raise SlurmStartTimeout(
                        f"only {len(found)} of {expected} host agents of mesh {mesh!r} wrote "
                        f"their ready file in {self.job_dir} "
                        f"{limits.describe('bring-up')} (job {self.job_id}: {st}); job log: "
                        f"{self._log_hint()}")
                time.sleep(delay)
                delay = min(delay * 1.5, 1.0)
        finally:
            progress.done()

    # -- life cycle -------------------------------------------------------------------
    def _kill(self) -> None:
        """Stop the agents (``scancel --signal=HUP``: steps only, they exit 0 and the job
        completes at once), then ``scancel`` whatever is still active; returns once squeue
        shows none of the job(s) pending, running or completing."""
        ids = self._ids()
        self._live_hosts = {}
        watch = _NODE_WATCH.pop(self.token, None) if self.token else None
        if watch is not None:
            watch["stop"].set()
        self._applied = False
        if not ids:
            return
        running = [j for j, r in squeue_jobs(ids).items() if r.state == "RUNNING"]
        if running and not self.client_script:
            slurmctl.scancel_once(running, signal="HUP")
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                if not any(r.is_active for r in squeue_jobs(ids).values()):
                    return
                time.sleep(0.1)
        scancel(ids)

    def _is_active(self) -> bool:
        ids = self._ids()
        if not ids:
            return False
        recs = squeue_jobs(ids)
        if any(r.is_live for r in recs.values()):
            return True
        # a requeued run is wound up (COMPLETING) before the job is queued again: it comes
        # back, so state() must wait for it, not submit another job
        return any(r.state == "COMPLETING" and (slurmctl.restart_count(j) or 0) >
                   self.restart_count for j, r in recs.items())

    def __getstate__(self):
        d = super().__getstate__()
        d.pop("_redump", None)
        return d

    # -- job events (SPEC §12): the job itself moved ---------------------------------
    _live_carried = ("_live_events",)       # watchers set before state() found the cache

    @property
    def _events(self) -> JobEvents:
        events = self.__dict__.get("_live_events")
        if events is None:
            events = self.__dict__.setdefault("_live_events", JobEvents())
        return events

    def watch_events(self, callback: Callable[[JobEvent], None], interval: float = 5.0
                     ) -> threading.Event:
        """Call ``callback(event)`` with each :class:`~hpcmesh.job.events.JobEvent` of this
        job from now on: Slurm requeued, preempted, timed out, cancelled or ended it (its
        processes are gone; calls on its old meshes raise a SupervisionError with reason
        ``ENDED_BY_SLURM``), or it runs again (``running-again``, once ``state()`` has
        reconnected). Events come as soon as the job's processes end; besides, Slurm is
        asked every ``interval`` seconds (a job with no processes running tells nothing
        else). Callbacks run on a daemon thread; set the returned Event to stop."""
        if not (isinstance(interval, (int, float)) and math.isfinite(interval)
                and interval > 0):
            raise ValueError(f"watch_events interval must be a number of seconds > 0, "
                             f"got {interval!r}")
        unwatch = self._events.watch(callback)
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(interval):
                ids, known = self._ids(), self.restart_count
                if not ids or not self._applied or any(
                        self._events.was_told(j, known) for j in ids):
                    continue
                try:
                    seen = self._slurm_view(ids, known)
                except SlurmError as e:
                    log.debug("watch_events: %s", e)
                    continue
                if seen is not None:
                    self._settle_end(*seen, ids, known, None)
            unwatch()
        threading.Thread(target=run, name="hpcmesh-slurm-events", daemon=True).start()
        return stop

    def _watch_ends(self, agent_ids: list[str]) -> None:
        """Ask the runtime to let this job explain its agents' ends (``_explain_end``)
        before any is reported as a fault."""
        key = (frozenset(agent_ids), self.restart_count)
        if not agent_ids or self.__dict__.get("_live_watched") == key:
            return
        self._live_watched = key
        from ..runtime.client import client_runtime
        ids, known = tuple(self._ids()), self.restart_count
        unwatch = self.__dict__.get("_live_unwatch")
        if unwatch is not None:
            unwatch()           # the agents of the run before: gone, or this run's
        self._live_unwatch = client_runtime().watch_job_ends(
            agent_ids, lambda what: self._explain_end(what, ids, known, key[0]))

    def _slurm_view(self, ids: Sequence[str], known: int) -> tuple[JobEvent, bool] | None:
        """What Slurm says happened to run ``known`` of the job: (event, final) where it
        moved (``final`` False: still COMPLETING, the kind a guess), None where it runs."""
        recs = squeue_jobs(list(ids), timeout=20)
        for jid in ids:
            rec = recs.get(jid)
            state = rec.state if rec is not None else ""
            reason = rec.reason if rec is not None and rec.reason not in (
                "", "None", "(null)") else ""
            restarts = preempt_at = None
            if rec is not None and (state != "RUNNING" or
                                    self.spec.meshes[self.mesh_names[0]].requeue):
                restarts, preempt_at = slurmctl.restarts_and_preemption(jid)
            # chosen for preemption, running on for the partition's GraceTime (its tasks got
            # SIGTERM: a notice to the agents): kept, since the job's next state may no
            # longer show it, and slurmstepd's line may not be in its stderr yet
            chosen = self.__dict__.setdefault("_live_preempt_at", {})
            if preempt_at and (restarts in (None, known) or
                               (restarts == known + 1 and state != "RUNNING")):
                chosen[(jid, known)] = preempt_at       # (not the next run's, running)
            preempt_at = chosen.get((jid, known))
            kind, final = classify(state, reason, restarts, known, preempted_at=preempt_at)
            if kind is None:
                continue
            # squeue shows a preemption in requeue mode as a requeue: slurmstepd's line
            # in the job's stderr says which it was
            # (one of the run that ended: with --open-mode=append the log keeps those of
            # the runs before)
            ended = slurm_end_line(log_tail(self._err_path(jid), 40), jid,
                                   since=self._batch_started(known))
            if ended:
                kind, final = classify(state, reason, restarts, known, ended, preempt_at)
            said = [state or "no longer known to Slurm"] + ([f"reason {reason}"] if reason
                                                            else [])
            if restarts is not None:
                said.append(f"restart count {restarts}")
            if preempt_at:
                said.append(f"PreemptTime {preempt_at}")
            if ended:
                said.append(ended)
            return JobEvent(kind, jid, "Slurm says " + ", ".join(said), time.time(), known,
                            runs_again(state, restarts, known)), final
        return None

    def _explain_end(self, what: str, ids: Sequence[str], known: int,
                     agent_ids: frozenset) -> Any:
        """The runtime asks: ``what`` happened on this job's agents; did the job move? The
        SupervisionError calls on its old meshes raise if it did (the event is told on a
        thread of its own, once Slurm has its final word), None if not."""
        try:
            seen = self._slurm_view(ids, known)
        except SlurmError as e:
            log.warning("cannot ask Slurm whether job %s moved (%s): %s", ",".join(ids),
                        what, e)
            return None
        if seen is None:
            return None
        event, final = seen
        threading.Thread(target=self._settle_end, args=(event, final, ids, known, agent_ids),
                         name="hpcmesh-slurm-event", daemon=True).start()
        return self._moved_error(event)

    def _settle_end(self, event: JobEvent, final: bool, ids: Sequence[str], known: int,
                    agent_ids: frozenset | None) -> None:
        """Wait (bounded) for Slurm's final word on a job being wound up, reword what the
        old meshes' calls raise with it, then tell the event."""
        deadline = time.monotonic() + EVENT_FINAL_WAIT
        first = event
        while not final and time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                seen = self._slurm_view(ids, known)
            except SlurmError:
                continue
            if seen is not None:
                event, final = seen
        event = dataclasses.replace(event, time=first.time)
        if agent_ids and event != first:
            from ..runtime.client import client_runtime
            client_runtime().end_with_job(agent_ids, self._moved_error(event))
        self._events.tell(event)

    def _moved_error(self, event: JobEvent) -> Any:
        from ..runtime.errors import ENDED_BY_SLURM, HOST_LOST, OUT_OF_MEMORY, SupervisionError
        # the class of the failure: Slurm's own word where it says more than "it ended"
        cls = (OUT_OF_MEMORY if "OUT_OF_MEMORY" in event.reason else
               HOST_LOST if "NODE_FAIL" in event.reason else ENDED_BY_SLURM)
        if event.comes_back:
            what = ("call job.state(): it waits for the job to run again and reconnects; "
                    "then spawn your processes again (from your checkpoint)")
        else:
            what = "the job will not run again (job.state() would submit it anew)"
        return SupervisionError(f"{event}: the processes of its run {event.restart} are "
                                f"gone; {what}", exit_status=f"ended by Slurm ({event.kind})",
                                reason=cls)

    def _tell_running_again(self, old: int, hosts: dict[str, list[HostRef]]) -> None:
        """``state()`` reconnected after a requeue: the requeue (if nothing told it yet)
        and the new run are events."""
        jid = self.job_id or "?"
        now = time.time()
        self._events.tell(JobEvent(REQUEUED, jid, f"restart count {old} -> "
                                   f"{self.restart_count}", now, old, True))
        nodes = sorted({h.hostname for hs in hosts.values() for h in hs})
        self._events.tell(JobEvent(RUNNING_AGAIN, jid, f"run {self.restart_count} on "
                                   f"{','.join(nodes)}", now, self.restart_count))

    # -- time limit / preemption --------------------------------------------------------
    def notices(self) -> list[dict] | None:
        """Time-limit/preemption warnings the agents received so far (None if none)."""
        return read_notices(os.path.join(self.job_dir, "notice") if self.job_dir else None,
                             self.restart_count)

    def watch_notices(self, callback: Callable[[dict], None], interval: float = 1.0
                      ) -> threading.Event:
        """Call ``callback(notice)`` (on a daemon thread) for each new warning; set the
        returned Event to stop watching."""
        stop = threading.Event()
        seen = len(self.notices() or [])
        run_seen = self.restart_count

        def run() -> None:
            nonlocal seen, run_seen
            while not stop.wait(interval):
                if self.restart_count != run_seen:   # requeued: the new run's notices
                    seen, run_seen = 0, self.restart_count
                got = self.notices() or []
                for n in got[seen:]:
                    try:
                        callback(n)
                    except Exception:  # noqa: BLE001
                        log.exception("notice callback failed")
                seen = len(got)
        threading.Thread(target=run, name="hpcmesh-slurm-notices", daemon=True).start()
        return stop

    def __repr__(self) -> str:
        meshes = ", ".join(f"{n}={m.nodes}" for n, m in self.spec.meshes.items())
        ids = ",".join(self._ids()) or "not submitted"
        return f"SlurmJob({meshes}; job {ids})"
