"""A Slurm job's lost hosts, and the spare nodes that replace them (SPEC §12).

``SlurmJob(..., spare_nodes=k)`` asks Slurm for k nodes more than its meshes need, with
``--no-kill`` (the job outlives a failed node) and each mesh's step with ``srun
--no-kill`` (a failed node ends only its own tasks). The spares stay idle. When a host
stops answering, the runtime tells its owner (a ``MeshFailure``, reason ``HOST_LOST``:
its agent's connection closed, or TCP keepalive found it silent, and it did not answer
a new connection; or Slurm took its node out of the job, which a squeue watch sees:
``watch_removed_nodes``). The next ``job.state()`` finds that host's agents lost; here
its node is recorded as bad (``job.bad_nodes``), a spare of the allocation gets a new
agent step (``srun --jobid --nodelist=<spare>``, from this client, in a session of its
own), and the mesh is rebuilt with the same extent: the spare's agents stand at the
lost ones' ranks, the other hosts' agents and their processes are untouched.

Bad nodes are excluded from the job when it is submitted again (``--exclude``) and,
through ``scontrol update ExcNodeList``, when it waits in the queue after a requeue.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from ..actor.host_mesh import HostRef
from ..log_tail import log_tail
from ..runtime.client import AGENT_PROBE_S
from ..transport.connection import KEEPALIVE_S
from . import slurmctl
from .slurm_agent import agent_command, agent_token
from .slurmctl import SlurmError

log = logging.getLogger("hpcmesh.job.slurm")

#: A host that stops answering is a MeshFailure (reason HOST_LOST) within this many seconds:
#: its agent's connection fails (at once when the agent is killed: FIN/RST; within
#: KEEPALIVE_S when its node is gone or cut off: keepalive probes, TCP_USER_TIMEOUT), then
#: a new connection gets no answer within AGENT_PROBE_S; one second more for the probes'
#: one-second steps. Defaults: 4 + 2 + 1 = 7 s. None with keepalive off (HPCMESH_KEEPALIVE=0).
#: (A node Slurm marks DOWN while it still answers us is lost DOWN_POLL_S after Slurm says
#: so: Slurm's own bound is its SlurmdTimeout.)
HOST_LOST_BOUND_S = (KEEPALIVE_S + AGENT_PROBE_S + 1.0) if KEEPALIVE_S > 0 else None

#: How often a job with spares asks squeue which nodes it still has: a node Slurm marked
#: DOWN (its slurmd silent for SlurmdTimeout, or an admin's word) leaves the job
#: (--no-kill), and its agent, which may still answer, is lost from then.
DOWN_POLL_S = 5.0

#: How long an agent that was connected, and is not now, gets to answer a new connection
#: before its host counts as lost (the runtime already gave it AGENT_PROBE_S).
LOST_PROBE_S = 3.0


class SlurmHostsLost(SlurmError):
    """Hosts of the job are lost and no spare node is left to replace them. ``left``: mesh
    name -> how many of its hosts still answer; ``lost``: mesh name -> the lost hosts."""

    def __init__(self, message: str, left: dict[str, int], lost: dict[str, list[str]]):
        super().__init__(message)
        self.left = left
        self.lost = lost


def node_name(hostname: str, job_nodes: Sequence[str]) -> str:
    """The Slurm node name of an agent's host: its hostname, or its first label, as the
    job's node list spells it (else the hostname as it is)."""
    short = hostname.split(".", 1)[0]
    for name in (hostname, short):
        if name in job_nodes:
            return name
    return short


def on_bad_node(hostname: str, bad: Sequence[str]) -> bool:
    """Does an agent on ``hostname`` run on one of the ``bad`` nodes?"""
    return hostname in bad or hostname.split(".", 1)[0] in bad


