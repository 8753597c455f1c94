"""Stragglers and hangs, named (SPEC §12): the controller's watch over its call()s.

A call() to 256 actors where 255 answered and one is stuck in a collective would wait
silently; the controller is the one place that sees every member without a collective.
So every ``call()``/``stream()`` the controller makes is noted here (``watch``: a clock
read and a dict entry, on the caller's thread, taken out again by ``ended`` when the
call's result is made; no timer, no callback per call), and one
controller-wide timer on the runtime loop (every ``HPCMESH_STRAGGLER_TICK_S``) looks at
the calls still outstanding:

* some members answered and the others have not after ``max(factor x the median answer
  time, HPCMESH_STRAGGLER_AFTER_S)``: the laggards are **stragglers**;
* no member answered after ``HPCMESH_HANG_AFTER_S``: the call **hangs**.

Either is reported once per call (and once per actor mesh while that call is
outstanding: pipelined calls stuck behind the same member say nothing new), with each
laggard's point, host, pid, how long it has waited and its stacks, **grouped by identical
stack** (``60 members: wait at train.py:57 (in step)``): a log warning, a row per laggard
in the ``stragglers`` telemetry table (the dashboard rings the late processes on its
hosts x gpus grid from it), and ``WATCH.reports`` (the admin tree). The stacks come as the admin view gets them: the process's event loop
(``admin_stacks``), else ``py-spy dump`` or faulthandler through its host agent.

Calls to one member (``call_one``, ``choose``) are not noted at all: their hot path stays
as it was. The same timer finds them where they already are, in the node's reply table
(``PortTable.replies``: a reply port per call in flight, its actor id and endpoint). Port
ids grow with time, so one id taken every so often (a *mark*) dates every port made
before it; the look walks the table from its oldest entry and stops at the first one
younger than ``HPCMESH_HANG_AFTER_S`` (one member, nothing answered: the threshold
of a hang, as for a call() of one member). Endpoint calls older than that which no
watched call() or stream() covers are named as a hang, the same way, once, grouped per
actor mesh (``Report.call``: ``"call_one"``): call_one's, choose()'s, and the members a
call() that failed left waiting (nobody waits on them any more: stuck all the same).

A call that finishes costs nothing more. Answer times are exact for members that answer
after the first tick that saw their call at least a tick old (a done callback is added then, to
slow calls only); those that answered before count as answering then, an upper bound, so
the relative threshold never fires early.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import os
import re
import statistics
import sysconfig
import time
from dataclasses import dataclass, field
from typing import Any

from ...settings import env_flag, env_number
from . import telemetry_recorder as _tel
from .introspect import PYSPY_TIMEOUT_S

log = logging.getLogger("hpcmesh.stragglers")

#: The controller's watch (None: off, or not a controller). ``Endpoint.call`` reads it.
WATCH: "StragglerWatch | None" = None

#: Reports kept for the admin tree (the telemetry table keeps them all).
REPORTS_KEPT = 32
#: Members listed by name under a group in the log warning (the rest are counted).
MEMBERS_SHOWN = 8
#: How long one process gets to give its stacks through its event loop (s).
LOOP_STACKS_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Settings:
    """What counts as late (``HPCMESH_STRAGGLER_*``, ``HPCMESH_HANG_AFTER_S``)."""
    enabled: bool = True
    factor: float = 3.0          # x the median answer time of the members that answered
    after_s: float = 30.0        # and at least this long
    hang_s: float = 120.0        # no member answered for this long
    tick_s: float = 0.5          # how often outstanding calls are looked at

    @classmethod
    def from_env(cls, env=None) -> "Settings":
        return cls(
            enabled=env_flag("HPCMESH_STRAGGLERS", True, env=env),
            factor=env_number("HPCMESH_STRAGGLER_FACTOR", 3, unit="times the median answer "
                              "time", minimum=1, finite=True, env=env),
            after_s=env_number("HPCMESH_STRAGGLER_AFTER_S", 30, finite=True, positive=True,
                               env=env),
            hang_s=env_number("HPCMESH_HANG_AFTER_S", 120, positive=True,
                              note="inf: never, for endpoints long on purpose", env=env),
            tick_s=env_number("HPCMESH_STRAGGLER_TICK_S", 0.5, minimum=0.01, maximum=60,
                              env=env))


# -- stacks: parsed from the three sources, grouped ----------------------------------------
@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str
    text: str = ""       # the source line, where the source gave it

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"


@dataclass(frozen=True)
class ThreadStack:
    name: str
    frames: tuple[Frame, ...]        # innermost last


_TRACEBACK = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_FAULTHANDLER = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+)$')
_PYSPY_THREAD = re.compile(r'^Thread (?P<id>\S+) \((?P<state>[^)]*)\)(?:: "(?P<name>.*)")?')
_PYSPY_FRAME = re.compile(r'^\s+(?P<func>.+) \((?P<file>.+):(?P<line>\d+)\)$')


def parse_traceback(text: str) -> tuple[Frame, ...]:
    """Frames of ``traceback.format_stack`` text (``admin_stacks``), innermost last."""
    frames: list[Frame] = []
    for line in text.splitlines():
        m = _TRACEBACK.match(line)
        if m:
            frames.append(Frame(m["file"], int(m["line"]), m["func"]))
        elif frames and line.startswith("    ") and not frames[-1].text:
            f = frames[-1]
            frames[-1] = Frame(f.file, f.line, f.func, line.strip())
    return tuple(frames)


def parse_dump(text: str) -> list[ThreadStack]:
    """Threads of a ``py-spy dump`` or of a faulthandler dump (both innermost first),
    innermost last like the others."""
    threads: list[ThreadStack] = []
    name, frames = None, []

    def close():
        if name is not None:
            threads.append(ThreadStack(name, tuple(reversed(frames))))
    for line in text.splitlines():
        if m := _PYSPY_THREAD.match(line):
            close()
            name, frames = m["name"] or f"thread {m['id']}", []
        elif line.startswith(("Thread 0x", "Current thread 0x")):
            close()
            name, frames = line.split(" (", 1)[0], []
        elif name is not None and ((m := _PYSPY_FRAME.match(line)) or
                                   (m := _FAULTHANDLER.match(line))):
            frames.append(Frame(m["file"], int(m["line"]), m["func"].strip()))
    close()
    return threads


_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])


def is_runtime_frame(f: Frame) -> bool:
    """hpcmesh's own code or the standard library: not where a user looks for their bug.
    Paths may be whole (the event loop, faulthandler) or short (py-spy: ``threading.py``,
    ``hpcmesh/runtime/actor_host.py``)."""
    return _runtime_path(f.file)


@functools.lru_cache(maxsize=4096)
def _runtime_path(path: str) -> bool:
    """(A report of 1,024 members asks about the same few dozen files some 100,000 times:
    each answer is a few file-system calls, once.)"""
    if path.startswith("<"):      # <frozen os> is Python's; <dynamic-code>, <string>: the user's
        return path.startswith("<frozen")
    if "site-packages" in path or "dist-packages" in path:
        return False
    if os.path.isabs(path):
        real = os.path.realpath(path)
        return real.startswith(_PACKAGE + os.sep) or real.startswith(_STDLIB + os.sep)
    if path.startswith("hpcmesh/") and os.path.exists(os.path.join(
            os.path.dirname(_PACKAGE), path)):
        return True
    return os.path.exists(os.path.join(_STDLIB, path))


def user_part(t: ThreadStack) -> tuple[Frame, ...]:
    """A thread's frames from its outermost frame of user code inward (() if it has none):
    what makes two stacks the same, whatever ran the code (actor thread, event loop) and
    whichever source read it."""
    for i, f in enumerate(t.frames):
        if not is_runtime_frame(f):
            return t.frames[i:]
    return ()


def headline(frames: tuple[Frame, ...]) -> str:
    """``wait at train.py:57 (in step)``: what the innermost frame of user code calls,
    and where; the innermost frame when there is no user code."""
    if not frames:
        return "(no stack)"
    user = [i for i, f in enumerate(frames) if not is_runtime_frame(f)]
    i = user[-1] if user else len(frames) - 1
    f = frames[i]
    if i + 1 < len(frames):
        return f"{frames[i + 1].func} at {f.where} (in {f.func})"
    return f"{f.func} at {f.where}"


def stack_key(threads: list[ThreadStack]) -> tuple:
    """The part of a process's stacks two laggards must share to be one group: the user
    part of each thread that runs user code (file's base name, line, function); all
    threads when none does."""
    parts = [user_part(t) for t in threads]
    chosen = [p for p in parts if p] or [t.frames for t in threads]
    return tuple(sorted(tuple((os.path.basename(f.file), f.line, f.func) for f in p)
                        for p in chosen))


def format_threads(threads: list[ThreadStack]) -> str:
    """The threads that run user code (all when none does), innermost frame last."""
    chosen = [t for t in threads if user_part(t)] or threads
    out = []
    for t in chosen:
        out.append(f"Thread {t.name}:")
        for f in t.frames:
            out.append(f"  File \"{f.file}\", line {f.line}, in {f.func}")
            if f.text:
                out.append(f"    {f.text}")
    return "\n".join(out)


@dataclass
class Laggard:
    """One member that has not answered."""
    rank: int                 # in the view called
    point: str                # its process's point (``hosts=0,gpus=3``)
    process: str
    host: str
    pid: int | None
    waited_s: float
    source: str = ""          # event loop, py-spy or faulthandler
    threads: list[ThreadStack] = field(default_factory=list)
    error: str | None = None  # why there are no stacks


@dataclass
class Group:
    headline: str
    stack: str
    members: list[Laggard]


def group_by_stack(laggards: list[Laggard]) -> list[Group]:
    """Laggards with the same stack (``stack_key``) as one group, the biggest first; those
    whose stacks could not be read, one group per reason."""
    groups: dict[tuple, Group] = {}
    for lg in laggards:
        if lg.error is not None or not lg.threads:
            key = ("no stacks", lg.error)
            if key not in groups:
                groups[key] = Group(f"no stacks: {lg.error or 'none given'}", "", [])
        else:
            key = stack_key(lg.threads)
            if key not in groups:
                chosen = [t for t in lg.threads if user_part(t)] or lg.threads
                groups[key] = Group(headline(chosen[0].frames), format_threads(lg.threads), [])
        groups[key].members.append(lg)
    return sorted(groups.values(), key=lambda g: (-len(g.members), g.headline))


# -- the report ------------------------------------------------------------------------------
_report_ids = itertools.count(1)


@dataclass
class Report:
    """One call's stragglers (``kind="straggler"``) or hang (``"hang"``)."""
    kind: str
    mesh: str
    actor_mesh_id: str
    class_name: str
    endpoint: str
    members: int
    answered: int
    median_s: float | None
    threshold_s: float
    waited_s: float
    groups: list[Group]
    timestamp_us: int = field(default_factory=_tel.now_us)
    id: int = field(default_factory=lambda: next(_report_ids))
    #: seconds after the call when its last laggard answered (None: not yet)
    finished_after_s: float | None = None
    #: ``"call"`` (a call() or stream()), or ``"call_one"``: calls to one member each
    #: (call_one, choose), found in the reply table
    call: str = "call"

    def text(self) -> str:
        late = sum(len(g.members) for g in self.groups)
        call = f"call {self.class_name}.{self.endpoint} to actor mesh {self.mesh!r}"
        if self.call == "call_one":
            calls, have = ("a call", "has") if late == 1 else (f"{late} calls", "have")
            head = (f"{calls} {self.class_name}.{self.endpoint} to actor mesh {self.mesh!r} "
                    f"outside any call() still waited on (call_one, choose, or left by a "
                    f"call() that failed) {have} had no answer after {self.waited_s:.1f} s "
                    f"(HPCMESH_HANG_AFTER_S={self.threshold_s:g}; an endpoint long on "
                    f"purpose: raise it, inf for never)")
        elif self.kind == "hang":
            head = (f"{call}: none of its {self.members} members has answered after "
                    f"{self.waited_s:.1f} s (HPCMESH_HANG_AFTER_S={self.threshold_s:g}; an "
                    f"endpoint long on purpose: raise it, inf for never)")
        else:
            head = (f"{call}: {late} of its {self.members} members have not answered after "
                    f"{self.waited_s:.1f} s ({self.answered} answered, median "
                    f"{self.median_s:.3g} s; threshold {self.threshold_s:.3g} s)")
        lines = [head + "; their stacks, grouped:"]
        for g in self.groups:
            n = len(g.members)
            lines.append(f"  {n} member{'s' if n != 1 else ''}: {g.headline}")
            for lg in g.members[:MEMBERS_SHOWN]:
                source = f", {lg.source}" if lg.source else ""
                lines.append(f"    {lg.point} (process {lg.process}, host {lg.host}, pid "
                             f"{lg.pid}, {lg.waited_s:.1f} s{source})")
            if n > MEMBERS_SHOWN:
                lines.append(f"    ... and {n - MEMBERS_SHOWN} more")
            lines += ["      " + s for s in g.stack.splitlines()]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.kind, "timestamp_us": self.timestamp_us,
                "mesh": self.mesh, "actor_mesh_id": self.actor_mesh_id,
                "class": self.class_name, "endpoint": self.endpoint, "members": self.members,
                "answered": self.answered, "median_s": self.median_s,
                "threshold_s": self.threshold_s, "waited_s": self.waited_s,
                "finished_after_s": self.finished_after_s, "call": self.call,
                "groups": [{"count": len(g.members), "headline": g.headline, "stack": g.stack,
                            "members": [{"rank": m.rank, "point": m.point,
                                         "process": m.process, "host": m.host, "pid": m.pid,
                                         "waited_s": m.waited_s, "source": m.source,
                                         "error": m.error} for m in g.members]}
                           for g in self.groups]}

    def finished_row(self) -> tuple:
        """The row that says its call finished (``kind="finished"``, ``waited_s``: when)."""
        return (_tel.now_us(), self.id, "finished", self.actor_mesh_id, self.mesh,
                self.endpoint, None, None, None, None, self.finished_after_s, None, None,
                None, None, None)

    def rows(self) -> list[tuple]:
        """Its ``stragglers`` telemetry rows, one per laggard (``telemetry/schema.py``)."""
        out = []
        for i, g in enumerate(self.groups):
            for m in g.members:
                out.append((self.timestamp_us, self.id, self.kind, self.actor_mesh_id,
                            self.mesh, self.endpoint, m.point, m.process, m.host, m.pid,
                            m.waited_s, i, len(g.members), g.headline, g.stack, m.source))
        return out


