"""Telemetry on and off inside one run, for benchmarks that compare the two in alternating
blocks (``bench_hpcmesh.py --telemetry``, ``bench_telemetry_paired.py``).

Two runs of a benchmark, one with telemetry and one without, land in different phases of
this VM, whose speed drifts by a third over seconds to minutes: their ratio moves by ±0.3.
Switching inside one run puts the blocks of both side by side in time. "Off" here is what
a job without telemetry runs: no recorder on any call's path (``RECORDER`` None, no
transport hook) and no collection (the collector held). A switched-off recorder is kept,
rows and all, and comes back when switched on: the collector drains it as usual.
"""

from __future__ import annotations

import threading

from hpcmesh.actor import Actor, endpoint
from hpcmesh.runtime import telemetry_recorder as T
from hpcmesh.transport import connection


def switch_recording(on: bool, kept: T.Recorder | None) -> T.Recorder | None:
    """This process records each call from now on, or not; returns the recorder to keep
    while off (``kept``: the one kept so far, which comes back, rows and all)."""
    if on:
        if T.RECORDER is None:
            if kept is not None:
                T.RECORDER = kept
                connection.WRITE_HOOK = T._stamp_sent   # what enable() sets beside it
            else:
                T.enable()
        return None
    if T.RECORDER is not None:
        kept = T.RECORDER
    T.disable()
    return kept


class RecordingSwitch(Actor):
    """A base for a benchmark's actor: ``record(on)`` switches its process's recording
    (a base in a module of its own: it travels by value with the actor class)."""

    @endpoint
    async def record(self, on: bool) -> bool:
        self._kept_recorder = switch_recording(on, getattr(self, "_kept_recorder", None))
        return T.RECORDER is not None

    @endpoint
    async def recording(self) -> bool:
        return T.RECORDER is not None


class CollectorHold:
    """Holds the controller's collector between collections (its lock, which a collection
    takes first), so that nothing is drained while telemetry is "off". A drain would also
    switch a process's recording back on (the first drain does). The collection it was
    due meanwhile runs when let go: at the start of the next "on" block, so an "on" block
    gets a little more than its share of collections (the comparison errs against
    telemetry). Not held: the stack snapshot, save and prune the collector runs after a
    collection (every 30 s and each second, outside the lock), which can overlap the start
    of an off block."""

    def __init__(self, collector) -> None:
        self._lock: threading.Lock = collector._lock
        self.held = False

    def hold(self) -> None:
        if not self.held:
            self._lock.acquire()
            self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._lock.release()
