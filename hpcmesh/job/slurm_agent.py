"""The compute-node side of a Slurm job: the host agent each ``srun`` step starts.

``python -c AGENT_CODE --attach ...`` (what :func:`agent_command` builds, what the rendered
sbatch script's srun lines and ``SlurmAllocation``'s step run) imports this module alone:
the agent needs the agent runtime and Slurm's variables, not the login node's job
lifecycle (``job/slurm.py``: sbatch, squeue, waiting for agents). What the agent leaves
for the login side, and how it is named, is here too: its token (``agent_token``), its
ready file (``ready_name``) and the time-limit notices (``slurm_notice``, ``read_notices``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Sequence

from ..private_files.modules import PYTHON_FLAGS
from ..runtime.process.agent_main import NOTICE_VAR, run_agent
from ..runtime.process.bootstrap import AGENT_PYTHON_VAR
from ..settings import env_number
from ..slurm.parsing import slurm_restart_count, slurm_task_rank

#: The host agent entry point used in launch scripts (``python -c AGENT_CODE --attach ...``).
AGENT_CODE = "from hpcmesh.job.slurm_agent import agent_main; agent_main()"


def agent_token(token: str, mesh: str, restart: int | str) -> str:
    """What an agent of ``mesh`` says in its hello after ``restart`` requeues."""
    return f"{token}/{mesh}/r{restart}"


def ready_name(mesh: str, restart: int | str, procid: str) -> str:
    return f"agent-{mesh}-r{restart}-{procid}.addr"


def agent_main(argv: Sequence[str] | None = None) -> None:
    """One host agent of a Slurm step: listen on this node's chosen interface, dial the
    client (if given), write a ready file in the job folder, exit 0 when it ends. Its
    signals (HUP: stop now, USR1/USR2 and, in a job step, TERM: record a notice) are
    run_agent's."""
    p = argparse.ArgumentParser(prog="hpcmesh-slurm-agent")
    p.add_argument("--attach", default="", help="client addresses, comma separated")
    p.add_argument("--grace", type=float, default=None)
    p.add_argument("--initial-wait", type=float, default=None)
    p.add_argument("--job-dir", default=None)
    p.add_argument("--mesh", default=None)
    # a spare's agent stands in for the lost host's tasks: its ready files carry their
    # ranks (this step's SLURM_PROCID counted from there), so the mesh keeps its order
    p.add_argument("--rank-base", type=int, default=0)
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    env = os.environ
    restart = str(slurm_restart_count(env))   # both name files: checked to be numbers
    procid = str(max(0, args.rank_base) + slurm_task_rank(env))
    mesh = args.mesh or env.get("HPCMESH_MESH_NAME") or "hosts"
    if env.get("HPCMESH_JOB_TOKEN"):
        env["HPCMESH_JOB_TOKEN"] = agent_token(env["HPCMESH_JOB_TOKEN"], mesh, restart)
    from ..transport.netif import NoUsableInterfaceError, usable_candidates
    try:
        ips = [c.address for c in usable_candidates()]
    except NoUsableInterfaceError as e:
        print(f"hpcmesh agent on {socket.gethostname()}: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    listen = [f"tcp://[{ip}]:0" if ":" in ip else f"tcp://{ip}:0" for ip in ips]
    env[AGENT_PYTHON_VAR] = sys.executable
    ready = None
    if args.job_dir:
        env.setdefault("HPCMESH_LOG_DIR", os.path.join(args.job_dir, "procs"))
        env.setdefault(NOTICE_VAR, os.path.join(args.job_dir, "notice"))
        ready = os.path.join(args.job_dir, ready_name(mesh, restart, procid))
    attach = [a for a in args.attach.split(",") if a]
    initial_wait = args.initial_wait
    if attach and initial_wait is None:
        # if the client is gone before we started, do not hold the nodes
        initial_wait = args.grace if args.grace is not None else env_number(
            "HPCMESH_LEASE_GRACE", 30, finite=True, env=env)
    # in a job step, Slurm's SIGTERM is a preemption (GraceTime) or the job's end: a notice
    reason = run_agent(listen, attach, grace=args.grace, initial_wait=initial_wait,
                       advertise_host=ips[0], ready_file=ready,
                       term_is_notice=bool(env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_ID")))
    print(f"hpcmesh agent on {socket.gethostname()} done: {reason}", file=sys.stderr, flush=True)
    sys.exit(0)


def agent_command(python: str, *, attach: Sequence[str] = (), grace: float | None = None,
                  initial_wait: float | None = None, job_dir: str | None = None,
                  mesh: str | None = None, rank_base: int = 0) -> list[str]:
    """argv that starts one host agent (what the rendered srun lines run; ``rank_base``:
    the first task rank a spare's agent stands in for)."""
    argv = [python, *PYTHON_FLAGS, "-c", AGENT_CODE]
    if attach:
        argv += ["--attach", ",".join(attach)]
    if grace is not None:
        argv += ["--grace", f"{grace:g}"]
    if initial_wait is not None:
        argv += ["--initial-wait", f"{initial_wait:g}"]
    if job_dir:
        argv += ["--job-dir", job_dir]
    if mesh:
        argv += ["--mesh", mesh]
    if rank_base:
        argv += ["--rank-base", str(rank_base)]
    return argv


def slurm_notice() -> list[dict] | None:
    """Inside an actor (or anything an agent started): the time-limit/preemption warnings
    Slurm sent this run of the job so far (one per agent, oldest first; keys ``signal``,
    ``time``, ``host``, ``slurm_job_id``, ``slurm_nodeid``, ``restart``), or None."""
    return read_notices(os.environ.get(NOTICE_VAR), slurm_restart_count(os.environ))


def read_notices(path: str | None, restart: int | None = None) -> list[dict] | None:
    if not path:
        return None
    try:
        with open(path) as f:
            out = [json.loads(ln) for ln in f if ln.strip()]
    except (OSError, ValueError):
        return None
    if restart is not None:
        out = [n for n in out if n.get("restart", 0) == restart]
    return out or None