def watch_removed_nodes(job_id: str, hosts: Callable[[], dict[str, list[HostRef]]],
                        on_lost: Callable[[HostRef, str, str], None],
                        interval: float = DOWN_POLL_S) -> threading.Event:
    """Poll squeue (a daemon thread) for the nodes job ``job_id`` still has; call
    ``on_lost(ref, node, why)`` once for each agent of ``hosts()`` whose node Slurm took
    out of the running job. Set the returned Event to stop."""
    stop = threading.Event()
    told: set[str] = set()

    def run() -> None:
        while not stop.wait(interval):
            try:
                rec = slurmctl.squeue_jobs([job_id], timeout=20).get(job_id)
            except Exception as e:  # noqa: BLE001 - a slow slurmctld: ask again later
                log.debug("squeue for job %s: %s", job_id, e)
                continue
            if rec is None or rec.state != "RUNNING" or not rec.nodes:
                continue        # the job's own end or requeue is not a lost host
            for refs in hosts().values():
                for ref in refs:
                    node = node_name(ref.hostname, rec.nodes)
                    if node in rec.nodes or ref.agent.node_id in told:
                        continue
                    told.add(ref.agent.node_id)
                    try:
                        on_lost(ref, node, f"Slurm took node {node} out of job {job_id} "
                                           f"(marked DOWN: its slurmd stopped answering, or "
                                           f"an administrator's word)")
                    except Exception:  # noqa: BLE001
                        log.exception("reporting the loss of %s failed", node)
    threading.Thread(target=run, name=f"hpcmesh-slurm-nodes-{job_id}", daemon=True).start()
    return stop


def lost_message(job: Any, left: dict[str, list[str]], lost: dict[str, list[str]],
                 why: str) -> str:
    """Why state() cannot give full meshes, how many hosts are left, and the ways on."""
    parts = []
    for mesh, hosts in lost.items():
        alive = left.get(mesh, [])
        total = len(alive) + len(hosts)
        parts.append(f"mesh {mesh!r}: {len(alive)} of {total} host(s) left"
                     f"{' (' + ', '.join(alive) + ')' if alive else ''}, lost "
                     f"{', '.join(hosts)}")
    ends = "" if job.spec.spare_nodes else (
        " while the job runs (without spare_nodes it has no --no-kill: Slurm ends it once "
        "it marks the node down)")
    return (f"Slurm job {job.job_id} lost host(s) and {why}: {'; '.join(parts)}. To go on "
            f"with the hosts left, call job.state(fewer_hosts=True){ends}, which gives "
            f"meshes of the hosts that answer; or job.kill() and apply again (lost nodes "
            f"{', '.join(job.bad_nodes) or '-'} are excluded), with spare_nodes=k to keep "
            f"k nodes ready for the next loss")


def spare_srun_argv(job: Any, mesh: str, node: str, rank_base: int,
                    attach: Sequence[str]) -> list[str]:
    """``srun`` that starts ``mesh``'s agents on spare ``node`` inside the running job
    (a SlurmJob), standing in for ranks ``rank_base`` on, dialling ``attach``; run from
    the login node."""
    m = job.spec.meshes[mesh]
    agent = agent_command(m.python, attach=attach, grace=job.grace, job_dir=job.job_dir,
                          mesh=mesh, rank_base=rank_base)
    srun = ["srun", f"--jobid={job.job_id}", "--nodes=1", f"--nodelist={node}",
            f"--ntasks={m.ntasks_per_node}", f"--ntasks-per-node={m.ntasks_per_node}",
            "--no-kill", f"--job-name={job.spec.job_name}-spare"]
    if m.cpus_per_task is not None:
        srun.append(f"--cpus-per-task={m.cpus_per_task}")
    else:
        srun.append("--cpu-bind=none")
    if m.gpus_per_node:
        srun.append(f"--gpus-per-node={m.gpus_per_node}")
    if m.setup:
        # the batch script ran these before its srun; here they run on the spare itself
        script = "\n".join(["set +u", *m.setup, "set -u", 'exec "$@"'])
        return [*srun, "/bin/bash", "-euc", script, "hpcmesh-spare", *agent]
    return [*srun, *agent]


