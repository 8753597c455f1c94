"""Telemetry's memory after many calls: is it bounded? (issue 16, Speed section)

    .venv/bin/python benchmarks/bench_telemetry_memory.py                    # 1M calls, 1 process
    .venv/bin/python benchmarks/bench_telemetry_memory.py --max-rows 200000  # the store's cap

With the job's telemetry on (``start_telemetry()`` before the processes are spawned),
makes ``--calls`` pipelined ``call_one`` calls (batches of ``--batch`` issued back to
back, then waited for) to an Echo actor in each of ``--procs`` processes, round robin
over the batches, and reports: the store's rows per table and bytes (and their peak while
the calls ran), the controller's RSS before and after, each process's latest RSS
(``metric_process``), the rows dropped (``telemetry_drops``, by table and by who dropped
them: a process whose buffer was full between two collections, or the store over
``HPCMESH_TELEMETRY_MAX_ROWS``), and the time per call. Bounded means: no table holds more
than the cap's rows (so the store's bytes are at most the cap times the bytes of a row),
whatever the number of calls; the store drops whole batches (one collection's rows of a
process), so a table at the cap holds between the cap less one batch and the cap. One ``BENCHJSON`` line on stdout, then a table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from _monarch_style import pipelined_sync  # noqa: E402
from bench_hpcmesh import Echo  # noqa: E402

from hpcmesh.actor import this_host  # noqa: E402
from _telemetry_switch import T as telemetry_recorder  # noqa: E402 - this tree's or an older one's
from hpcmesh.telemetry import TelemetryConfig  # noqa: E402

LATEST_RSS = """
    SELECT m.process, m.pid, m.rss_bytes, m.cpu_percent, m.timestamp_us
    FROM metric_process m JOIN (SELECT process, pid, MAX(timestamp_us) AS ts
                                FROM metric_process GROUP BY process, pid) l
      ON m.process = l.process AND m.pid = l.pid AND m.timestamp_us = l.ts
    ORDER BY m.process"""
DROPS = """
    SELECT process, table_name, SUM(dropped) AS dropped FROM telemetry_drops
    GROUP BY process, table_name ORDER BY process, table_name"""


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000, help="calls issued before waiting")
    ap.add_argument("--procs", type=int, default=1, help="actor processes (1-2 is plenty)")
    ap.add_argument("--max-rows", type=int, default=None,
                    help="HPCMESH_TELEMETRY_MAX_ROWS for this run (the store's cap per table)")
    args = ap.parse_args()
    if args.max_rows is not None:
        os.environ["HPCMESH_TELEMETRY_MAX_ROWS"] = str(args.max_rows)
    from hpcmesh.telemetry.server import current_service, start_telemetry

    rep = C.Report("telemetry_memory")
    rss = telemetry_recorder._rss_bytes       # this process's RSS now (/proc/self/statm)
    rep.put("controller_rss_start", rss())
    fields = start_telemetry(TelemetryConfig())
    store = current_service().store
    engine = fields["query_engine"]
    rep.put("max_rows", store.max_rows)
    rep.put("buffer_rows", telemetry_recorder.buffer_rows())
    procs = this_host().spawn_procs(per_host={"gpus": args.procs})
    mesh = procs.spawn("echo", Echo)
    eps = [mesh.slice(gpus=i).echo for i in range(args.procs)]
    for ep in eps:
        pipelined_sync(ep, 1000)                  # warm-up (recorded too)
    rep.put("controller_rss_before", rss())
    batches, rates, peak, trace = -(-args.calls // args.batch), [], 0, []
    t0 = time.perf_counter()
    for i in range(batches):
        rates.append(pipelined_sync(eps[i % len(eps)], args.batch))
        peak = max(peak, store.nbytes())
        if (i + 1) % max(1, batches // 5) == 0:     # the controller's memory as it goes
            trace.append(((i + 1) * args.batch, rss(), store.nbytes()))
    wall = time.perf_counter() - t0
    rep.put("trace_calls_rss_store", trace)
    n = batches * args.batch
    rep.put("calls", n)
    rep.put("us_per_call", wall / n * 1e6)
    rep.put("batch_rate_med", sorted(rates)[len(rates) // 2])
    rep.put("batch_rate_min", min(rates))
    current_service().collector.collect()        # the last rows in
    rep.put("controller_rss_after", rss())
    rep.put("store_rows", store.row_counts())
    rep.put("store_nbytes", store.nbytes())
    rep.put("store_nbytes_peak", max(peak, store.nbytes()))
    rep.put("process_rss", engine.query(LATEST_RSS).to_pylist())
    rep.put("drops", engine.query(DROPS).to_pylist())
    rep.put("controller_rss_after_sql", rss())   # DataFusion loaded, a query answered
    procs.stop().get(timeout=30)
    rep.emit()
    print(report(rep.data["results"]))


def report(r: dict) -> str:
    rows, cap = r["store_rows"], r["max_rows"]
    lines = [f"telemetry memory: {r['calls']:,} pipelined calls in batches; store cap "
             f"{cap:,} rows per table, process buffers {r['buffer_rows']:,} rows per table",
             "", "| table | rows in the store | within the cap? |", "|---|---|---|"]
    lines += [f"| {t} | {v:,} | {'yes' if v <= cap else 'NO'} |" for t, v in rows.items() if v]
    per_row = r["store_nbytes"] / max(1, sum(rows.values()))
    lines += ["", "| figure | value |", "|---|---|",
              f"| store bytes now / peak while calling | {mib(r['store_nbytes'])} / "
              f"{mib(r['store_nbytes_peak'])} ({per_row:.0f} B a row) |",
              f"| controller RSS: start / after spawn + warm-up / after the calls | "
              f"{mib(r['controller_rss_start'])} / {mib(r['controller_rss_before'])} / "
              f"{mib(r['controller_rss_after'])} |",
              f"| controller RSS after the SQL queries (DataFusion loaded) | "
              f"{mib(r['controller_rss_after_sql'])} |",
              f"| time per call (telemetry on) | {r['us_per_call']:.2f} µs (batch rates: "
              f"median {r['batch_rate_med'] / 1e3:.0f}k/s, slowest "
              f"{r['batch_rate_min'] / 1e3:.0f}k/s) |"]
    lines += [f"| after {n:,} calls: controller RSS / store bytes | {mib(a)} / {mib(b)} |"
              for n, a, b in r["trace_calls_rss_store"]]
    lines += [f"| RSS of {p['process']} (pid {p['pid']}, latest sample) | {mib(p['rss_bytes'])} |"
              for p in r["process_rss"]]
    lines += [f"| rows dropped: {d['table_name']} by {d['process']} | {d['dropped']:,} |"
              for d in r["drops"]] or ["| rows dropped | none |"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
