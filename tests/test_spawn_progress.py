"""A spawn that takes over 2 s says how far it is (``spawned 128/256 processes on 32 hosts
3.1s``), as the queue wait does; one that is quick says nothing."""

from __future__ import annotations

import asyncio
import io

import hpcmesh.actor.host_mesh as host_mesh
from hpcmesh.runtime.future import Future, gather


class Rec:
    def __init__(self):
        self.ready = Future()


def _run(monkeypatch, connect_at: list[float], end: float) -> str:
    """Records that connect at the given times (loop seconds); the progress text."""
    monkeypatch.setattr(host_mesh, "SPAWN_PROGRESS_AFTER_S", 0.2)
    out = io.StringIO()
    records = [Rec() for _ in connect_at]

    async def main():
        loop = asyncio.get_running_loop()
        ready = gather([r.ready for r in records])
        host_mesh.show_spawn_progress(loop, records, 2, ready, stream=out)
        for r, t in zip(records, connect_at):
            loop.call_later(t, r.ready.set_result, None)
        await asyncio.sleep(end)    # sleep: the spawn's time line, on the loop's clock
    asyncio.run(main())
    return out.getvalue()


def test_a_slow_spawn_says_how_far_it_is_and_how_it_ended(monkeypatch):
    text = _run(monkeypatch, [0.05, 0.1, 1.5, 1.6], 2.0)
    lines = text.splitlines()
    assert lines[0].startswith("hpcmesh: spawned 2/4 processes on 2 hosts 0.2"), text
    assert lines[-1].startswith("hpcmesh: spawned 4/4 processes on 2 hosts 1."), text
    assert len(lines) == 2, text        # in a log: a line when the quarter changes


def test_a_quick_spawn_says_nothing(monkeypatch):
    assert _run(monkeypatch, [0.01, 0.02], 0.5) == ""