# -- the watch ------------------------------------------------------------------------------
def _settled(futs: list) -> bool:
    """Has the call of these member Futures ended: all answered, or one failed (its
    gather fails with it)?"""
    for f in futs:
        if f.done():
            if f.exception() is not None:
                return True
        else:
            return False
    return True


class _Watched:
    """One outstanding call at least a tick old: the ticks look at it."""
    __slots__ = ("key", "t0", "futs", "targets", "st", "endpoint", "answered", "report")

    def __init__(self, key, t0, futs, targets, st, endpoint):
        self.key = key
        self.t0 = t0
        self.futs = futs
        self.targets = targets          # [(rank in the view, NodeRef)], as futs
        self.st = st                    # the actor mesh's state (name, actor_id, ...)
        self.endpoint = endpoint
        self.answered: list[float | None] | None = None    # seconds, per member
        self.report: Report | None = None


@dataclass(frozen=True)
class _UnknownMesh:
    """A mesh called by its actor id that this controller does not track (one it was
    sent): what a report says of it."""
    actor_id: str

    @property
    def name(self) -> str:
        return f"(actor mesh {self.actor_id[:8]})"

    class_name = "?"


class StragglerWatch:
    """The controller's one timer over its outstanding calls (see the module's doc)."""

    def __init__(self, runtime: Any, settings: Settings):
        self.runtime = runtime          # the ClientRuntime: its node and process records
        self.node = runtime.node
        self.settings = settings
        #: key -> (t0, member Futures, targets, mesh state, endpoint): every call not yet
        #: known to have ended (a dict: any thread adds, a call's end takes its own out)
        self.live: dict[int, tuple] = {}
        self._keys = itertools.count()
        self.slow: dict[int, _Watched] = {}     # those at least a tick old
        self.reports: collections.deque[Report] = collections.deque(maxlen=REPORTS_KEPT)
        self.busy: dict[str, _Watched] = {}     # actor mesh id -> its reported call
        self.closed = False
        self._timer = None
        self._tasks: set = set()
        # calls to one member, read from the reply table (see the module's doc)
        self._ports = self.node.ports
        #: (time, a port id taken then): every port id below it was made before that time
        self._marks: collections.deque[tuple[float, int]] = collections.deque()
        #: a mark at most this often: ~64 marks span the hang threshold, whatever it is
        self._mark_every = max(settings.tick_s, settings.hang_s / 64)
        #: reply ports of single calls named already, or not ours to name
        self._named: set[int] = set()
        self.node.call_soon(self._arm)

    # -- any thread ------------------------------------------------------------------
    def watch(self, futs: list, targets: list, st: Any, endpoint: str) -> int:
        """A call() just sent to ``targets`` (``[(rank, NodeRef)]``), its member Futures
        ``futs``; its key, for ``ended`` when its result is made.

        Finished calls must leave at once, not at the next tick: a second of finished
        calls (their Futures and results) held until then made the garbage collector
        promote and traverse them, which cost a pipelined call() ~10 % of its CPU
        (``benchmarks/bench_stragglers.py``)."""
        key = next(self._keys)
        self.live[key] = (time.monotonic(), futs, targets, st, endpoint)
        return key

    def ended(self, key: int, value: Any) -> Any:
        """The call of ``key`` has its result ``value`` (returned): it is no longer
        watched. (A call that failed leaves at the next tick.)"""
        self.live.pop(key, None)
        return value

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self.node.loop.call_soon_threadsafe(self._timer.cancel)

    # -- the loop's thread -------------------------------------------------------------
    def _arm(self) -> None:
        if not self.closed:
            self._timer = self.node.loop.call_later(self.settings.tick_s, self._tick)

    def _tick(self) -> None:
        try:
            self.check(time.monotonic())
        except Exception:  # noqa: BLE001 - a bug here must not stop the watch
            log.exception("straggler check failed")
        self._arm()

    def check(self, now: float) -> None:
        """One look at every outstanding call (the timer's; a test may call it on the
        loop's thread)."""
        live, slow, tick = self.live, self.slow, self.settings.tick_s
        for key, e in list(live.items()):
            if key in slow or now - e[0] < tick:     # not slow yet: a burst in flight
                continue
            if _settled(e[1]):                      # failed, or a stream's: ended
                live.pop(key, None)
                continue
            slow[key] = _Watched(key, *e)
        for key, w in list(slow.items()):
            if key not in live or _settled(w.futs):
                live.pop(key, None)
                del slow[key]
                self._finished(w, now)
            elif w.report is None:
                self._look(w, now)
        if self.settings.hang_s != float("inf"):
            self._look_at_single_calls(now)

    def _look_at_single_calls(self, now: float) -> None:
        """Name the endpoint calls in the reply table older than the hang threshold that
        no watched call covers: call_one's and choose()'s (module doc). Costs the calls
        nothing; a look walks only the table's entries older than the threshold."""
        marks, hang_s = self._marks, self.settings.hang_s
        if not marks or now - marks[-1][0] >= self._mark_every:
            marks.append((now, next(self._ports.ids)))
        while len(marks) > 1 and now - marks[1][0] >= hang_s:
            marks.popleft()
        cut_t, cut = marks[0]
        if now - cut_t < hang_s:
            return
        replies = self._ports.replies
        named = self._named
        if named:       # forget the answered ones
            named = self._named = {pid for pid in named if pid in replies}
        found = []
        try:
            # in the order the ports were made (port ids grow): the old ones come first
            for pid, entry in replies.items():
                if pid >= cut:
                    break
                if entry[2] is not None and pid not in named:
                    found.append((pid, entry))
        except RuntimeError:    # another thread's call changed the table: the next look
            return
        if found:
            self._name_single_calls(found, now - cut_t, now)

    def _name_single_calls(self, found: list, waited: float, now: float) -> None:
        """``found``: (port id, reply entry) of endpoint calls older than the threshold
        (``waited``: at least this old). Those of a watched call() or stream() are its
        to name; the rest, per actor mesh not already reported, one report: a laggard per
        process (its oldest call; those behind it say nothing new)."""
        covered = {(e[3].actor_id, t.node_id) for e in list(self.live.values())
                   for _, t in e[2]}
        busy = self.busy
        left = []
        for pid, (sink, peer, actor_id, endpoint) in found:
            ref = peer.ref if peer is not None else None
            if ref is None:
                self._named.add(pid)        # no process to name
            elif (actor_id, ref.node_id) not in covered and actor_id not in busy:
                left.append((pid, sink, ref, actor_id, endpoint))
            # else a watched call's, or behind a reported one: theirs to say
        if not left:
            return
        by_node = {rec.node.node_id: rec for rec in list(self.runtime.procs.values())
                   if rec.node is not None}
        per_mesh: dict[str, dict[str, tuple]] = {}
        for pid, sink, ref, actor_id, endpoint in left:
            if ref.node_id not in by_node:
                self._named.add(pid)        # not a process this controller started
                continue
            per_mesh.setdefault(actor_id, {}).setdefault(ref.node_id,
                                                         (pid, sink, ref, endpoint))
        meshes = {m.actor_id: m for m in self.runtime.actor_meshes()}
        for actor_id, calls in per_mesh.items():
            st = meshes.get(actor_id) or _UnknownMesh(actor_id)
            names = list(getattr(st, "proc_names", ()) or ())
            pids = [c[0] for c in calls.values()]
            futs = [c[1] for c in calls.values()]
            targets = []
            for _, _, ref, _ in calls.values():
                name = by_node[ref.node_id].name
                targets.append((names.index(name) if name in names else 0, ref))
            endpoint = ", ".join(sorted({c[3] for c in calls.values()}))
            self._named.update(pids)
            key = next(self._keys)
            w = _Watched(key, now - waited, futs, targets, st, endpoint)
            self.live[key] = (w.t0, futs, targets, st, endpoint)   # until they answer
            self.slow[key] = w
            self.busy[actor_id] = w
            w.report = Report("hang", st.name, actor_id, st.class_name, endpoint, len(futs),
                              0, None, self.settings.hang_s, waited, [], call="call_one")
            self._tell(w, list(range(len(futs))), waited)

    def _finished(self, w: _Watched, now: float) -> None:
        if w.report is not None:
            w.report.finished_after_s = now - w.t0
            if (rec := _tel.RECORDER) is not None:
                rec.add("stragglers", w.report.finished_row())
            if self.busy.get(w.st.actor_id) is w:
                del self.busy[w.st.actor_id]
            log.info("the %s of call %s.%s to %r finished after %.1f s", w.report.kind,
                     w.st.class_name, w.endpoint, w.st.name, now - w.t0)

    def _look(self, w: _Watched, now: float) -> None:
        futs = w.futs
        if w.answered is None:      # first look: slow calls only get callbacks
            age = now - w.t0
            w.answered = [age if f.done() else None for f in futs]
            for i, f in enumerate(futs):
                if not f.done():
                    f.add_done_callback(self._answered_cb(w, i))
        pending = [i for i, f in enumerate(futs) if not f.done()]
        if not pending:
            return
        age = now - w.t0
        times = [a for a in w.answered if a is not None]
        s = self.settings
        if times:
            median = statistics.median(times)
            threshold = max(s.factor * median, s.after_s)
            kind = "straggler"
        else:
            median, threshold, kind = None, s.hang_s, "hang"
        if age < threshold or w.st.actor_id in self.busy:
            return
        self.busy[w.st.actor_id] = w
        w.report = Report(kind, w.st.name, w.st.actor_id, w.st.class_name, w.endpoint,
                          len(futs), len(futs) - len(pending), median, threshold, age, [])
        self._tell(w, pending, age)

    def _tell(self, w: _Watched, pending: list[int], age: float) -> None:
        """Read the stacks of ``w``'s members ``pending`` and tell its report (a task)."""
        task = self.node.loop.create_task(self._report(w, w.report, pending, age))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    def _answered_cb(w: _Watched, i: int):
        def answered(_f) -> None:
            w.answered[i] = time.monotonic() - w.t0
        return answered

    async def _report(self, w: _Watched, report: Report, pending: list[int],
                      age: float) -> None:
        """Read the laggards' stacks, group them, tell."""
        by_node = {rec.node.node_id: rec for rec in list(self.runtime.procs.values())
                   if rec.node is not None}
        laggards = []
        for i in pending:
            rank, target = w.targets[i]
            rec = by_node.get(target.node_id)
            laggards.append((Laggard(rank, getattr(rec, "label", None) or f"rank {rank}",
                                     getattr(rec, "name", target.node_id),
                                     getattr(rec, "host", "?"), getattr(rec, "pid", None),
                                     age), rec))
        await asyncio.gather(*(self._stacks(lg, rec) for lg, rec in laggards))
        report.groups = group_by_stack([lg for lg, _ in laggards])
        self.reports.append(report)
        log.warning("%s", report.text())
        if (rec := _tel.RECORDER) is not None:
            for row in report.rows():
                rec.add("stragglers", row)

    async def _stacks(self, lg: Laggard, rec: Any) -> None:
        """``lg``'s stacks: from its event loop, else py-spy, else faulthandler (through
        its host agent), as the admin view reads them."""
        if rec is None or rec.node is None:
            lg.error = "not a process this controller started"
            return
        errors = []
        try:
            threads = await asyncio.wait_for(
                self.node.rpc(rec.node, "admin_stacks").as_asyncio(), LOOP_STACKS_TIMEOUT_S)
            lg.threads = [ThreadStack(t["thread"], parse_traceback(t["stack"]))
                          for t in threads]
            lg.source = "event loop"
            return
        except Exception as e:  # noqa: BLE001 - the next source
            errors.append(f"event loop: {type(e).__name__}: {e}".rstrip(": "))
        for tool in ("py-spy", "faulthandler"):
            try:
                text = await asyncio.wait_for(
                    self.node.rpc(rec.agent, "dump_stacks", rec.name, tool, False).as_asyncio(),
                    PYSPY_TIMEOUT_S + 4)
                lg.threads = parse_dump(text)
                lg.source = tool
                return
            except Exception as e:  # noqa: BLE001 - the next source, or the error says why
                errors.append(f"{tool}: {type(e).__name__}: {e}".rstrip(": "))
        lg.error = "; ".join(errors)


def start(runtime: Any, settings: Settings | None = None) -> StragglerWatch | None:
    """Watch this controller's calls (``HPCMESH_STRAGGLERS=0``: not); the watch."""
    global WATCH
    settings = settings or Settings.from_env()
    stop()
    if settings.enabled:
        WATCH = StragglerWatch(runtime, settings)
    return WATCH


def stop() -> None:
    global WATCH
    w, WATCH = WATCH, None
    if w is not None:
        w.close()


def _forget_in_child() -> None:
    global WATCH
    WATCH = None


if hasattr(os, "register_at_fork"):      # a forked child is no controller
    os.register_at_fork(after_in_child=_forget_in_child)
