"""The one host-agent entry point, :func:`run_agent`, and its one signal policy.

Every launcher runs an agent through it: ``hpcmesh worker`` (launch scripts, SSHJob),
the Slurm agent ``hpcmesh.job.slurm_agent.agent_main`` (SlurmJob, SlurmAllocation), the
submitit task of SubmititJob, and :func:`~hpcmesh.runtime.process.worker.run_worker_loop_forever`.
It owns the process around :func:`~hpcmesh.runtime.process.agent_serve.serve`: the secret, TLS,
the event loop and the signals.

Signals, the same for every launcher:

==========================  ===============================================================
SIGTERM, SIGINT, SIGHUP     Stop now, controller or not: SIGKILL the process group of every
                            process the agent started (so what an actor started goes too)
                            and the fork server, close the node, return ``"received SIGx"``.
                            scancel and Slurm's step teardown send TERM; SlurmJob.kill and
                            SlurmAllocation send HUP (``scancel --signal=HUP``: the steps
                            only, so the job completes at once); Ctrl-C sends INT.
SIGUSR1, SIGUSR2            Slurm's warning before a time limit or preemption (``--signal``
                            in the batch script; submitit asks USR2): append a JSON line to
                            the notice file (``$HPCMESH_SLURM_NOTICE``, which the agent's
                            processes read through ``slurm_notice()``), say so on stderr and
                            keep serving, so actors can checkpoint before the end.
SIGTERM in a Slurm step     (``term_is_notice``: the Slurm agent inside a job step) a notice
                            too, not a stop: Slurm sends it to the steps' tasks when it
                            preempts the job (at the start of the partition's GraceTime) and
                            when it ends it (scancel, time limit, requeue), and SIGKILLs them
                            GraceTime or KillWait later. The agent records it as above, tells
                            its controllers at once (``HostAgent.announce_notice``: the client
                            asks Slurm whether the job moved, so a scancel still ends its view
                            at once) and keeps serving, as do its fork server and processes
                            (``TERM_NOTICE_VAR``), so the program can checkpoint in the grace.
                            submitit ignores SIGTERM in its tasks for the same reason.
==========================  ===============================================================

Before this module there were three policies. ``hpcmesh worker`` and
``run_worker_loop_forever`` stopped on TERM/INT only: HUP and USR1 killed the agent
outright (Python's default action), leaving its processes to their own lease. The Slurm
agent added HUP (it SIGKILLed the process groups of its children found in
``/proc/<pid>/task/*/children``, which missed processes forked by the fork server, then
``os._exit``) and the USR1/USR2 notices. The submitit task went through ``hpcmesh worker``,
so there submitit's own USR2 handler (checkpoint, requeue) stayed in place; an agent has
nothing to checkpoint and SubmititJob does not requeue, so it now records the notice like
the Slurm agent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from typing import Sequence

from ...private_files import append_file
from ...settings import env_number, log_level
from ...transport import tls
from ...transport.addresses import secret_from_env
from ..loop import new_event_loop
from .agent_serve import Lease, serve
from .bootstrap import TERM_NOTICE_VAR

__all__ = ["run_agent", "exit_status", "record_notice", "configure_logging", "NOTICE_VAR",
           "STOP_SIGNALS", "NOTICE_SIGNALS", "TERM_NOTICE_VAR"]

#: The notice file of an agent and its processes (``slurm_notice()`` reads it).
NOTICE_VAR = "HPCMESH_SLURM_NOTICE"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
NOTICE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def run_agent(listen: str | Sequence[str] = "tcp://0.0.0.0:0", attach: Sequence[str] = (),
              secret: bytes | None = None, *, grace: float | None = None,
              initial_wait: float | None = None, advertise_host: str | None = None,
              ready_file: str | None = None, notice_file: str | None = None,
              ca=None, term_is_notice: bool = False) -> str:
    """Run a host agent in this process (its main thread) until it ends; why it ended.

    ``secret``: default ``$HPCMESH_SECRET`` / ``$HPCMESH_SECRET_FILE``. ``grace``: seconds
    without a controller before it exits (default ``$HPCMESH_LEASE_GRACE`` or 30).
    ``initial_wait``: exit if no controller came within it (default: wait).
    ``notice_file``: default ``$HPCMESH_SLURM_NOTICE``. ``ca``: TLS as in
    :func:`hpcmesh.transport.tls.settings` (default ``$HPCMESH_TLS_CA``); it is put in the
    environment, which the agent's node and every process it starts read.
    ``term_is_notice``: SIGTERM is a notice, not a stop (an agent in a Slurm job step; see
    the module's table); also put in the environment (``TERM_NOTICE_VAR``), for its
    processes, or taken out of it.
    """
    secret = secret or secret_from_env()
    listen = [listen] if isinstance(listen, str) else list(listen)
    if secret is None:
        secret = tls.trust_all_key(ca, None)
        if secret is None:
            raise ValueError("the worker needs the job secret: set HPCMESH_SECRET (hex) or "
                             "HPCMESH_SECRET_FILE (a file of mode 0600), or pass secret=; "
                             "ca='trust_all_connections' without a secret accepts any "
                             "client that reaches the worker (Monarch's trust model)")
        print(f"hpcmesh worker at {', '.join(listen)}: ca='trust_all_connections' and no "
              f"job secret: any client that can reach this address may run code here as "
              f"this user", file=sys.stderr, flush=True)
    grace = env_number("HPCMESH_LEASE_GRACE", 30, finite=True) if grace is None else grace
    notice_file = notice_file or os.environ.get(NOTICE_VAR)
    tls_settings = tls.settings(ca)
    if tls_settings is not None:
        os.environ.update(tls_settings.env())
    if term_is_notice:
        os.environ[TERM_NOTICE_VAR] = "1"
    else:       # (inherited from an agent above this one: not ours to follow)
        os.environ.pop(TERM_NOTICE_VAR, None)
    lease = Lease(grace, initial_wait)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        for sig in STOP_SIGNALS:
            if not (term_is_notice and sig == signal.SIGTERM):
                loop.add_signal_handler(sig, lease.stop, f"received {sig.name}")
        for sig in NOTICE_SIGNALS:
            loop.add_signal_handler(sig, record_notice, notice_file, sig)
        if term_is_notice:
            loop.add_signal_handler(signal.SIGTERM, _term_notice, notice_file, lease)
        return loop.run_until_complete(serve(listen, list(attach), secret, lease,
                                             advertise_host, ready_file))
    finally:
        for sig in (*STOP_SIGNALS, *NOTICE_SIGNALS):
            loop.remove_signal_handler(sig)     # back to the default action
        loop.close()


def exit_status(reason: str) -> int:
    """The exit status for an agent process that ended for ``reason``: 0 when it ended as
    asked (a stop signal, or its lease after the controller left), 1 when no controller
    ever came (``initial_wait``: the launch went wrong somewhere)."""
    return 0 if reason.startswith(("received", "controller gone")) else 1


def _term_notice(path: str | None, lease: Lease) -> None:
    """SIGTERM in a Slurm step: recorded like a warning, and told to the controllers now."""
    record_notice(path, signal.SIGTERM)
    lease.notice("received SIGTERM from Slurm (preemption, or the job's end)")


def record_notice(path: str | None, signum: int) -> None:
    """Append one time-limit/preemption warning to the notice file (a JSON line: signal,
    time, host, Slurm job id, node id, pid, restart count) and say so on stderr."""
    entry = {"signal": signal.Signals(signum).name, "time": time.time(),
             "host": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
             "slurm_nodeid": os.environ.get("SLURM_NODEID"), "pid": os.getpid(),
             "restart": int(os.environ.get("SLURM_RESTART_COUNT") or 0)}
    what = ("Slurm preempts or ends the job: SIGKILL follows after the partition's "
            "GraceTime or KillWait; serving on until then" if signum == signal.SIGTERM
            else "Slurm time-limit or preemption warning")
    print(f"hpcmesh agent on {entry['host']}: received {entry['signal']} ({what}); recorded "
          f"in {path or '(no notice file)'}", file=sys.stderr, flush=True)
    if not path:
        return
    try:    # one write of one line in append mode: agents sharing the file do not interleave
        with append_file(path, what="the notice file", mode=0o644) as f:
            f.write((json.dumps(entry) + "\n").encode())
    except OSError as e:
        print(f"hpcmesh agent: cannot write notice {path}: {e}", file=sys.stderr, flush=True)


def configure_logging() -> None:
    """Log to stderr at ``$HPCMESH_LOG_LEVEL`` (default WARNING), for a process that is an
    agent and nothing else (``hpcmesh worker``, the submitit task); ``run_agent`` itself
    leaves logging alone, since a program may call it under its own logging setup."""
    logging.basicConfig(level=log_level(),
                        format="%(levelname)s %(name)s: %(message)s")
