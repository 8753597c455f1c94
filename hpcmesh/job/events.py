"""Job events (SPEC §12): the job itself moved, which is no fault of any process in it.

Slurm requeues a job (``scontrol requeue``, or a preemption in requeue mode), preempts
it, ends it at its time limit, cancels it, or it ends; each time it ends every process
of the run. Those ends are one :class:`JobEvent` for the program (``job.watch_events``,
the log, telemetry's ``job_events`` table), never a MeshFailure per process, and calls
on the old meshes fail saying what happened and what to do (``job.state()``). A job that
runs again after a requeue is one more event, ``running-again``.

:func:`classify` reads the kind from what Slurm says of the job (``squeue``'s state and
reason, ``scontrol``'s restart count and PreemptTime, and slurmstepd's line in the job's
stderr, which :func:`slurm_end_line` finds); :class:`JobEvents` hands the events to whoever
watches, once each.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from typing import Callable

from ..runtime.observe import telemetry_recorder

log = logging.getLogger("hpcmesh.job.events")

__all__ = ["JobEvent", "JobEvents", "classify", "runs_again", "slurm_end_line", "EVENT_KINDS",
           "REQUEUED", "PREEMPTED", "TIME_LIMIT", "CANCELLED", "ENDED", "RUNNING_AGAIN"]

REQUEUED = "requeued"
PREEMPTED = "preempted"
TIME_LIMIT = "time_limit"
CANCELLED = "cancelled"
ENDED = "ended"
RUNNING_AGAIN = "running-again"
EVENT_KINDS = (REQUEUED, PREEMPTED, TIME_LIMIT, CANCELLED, ENDED, RUNNING_AGAIN)

_WORDS = {REQUEUED: "was requeued", PREEMPTED: "was preempted",
          TIME_LIMIT: "reached its time limit", CANCELLED: "was cancelled", ENDED: "ended",
          RUNNING_AGAIN: "runs again"}

#: Slurm states in which the run a client knew goes on.
_GOES_ON = frozenset({"RUNNING", "CONFIGURING", "SIGNALING", "RESIZING", "SUSPENDED",
                      "STOPPED"})
#: States of a job on its way back into the queue.
_REQUEUE_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})

#: What slurmstepd writes to a job's stderr when Slurm ends a run, e.g. (Slurm 22.05)
#: ``slurmstepd-node2: error: *** JOB 43 ON node2 CANCELLED AT 2026-12-06T16:42:23 DUE TO
#: PREEMPTION ***``; ``DUE TO JOB REQUEUE`` (scontrol requeue), ``DUE TO TIME LIMIT``,
#: nothing after the time (scancel).
_STEPD_END = re.compile(r"\*\*\* JOB (\d+) ON \S+ CANCELLED AT (\S+)(?: DUE TO [^*]*?)? \*\*\*")


def slurm_end_line(text: str, job_id: str, since: float | None = None) -> str:
    """slurmstepd's last word on how Slurm ended a run of job ``job_id`` in ``text`` (the
    tail of the job's stderr): the ``*** JOB ... CANCELLED AT ... ***`` line, "" if none;
    with ``since`` (Unix seconds: when the run began), none of an earlier run. A preemption
    in requeue mode shows in squeue and scontrol exactly as a ``scontrol requeue`` does
    (PENDING, BeginTime, one more restart); only this line tells them apart where there is
    no accounting (``sacct``)."""
    for m in reversed(list(_STEPD_END.finditer(text or ""))):
        if m.group(1) != str(job_id):
            continue
        if since is not None:
            try:    # slurmstepd's local time, to the second
                at = time.mktime(time.strptime(m.group(2), "%Y-%m-%dT%H:%M:%S"))
            except (ValueError, OverflowError):
                continue
            if at < since - 1:
                return ""       # the last end told is of a run before this one
        return m.group(0)
    return ""


@dataclasses.dataclass(frozen=True)
class JobEvent:
    """Something that happened to the job as a whole. ``kind``: one of ``EVENT_KINDS``;
    ``job_id``: the Slurm job; ``reason``: what Slurm said (state, reason, restart
    count); ``time``: when the client learned it (Unix seconds); ``restart``: which run
    of the job it is about (Slurm's restart count of the run that ended, or of the run
    that runs again)."""

    kind: str
    job_id: str
    reason: str
    time: float
    restart: int = 0
    #: Will the job run again (``job.state()`` waits for it and reconnects)?
    comes_back: bool = False

    def __str__(self) -> str:
        return f"Slurm job {self.job_id} {_WORDS.get(self.kind, self.kind)} ({self.reason})"


def classify(state: str, reason: str, restarts: int | None, known_restart: int,
             ended: str = "", preempted_at: str | None = None) -> tuple[str | None, bool]:
    """What Slurm's view of a job (``state``, ``reason``, ``restarts``; ``state`` "" when
    Slurm no longer knows the job; ``ended``: slurmstepd's line on the end of a run,
    :func:`slurm_end_line`; ``preempted_at``: ``scontrol``'s PreemptTime of run
    ``known_restart``, set while it ran on for a GraceTime) says happened to that run:
    ``(kind, final)``. ``kind`` None: that run goes on (or waits to start). ``final`` False: the job is being
    wound up (COMPLETING) and its last word is still to come (``kind`` is then the best
    guess so far, ``ENDED`` unless the reason says more)."""
    reason_l = (reason or "").lower()
    ended_u = (ended or "").upper()
    preempted = "preempt" in reason_l or "DUE TO PREEMPTION" in ended_u or bool(preempted_at)
    if restarts is not None and restarts > known_restart:
        return (PREEMPTED if preempted else REQUEUED), True
    if state in _GOES_ON:
        return None, True
    if state == "COMPLETING":
        if "timelimit" in reason_l or "time limit" in reason_l or "DUE TO TIME LIMIT" in ended_u:
            return TIME_LIMIT, True
        if preempted:
            return PREEMPTED, True
        return ENDED, False
    if state == "PREEMPTED":
        return PREEMPTED, True
    if state in ("TIMEOUT", "DEADLINE"):
        return TIME_LIMIT, True
    if state == "CANCELLED":
        return CANCELLED, True
    if state in _REQUEUE_STATES:
        return None, True       # run ``known_restart`` waits in the queue to start
    return ENDED, True


def runs_again(state: str, restarts: int | None, known_restart: int) -> bool:
    """Will a job Slurm shows so run again (requeued, on its way back into the queue)?"""
    return (restarts is not None and restarts > known_restart) or state in _REQUEUE_STATES


class JobEvents:
    """The job events of one client's job: told once each (by kind and run) to every
    callback of ``watch``, to the log and to telemetry. Not pickled with the job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[JobEvent], None]] = []
        self._told: set[tuple] = set()
        self.history: list[JobEvent] = []

    def watch(self, callback: Callable[[JobEvent], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for each event from now on; returns the undo."""
        if not callable(callback):
            raise TypeError(f"watch_events needs a callable, got {type(callback).__name__}")
        with self._lock:
            self._callbacks.append(callback)

        def unwatch() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)
        return unwatch

    def was_told(self, job_id: str, restart: int) -> bool:
        """Was an end of run ``restart`` of ``job_id`` told already?"""
        with self._lock:
            return (job_id, restart, "end") in self._told

    def tell(self, event: JobEvent) -> bool:
        """Hand ``event`` out unless an event of the same run and family (its end, or its
        running again) was; whether it was handed out. Callbacks run on the calling thread,
        one at a time; one that raises is logged and the others still run."""
        family = "again" if event.kind == RUNNING_AGAIN else "end"
        with self._lock:
            key = (event.job_id, event.restart, family)
            if key in self._told:
                return False
            self._told.add(key)
            self.history.append(event)
            callbacks = list(self._callbacks)
        (log.info if event.kind == RUNNING_AGAIN else log.warning)("%s", event)
        tel = telemetry_recorder.RECORDER
        if tel is not None:
            tel.job_event(event.kind, event.job_id, event.restart, event.reason,
                          int(event.time * 1e6))
        for cb in callbacks:
            try:
                cb(event)
            except Exception:  # noqa: BLE001 - one watcher's bug must not hide it from others
                log.exception("job event callback %r failed on %s", cb, event)
        return True
