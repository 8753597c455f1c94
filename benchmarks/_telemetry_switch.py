"""Telemetry on and off inside one run, for benchmarks that compare the two in alternating
blocks (``bench_hpcmesh.py --telemetry``, ``bench_telemetry_paired.py``).

Two runs of a benchmark, one with telemetry and one without, land in different phases of
this VM, whose speed drifts by a third over seconds to minutes: their ratio moves by ±0.3.
Switching inside one run puts the blocks of both side by side in time. "Off" here is what
a job without telemetry runs: no recorder on any call's path (``RECORDER`` None, no
transport hook) and no collection (``Collector.pause()``: a collection due meanwhile is
skipped, so collections land in the "on" blocks at their usual pace, once a second). A
switched-off recorder is kept, rows and all, and comes back when switched on: the
collector drains it as usual.
"""

from __future__ import annotations

from hpcmesh.actor import Actor, endpoint
try:    # its home since runtime/observe/ (issue 29); older trees (A/B runs) had it in runtime/
    from hpcmesh.runtime.observe import telemetry_recorder as T
except ImportError:
    from hpcmesh.runtime import telemetry_recorder as T
from hpcmesh.transport import connection


def switch_recording(on: bool, kept: T.Recorder | None) -> T.Recorder | None:
    """This process records each call from now on, or not; returns the recorder to keep
    while off (``kept``: the one kept so far, which comes back, rows and all)."""
    if on:
        if T.RECORDER is None:
            if kept is not None:
                try:
                    T.resume(kept)
                except AttributeError:      # a tree before resume() (an A/B run)
                    T.RECORDER = kept
                    connection.WRITE_HOOK = T._stamp_sent
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