def spare_env(job: Any, mesh: str, agent_env: Mapping[str, str],
              restart: int = 0) -> dict[str, str]:
    """The environment the batch script gives ``mesh``'s agents (``agent_env``, the job's
    exports, and the mesh's own), for a spare's srun from this client (without this
    client's own Slurm variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(agent_env)
    for k, v in {**job.spec.meshes[mesh].env, "HPCMESH_MESH_NAME": mesh}.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    env["SLURM_RESTART_COUNT"] = str(restart)
    return env


def start_spare(job: Any, mesh: str, node: str, rank_base: int, launch: "SpareLaunch"
                ) -> list[HostRef]:
    """Start ``mesh``'s agents on spare ``node`` and wait for their hello; their HostRefs
    (one per task) in hello order."""
    from .attach import AttachWaiter
    m = job.spec.meshes[mesh]
    argv = spare_srun_argv(job, mesh, node, rank_base, launch.attach)
    log_path = os.path.join(job.job_dir, f"spare-{mesh}-{rank_base}-r{launch.restart}.log")
    waiter = AttachWaiter(agent_token(job.token, mesh, launch.restart), m.ntasks_per_node)
    log.warning("Slurm job %s: starting mesh %r's agent(s) for rank %d on spare node %s",
                job.job_id, mesh, rank_base, node)
    try:
        proc = slurmctl.start_srun(argv, spare_env(job, mesh, launch.env, launch.restart),
                                   log_path)
    except BaseException:
        waiter.stop()
        raise
    # (the srun ends with its step: scancel of the job, or the agents' lease; Python reaps it)

    def poll() -> None:
        if proc.poll() is not None:
            tail = log_tail(log_path, 15)
            raise SlurmError(f"the agent step on spare node {node} of Slurm job {job.job_id} "
                             f"ended (exit status {proc.returncode}) before its agent "
                             f"attached: `{shlex.join(argv[:8])} ...`; log {log_path}"
                             + (f"\n{tail}" if tail else ""))
    try:
        return waiter.wait(job.timeout, poll=poll, poll_interval=0.1)
    except Exception:
        if proc.poll() is None:
            proc.kill()
        raise


@dataclasses.dataclass
class SpareLaunch:
    """What a spare's agents need from the job: the client addresses they dial, the
    environment the batch script exports, and the run (restart count) they join."""
    attach: list[str]
    env: dict[str, str]
    restart: int = 0


def replace_lost(job: Any, hosts: dict[str, list[HostRef | None]], launch: SpareLaunch,
                 fewer_hosts: bool = False) -> dict[str, list[HostRef]]:
    """``hosts``: each mesh's HostRefs, None where the agent is lost. Records the lost
    nodes (``job.mark_bad_node``), replaces them from the job's spare nodes, and returns
    full meshes; without enough spares, SlurmHostsLost (or, ``fewer_hosts``, the meshes
    of what answers)."""
    recs = slurmctl.squeue_jobs([job.job_id]) if job.job_id else {}
    rec = recs.get(job.job_id)
    job_nodes = list(rec.nodes) if rec is not None else []
    lost: dict[str, list[str]] = {}
    left: dict[str, list[str]] = {}
    old = job.agent_hostnames
    for mesh, refs in hosts.items():
        for i, ref in enumerate(refs):
            if ref is None:
                lost.setdefault(mesh, []).append(old.get(mesh, [])[i] if i < len(
                    old.get(mesh, [])) else f"rank {i}")
            else:
                left.setdefault(mesh, []).append(ref.hostname)
    for hostname in {h for hs in lost.values() for h in hs if not h.startswith("rank ")}:
        job.mark_bad_node(node_name(hostname, job_nodes))
    if fewer_hosts:
        return {m: [r for r in refs if r is not None] for m, refs in hosts.items()}
    in_use = {node_name(r.hostname, job_nodes) for refs in hosts.values() for r in refs
              if r is not None}
    spares = [n for n in job_nodes if n not in in_use and n not in job.bad_nodes]
    # the lost ranks, grouped by the node they were on: one spare each
    groups: list[tuple[str, int, list[int]]] = []
    for mesh, refs in hosts.items():
        names = old.get(mesh, [])
        by_host: dict[str, list[int]] = {}
        for i, ref in enumerate(refs):
            if ref is None:
                by_host.setdefault(names[i] if i < len(names) else f"rank {i}", []).append(i)
        groups += [(mesh, min(ix), ix) for ix in by_host.values()]
    if len(groups) > len(spares):
        k = job.spec.spare_nodes
        why = ("has no spare nodes (spare_nodes=0)" if not k else
               f"has {len(spares)} spare node(s) left of spare_nodes={k} (needs {len(groups)})")
        raise SlurmHostsLost(lost_message(job, left, lost, why),
                             {m: len(v) for m, v in left.items()}, lost)
    out = {m: list(refs) for m, refs in hosts.items()}
    for (mesh, base, ranks), node in zip(groups, spares):
        t0 = time.monotonic()
        new = start_spare(job, mesh, node, base, launch)
        for i, ref in zip(ranks, new):
            out[mesh][i] = ref
        log.warning("Slurm job %s: mesh %r rank(s) %s now on spare node %s (%.1f s)",
                    job.job_id, mesh, ",".join(map(str, ranks)), node,
                    time.monotonic() - t0)
    return out  # type: ignore[return-value]
