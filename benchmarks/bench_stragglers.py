"""What the straggler watch costs a call: on and off in alternating blocks, one sitting.

    .venv/bin/python benchmarks/bench_stragglers.py [--rounds 10] [--n 300]

The controller's watch (``runtime/observe/stragglers.py``) is switched on and off between
blocks (``stragglers.start``/``stop``: off is what ``HPCMESH_STRAGGLERS=0`` runs), in
alternating order (off, on, on, off, ...), over 4 processes: each block times ``n``
``call_one(...).get()`` round trips to one actor and ``n`` ``call(...).get()`` over the 4,
then a pipelined burst of 2,000 ``call()`` (issued, then waited for). The figures are the
medians of each block's median, and the ratio on/off per adjacent pair (this VM's speed
drifts by more between minutes than the watch costs). call_one notes nothing per call (the
timer finds a hung one in the reply table): its ratio says what the timer costs, and the
noise.

Then what the timer's walk of the reply table for hung call_ones costs a call_one: its
``.get()`` in alternating blocks (1.5 s each, so that looks fall inside) with the walk on
(HPCMESH_HANG_AFTER_S=0.05: a walk at every look) and off (inf), at the default tick and at
0.01 s; and the look itself, timed directly: one look in the steady state, with ``--in-flight`` calls in flight (young)
behind ``--waiting`` long-lived replies (a host agent's ``watch_procs`` each), as µs per
look and as a share of one core at the default tick (HPCMESH_STRAGGLER_TICK_S=0.5).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hpcmesh.actor import Actor, endpoint, this_host  # noqa: E402
from hpcmesh.runtime.client import client_runtime  # noqa: E402
from hpcmesh.runtime.observe import stragglers  # noqa: E402


class Echo(Actor):
    @endpoint
    async def echo(self, x):
        return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--n", type=int, default=300, help="round trips per block and kind")
    ap.add_argument("--pipelined", type=int, default=2000, help="call()s per pipelined burst")
    ap.add_argument("--in-flight", type=int, default=2000, help="calls in flight for a look")
    ap.add_argument("--waiting", type=int, default=32, help="long-lived replies for a look")
    args = ap.parse_args()
    rt = client_runtime()
    look_cost(rt, args.in_flight, args.waiting)
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    mesh = procs.spawn("echo", Echo)
    one = mesh.slice(gpus=0).echo
    all4 = mesh.echo
    for _ in range(500):            # warm up both paths
        one.call_one(1).get()
        all4.call(1).get()

    def block(on: bool) -> dict:
        if on:
            stragglers.start(rt)
        else:
            stragglers.stop()
        assert (stragglers.WATCH is not None) == on
        lat1, lat4 = [], []
        for _ in range(args.n):
            t0 = time.perf_counter_ns()
            one.call_one(1).get()
            lat1.append(time.perf_counter_ns() - t0)
        for _ in range(args.n):
            t0 = time.perf_counter_ns()
            all4.call(1).get()
            lat4.append(time.perf_counter_ns() - t0)
        t0, c0 = time.perf_counter(), time.process_time()
        futs = [all4.call(1) for _ in range(args.pipelined)]
        for f in futs:
            f.get()
        rate = args.pipelined / (time.perf_counter() - t0)
        cpu = (time.process_time() - c0) / args.pipelined * 1e6
        return {"call_one": statistics.median(lat1) / 1e3, "call4": statistics.median(lat4) / 1e3,
                "pipelined4": rate, "cpu4": cpu}

    runs: dict = {False: [], True: []}
    for r in range(args.rounds):
        for on in (False, True) if r % 2 == 0 else (True, False):
            runs[on].append(block(on))
    walks = [walk_ab(rt, one, tick, args.rounds) for tick in (0.5, 0.01)]
    stragglers.start(rt)
    procs.stop().get(timeout=60)
    for line in walks:
        print(line)
    print(f"straggler watch off/on, {args.rounds} rounds of alternating blocks, 4 processes\n"
          "| workload | off | on | on/off (median of pairs) |\n|---|---|---|---|")
    for key, label, unit in (("call_one", "call_one .get(), median", "µs"),
                             ("call4", "call() over 4 .get(), median", "µs"),
                             ("pipelined4", "pipelined call() over 4", "calls/s"),
                             ("cpu4", "controller CPU a pipelined call() over 4", "µs")):
        off = statistics.median(b[key] for b in runs[False])
        on = statistics.median(b[key] for b in runs[True])
        paired = statistics.median(a[key] / b[key] for a, b in zip(runs[True], runs[False]))
        print(f"| {label} ({unit}) | {off:.1f} | {on:.1f} | {paired:.3f} |")


def walk_ab(rt, one, tick: float, rounds: int, block_s: float = 1.5) -> str:
    """call_one ``.get()`` with the walk for hung call_ones on and off, alternating."""
    runs: dict = {False: [], True: []}
    for r in range(rounds):
        for on in (False, True) if r % 2 == 0 else (True, False):
            stragglers.start(rt, stragglers.Settings(
                hang_s=0.05 if on else float("inf"), tick_s=tick))
            lat = []
            end = time.perf_counter() + block_s
            while time.perf_counter() < end:
                t0 = time.perf_counter_ns()
                one.call_one(1).get()
                lat.append(time.perf_counter_ns() - t0)
            runs[on].append(statistics.median(lat) / 1e3)
    off, on = statistics.median(runs[False]), statistics.median(runs[True])
    paired = statistics.median(a / b for a, b in zip(runs[True], runs[False]))
    return (f"call_one .get() with the walk for hung call_ones off / on (a look every "
            f"{tick:g} s), {rounds} rounds of alternating blocks: {off:.1f} / {on:.1f} µs, "
            f"on/off {paired:.3f} (median of pairs)")


def look_cost(rt, in_flight: int, waiting: int, batches: int = 30, looks: int = 100) -> None:
    """Time the straggler timer's look (``StragglerWatch.check``) in its steady state: the
    hang threshold past, ``waiting`` replies older than it (no endpoint calls: walked
    over), then ``in_flight`` endpoint calls younger (the walk stops at the first); beside
    the same look with the walk off (HPCMESH_HANG_AFTER_S=inf). The entries are placed in
    the node's reply table and taken out again; nothing is sent. Each figure is the best
    batch (a shared VM preempts some)."""
    ports = rt.node.ports
    added = []

    def put(actor_id):
        pid = next(ports.ids)
        ports.replies[pid] = (None, None, actor_id, actor_id and "echo")
        added.append(pid)

    def timed(w, now: float) -> float:
        w.check(now)
        best = float("inf")
        for _ in range(batches):
            c0 = time.perf_counter_ns()
            for _ in range(looks):
                w.check(now)
            best = min(best, (time.perf_counter_ns() - c0) / looks / 1e3)
        return best
    on = stragglers.Settings()
    watches = [stragglers.StragglerWatch(rt, on),
               stragglers.StragglerWatch(rt, stragglers.Settings(hang_s=float("inf")))]
    t0 = time.monotonic()
    try:
        for _ in range(waiting):
            put(None)
        for w in watches:
            w.close()           # its own timer off: the looks below are timed by hand
            w.check(t0)         # the mark that dates the replies made before it
        for _ in range(in_flight):
            put("a" * 32)
        with_walk, without = (timed(w, t0 + on.hang_s + 1) for w in watches)
    finally:
        for pid in added:
            ports.replies.pop(pid, None)
    print(f"one look of the straggler timer, {waiting} long-lived replies and {in_flight} "
          f"calls in flight: {with_walk:.2f} µs ({without:.2f} µs without the walk for "
          f"hung call_ones); the walk at a look every {on.tick_s:g} s: "
          f"{(with_walk - without) / (on.tick_s * 1e6) * 100:.5f} % of one core")

if __name__ == "__main__":
    main()
