"""Whether the kernel's OOM killer ended a process (SPEC §12: out of memory is a class of
its own), told apart from a plain ``kill -9``, which looks the same to its parent.

The kernel counts each OOM kill in the victim's memory cgroup (cgroup v2:
``memory.events``, ``oom_kill N``; v1: ``memory.oom_control``, ``oom_kill N``), and it counts
it *before* it sends the SIGKILL, so once the parent sees the death the count is there. A
host agent reads the count of each process's cgroup when it starts it; a process that then
dies of SIGKILL while the count went up was the OOM killer's (a cgroup limit, Slurm's
``ConstrainRAMSpace``, or the whole node out of memory). Each kill counted is given to one
death only, and only while it is fresh (``AGE_S``): a cgroup shared with other programs (a
login node's session) may count a kill of one of them that nobody here claims, which must
not explain a kill -9 an hour later. A process that moves itself to another cgroup after it
started is not followed.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("hpcmesh.agent")

#: Return codes of a death by SIGKILL: killed itself (Popen's ``-9``), or a shell that ran it
#: without ``exec`` and passed the signal on as its exit status (128 + 9).
KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)
#: ``OomWatch.age`` runs this often: a kill counted before its last run is too old to
#: explain a death (the kernel counts a kill just before the SIGKILL, and the death is seen
#: within milliseconds of it), one counted since then is fresh.
AGE_S = 5.0


#: Added to an actor process's ``oom_score_adj`` when it starts (``offer_to_oom_killer``).
OOM_SCORE_BIAS = 300


def offer_to_oom_killer(bias: int = OOM_SCORE_BIAS, path: str = "/proc/self/oom_score_adj") -> int | None:
    """Make this actor process the kernel's choice before its host agent when their memory
    cgroup (a Slurm step's) runs out: the agent must live to say which process the OOM
    killer ended; a dead agent reads as a lost host and hides the cause. Raising one's own
    score needs no privilege. The new value, or None where the kernel has none to give."""
    try:
        with open(path) as f:
            value = min(1000, int(f.read()) + bias)
        with open(path, "w") as f:
            f.write(str(value))
        return value
    except (OSError, ValueError):
        return None


def memory_cgroup_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, str, str]]:
    """(kind, root, mount point) of the cgroup mounts: kind ``v2``, or ``v1`` for a v1
    hierarchy with the memory controller."""
    out = []
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        pre, sep, post = line.partition(" - ")
        fields, rest = pre.split(), post.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        if rest[0] == "cgroup2":
            out.append(("v2", fields[3], fields[4]))
        elif rest[0] == "cgroup" and "memory" in rest[2].split(","):
            out.append(("v1", fields[3], fields[4]))
    return out


def counter_file(pid: int, mounts: list[tuple[str, str, str]]) -> str | None:
    """The file that counts the OOM kills in ``pid``'s memory cgroup (None: no memory
    cgroup is to be seen here)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    paths = {}
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            paths["v2"] = path
        elif "memory" in controllers.split(","):
            paths["v1"] = path
    for kind, name in (("v2", "memory.events"), ("v1", "memory.oom_control")):
        path = paths.get(kind)
        if path is None:
            continue
        for mkind, root, point in mounts:
            if mkind != kind or not (path == root or path.startswith(root.rstrip("/") + "/")):
                continue
            candidate = os.path.join(point, path[len(root.rstrip("/")):].lstrip("/"), name)
            if os.path.exists(candidate):
                return candidate
    return None


def oom_kills(path: str | None) -> int | None:
    """The ``oom_kill`` count in ``path`` (None: unreadable, or a kernel without it)."""
    if path is None:
        return None
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


class OomWatch:
    """One per host agent: the OOM kills of its processes' cgroups, and which were claimed."""

    def __init__(self) -> None:
        self._mounts: list | None = None
        self._claimed: dict[str, int] = {}     # counter file -> kills given to a death or old
        self._last: dict[str, int] = {}        # counter file -> its count at the last age()

    def age(self) -> None:
        """Every ``AGE_S``: the kills counted before the previous call explain no death."""
        for path, claimed in list(self._claimed.items()):
            before = self._last.get(path)
            if before is not None and before > claimed:
                self._claimed[path] = before
            now = oom_kills(path)
            if now is None:          # the cgroup is gone (its processes with it)
                del self._claimed[path]
                self._last.pop(path, None)
            else:
                self._last[path] = now

    def started(self, pid: int) -> tuple[str, int] | None:
        """Read when process ``pid`` starts: its counter file and the count then."""
        if self._mounts is None:
            self._mounts = memory_cgroup_mounts()
        path = counter_file(pid, self._mounts)
        count = oom_kills(path)
        if path is None or count is None:
            return None
        return self.track(path, count)

    def track(self, path: str, count: int) -> tuple[str, int]:
        """A process starts in the cgroup of counter file ``path``, which counts ``count``
        now: what ``ended`` takes for it."""
        self._claimed.setdefault(path, count)
        return path, count

    def ended(self, start: tuple[str, int] | None, returncode: int | None) -> str:
        """Why the OOM killer is the cause of a death with ``returncode``, for a person;
        "" when it is not (no SIGKILL, or no OOM kill since the process started that
        another death has not claimed)."""
        if start is None or returncode not in KILLED:
            return ""
        path, at_start = start
        now = oom_kills(path)
        if now is None:
            return ""
        claimed = max(self._claimed.get(path, at_start), at_start)
        if now <= claimed:
            return ""
        self._claimed[path] = claimed + 1
        where = os.path.dirname(path)
        log.info("an OOM kill in %s (oom_kill %d -> %d) explains a SIGKILL", where, claimed, now)
        return f"the kernel's OOM killer ended it, as memory cgroup {where} counted (oom_kill {now})"
