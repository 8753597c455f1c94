"""Accumulator (issue 32 item 11): its results come through ``endpoint.stream()`` as in
Monarch, and a mesh's are folded in mesh order whatever order they arrive in."""

from __future__ import annotations

import os
import threading
import time

import pytest

from hpcmesh.actor import Accumulator, Actor, current_rank, endpoint, this_host
from hpcmesh.runtime.future import Future, completed


class Reversed(Actor):
    """Rank 0 answers only once rank 1 has (a file rank 1 writes): arrival order is the
    reverse of mesh order."""

    @endpoint
    def letter(self, flag: str) -> str:
        rank = current_rank().rank
        if rank == 0:
            deadline = time.monotonic() + 30
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            def later() -> None:
                # sleep: rank 1's reply gets a head start on the way to the caller before
                # rank 0 may answer (the flag at once raced it under load)
                time.sleep(0.3)
                open(flag, "w").close()
            threading.Thread(target=later, daemon=True).start()
        return "ab"[rank]


class StreamOnly:
    """Stands in for an endpoint: nothing but a stream() (no call()), which it counts."""

    def __init__(self, futures):
        self.futures = futures
        self.calls = []

    def stream(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return iter(self.futures)


def test_a_substituted_stream_is_used_and_folded_in_its_order():
    later = Future()
    src = StreamOnly([completed("x"), later, completed("z")])
    acc = Accumulator(src, "", lambda a, r: a + r).accumulate(1, k=2)
    assert src.calls == [((1,), {"k": 2})] and not acc.done()
    later.set_result("y")
    assert acc.get(timeout=5) == "xyz"


def test_the_first_failure_in_order_fails_the_fold():
    bad = Future()
    bad.set_exception(ValueError("member 1 failed"))
    acc = Accumulator(StreamOnly([completed(1), bad]), 0, lambda a, r: a + r)
    with pytest.raises(ValueError, match="member 1 failed"):
        acc.accumulate().get(timeout=5)


def test_a_stream_of_non_futures_is_named():
    acc = Accumulator(StreamOnly([completed(1), 2]), 0, lambda a, r: a + r)
    with pytest.raises(TypeError, match="stream\\(\\) gave a int at position 1"):
        acc.accumulate().get(timeout=5)


def test_what_is_no_endpoint_is_refused():
    with pytest.raises(TypeError, match="stream\\(\\) method; got int"):
        Accumulator(3, 0, max)


def test_a_mesh_stream_folds_in_mesh_order_not_arrival_order(tmp_path):
    """Rank 1's result arrives first; the fold still reads rank 0's first, so a combine
    that is not commutative gives the same value every time (Monarch: arrival order)."""
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        mesh = procs.spawn("acc_order", Reversed)
        arrival = [f.get(timeout=30) for f in mesh.letter.stream(str(tmp_path / "one"))]
        assert arrival == ["b", "a"]
        acc = Accumulator(mesh.letter, "", lambda a, r: a + r)
        assert acc.accumulate(str(tmp_path / "two")).get(timeout=30) == "ab"
    finally:
        procs.stop().get(timeout=30)
