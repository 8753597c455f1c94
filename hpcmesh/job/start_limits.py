"""How long getting a queued job's host agents may take: queue wait and bring-up apart.

A job on a real cluster waits in the queue for minutes or hours, and nothing about that
wait is wrong; once it runs, its agents should attach within seconds, and a job whose
agents do not has failed. So there are two limits, as in Monarch (its issue #2159):

- ``job_start_timeout``: from submission to every agent attached (queue wait included);
  ``None``, the default, waits in the queue for as long as Slurm keeps the job pending;
- ``timeout`` (bring-up): from the moment the job is RUNNING to every agent attached.

``StartLimits`` is the pure bookkeeping of both (the caller passes the clock), so the
rules are tested without Slurm; the job classes feed it what squeue and the agents' hellos
tell them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def check_seconds(owner: str, name: str, value: object, *, none_means: str | None = None,
                  hint: str = "") -> float | None:
    """``value`` as seconds (> 0, ``math.inf`` allowed); ``None`` only where ``none_means``
    says what it stands for. Anything else is a ``TypeError``/``ValueError`` naming the
    argument and what it accepts."""
    accepts = "a positive number of seconds" + (f" or None ({none_means})" if none_means else "")
    accepts += f"; {hint}" if hint else ""
    if value is None:
        if none_means is not None:
            return None
        raise TypeError(f"{owner}({name}=None): {name} takes {accepts}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}({name}={value!r}): {name} takes {accepts}, not "
                        f"{type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or seconds <= 0:
        raise ValueError(f"{owner}({name}={value!r}): {name} takes {accepts}")
    return seconds


def check_start_limits(owner: str, bring_up_name: str, bring_up: object,
                       job_start: object) -> tuple[float, float | None]:
    """The two limits a queued job's constructor takes, checked: (bring-up seconds,
    job_start_timeout seconds or None)."""
    return (check_seconds(owner, bring_up_name, bring_up,
                          hint="it bounds the bring-up once the job runs; the queue wait is "
                               "bounded by job_start_timeout (default None: no limit)"),
            check_seconds(owner, "job_start_timeout", job_start,
                          none_means="wait in the queue for as long as Slurm keeps the job "
                                     "pending"))


@dataclass
class StartLimits:
    """The two deadlines of one start (monotonic seconds)."""

    bring_up: float                   # seconds from RUNNING to attached
    job_start: float | None           # seconds from submission to attached; None: no limit
    submitted_at: float
    running_at: float | None = None

    def mark_running(self, now: float) -> None:
        """The job was seen RUNNING (squeue, or a first agent's hello): bring-up counts."""
        if self.running_at is None:
            self.running_at = now

    def expired(self, now: float) -> str | None:
        """Which limit has passed (``"bring-up"``, ``"job_start_timeout"``), else None."""
        if self.running_at is not None and now - self.running_at >= self.bring_up:
            return "bring-up"
        if self.job_start is not None and now - self.submitted_at >= self.job_start:
            return "job_start_timeout"
        return None

    def describe(self, which: str) -> str:
        """The limit that passed, in words for an error message."""
        if which == "bring-up":
            return (f"within {self.bring_up:g} s of the job starting to run (timeout="
                    f"{self.bring_up:g}: bring-up after RUNNING)")
        return (f"within {self.job_start:g} s of submission (job_start_timeout="
                f"{self.job_start:g}: queue wait and bring-up together)")
