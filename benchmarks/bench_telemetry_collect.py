"""What one collection costs the controller, whose pipelined caller shares its GIL.

    .venv/bin/python benchmarks/bench_telemetry_collect.py [--calls 90000] [--reps 5]

The collector runs in the controller's process, beside the calls it records: every
millisecond of CPU it takes there is a millisecond the pipelined caller waits for the
GIL. With the job's telemetry on and the collector parked (``HPCMESH_TELEMETRY_INTERVAL``
=1000), one Echo actor; ``--reps`` times: ``--calls`` pipelined ``call_one`` (the rows
of about a second at full speed), then one ``collect()`` by hand, timed in wall clock
and in the collecting thread's CPU. Also an idle collection (no calls since the last):
the fixed part. The per-call figure is the collection's CPU over the calls it took in.
Then one query of both per-call tables (where the rows become columns now), timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HPCMESH_TELEMETRY_INTERVAL", "1000")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from _monarch_style import pipelined_sync  # noqa: E402
from bench_hpcmesh import Echo  # noqa: E402

from hpcmesh.actor import this_host  # noqa: E402
from hpcmesh.telemetry import TelemetryConfig  # noqa: E402
from hpcmesh.telemetry.server import current_service, start_telemetry  # noqa: E402


def timed(fn) -> tuple[float, float]:
    """(wall s, this thread's CPU s) of ``fn()``."""
    t0, c0 = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - t0, time.thread_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=90_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    start_telemetry(TelemetryConfig())
    service = current_service()
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    ep = procs.spawn("echo", Echo).echo
    pipelined_sync(ep, 2000)
    service.collector.collect()
    idle = [timed(service.collector.collect) for _ in range(args.reps)]
    busy = []
    for _ in range(args.reps):
        left = args.calls
        while left > 0:
            pipelined_sync(ep, min(left, C.PIPELINE_N))
            left -= C.PIPELINE_N
        busy.append(timed(service.collector.collect))
    query = timed(lambda: service.engine.query(
        "SELECT (SELECT COUNT(*) FROM messages) AS m, (SELECT COUNT(*) FROM sent_messages) AS s"))
    procs.stop().get(timeout=30)

    def med(xs: list, i: int) -> float:
        return statistics.median(x[i] for x in xs) * 1e3
    rep = C.Report("telemetry_collect")
    rep.put("calls", args.calls)
    rep.put("idle_wall_ms", med(idle, 0))
    rep.put("idle_cpu_ms", med(idle, 1))
    rep.put("busy_wall_ms", med(busy, 0))
    rep.put("busy_cpu_ms", med(busy, 1))
    rep.put("cpu_us_per_call", med(busy, 1) * 1e3 / args.calls)
    rep.put("query_after_ms", query[0] * 1e3)
    rep.emit()
    print(f"| collection | wall (ms) | controller CPU (ms) |\n|---|---|---|\n"
          f"| idle | {med(idle, 0):.1f} | {med(idle, 1):.1f} |\n"
          f"| after {args.calls:,} calls | {med(busy, 0):.1f} | {med(busy, 1):.1f} "
          f"({med(busy, 1) * 1e3 / args.calls:.3f} µs a call) |\n"
          f"| then a query of both per-call tables ({args.reps * args.calls:,} rows each) | "
          f"{query[0] * 1e3:.0f} | — |")


if __name__ == "__main__":
    main()
