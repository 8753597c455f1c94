"""Shared helpers for the benchmark workers (stdlib only: peers' venvs import this too).

Every worker script (``bench_floor.py``, ``bench_hpcmesh.py``, ``bench_monarch.py``,
``bench_ray.py``) is run by ``run.py`` as a subprocess, possibly with another
venv's python; it prints exactly one line ``BENCHJSON {...}`` on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
import traceback

#: The small payload every latency workload sends and gets back (same bytes for all).
SMALL = b"x" * 32
#: Bulk payload size: 64 MiB.
BULK_BYTES = 64 * 1024 * 1024
#: How many calls the pipelined workload issues before waiting.
PIPELINE_N = 10_000
MARKER = "BENCHJSON "


def config(quick: bool) -> dict:
    """Iteration counts; the same for every system.

    ``paired_rounds``: rounds of alternating 200-call blocks (see ``paired``). The VM's
    phases last from ~100 ms to seconds, longer than a block: 5 rounds (1000 calls of each,
    ~0.3 s for hpcmesh) left the ratio of one run 0.1-0.2 away from the next; 20 rounds
    sample more phases. ``tel_block_rounds``: rounds of telemetry on/off blocks
    (``bench_hpcmesh.telemetry_blocks``), each a pair per figure. Adjacent blocks of this
    VM differ by 0.5-2x, so the median of 24 pairs moved by ±0.05 from run to run (a
    ~6 % cost read 0.85 one run, 1.02 the next); 64 pairs halve that (~15 s a figure).
    """
    if quick:
        return dict(lat_iters=2000, warmup=200, gather_iters=300, pipe_reps=2, bulk_reps=3,
                    bringup_reps=1, paired_rounds=4, tel_block_rounds=64)
    return dict(lat_iters=5000, warmup=500, gather_iters=1000, pipe_reps=3, bulk_reps=6,
                bringup_reps=3, paired_rounds=20, tel_block_rounds=96)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", default="all",
                    help="all | bringup (one cold bring-up in this fresh process) | steady")
    ap.add_argument("--profile", default="",
                    help="(hpcmesh only) run one workload in a loop for a profiler: "
                         "await | sync | pipelined | bulk_bytes | bulk_tensor")
    ap.add_argument("--seconds", type=float, default=8.0, help="duration of --profile")
    ap.add_argument("--telemetry", action="store_true",
                    help="(hpcmesh only) start the job's telemetry before any process is "
                         "spawned: every process records, the collector drains them")
    return ap.parse_args(argv)


def lat_stats(samples_ns: list[int]) -> dict:
    """Median / p99 / mean / min in microseconds."""
    s = sorted(samples_ns)
    n = len(s)
    p99 = s[min(n - 1, int(round(0.99 * (n - 1))))]
    return {"n": n, "med_us": statistics.median(s) / 1e3, "p99_us": p99 / 1e3,
            "mean_us": statistics.fmean(s) / 1e3, "min_us": s[0] / 1e3}


# ---------------------------------------------------------------------------------------
# The workloads, written once: each system passes its own way of making a call.
# ---------------------------------------------------------------------------------------
def latency(call, warmup: int, n: int, check=None) -> dict:
    """Latency of ``call()`` (blocking): ``n`` timed calls after ``warmup`` untimed ones;
    ``check(last result)`` must hold."""
    samples = []
    for i in range(warmup + n):
        t0 = now()
        r = call()
        t1 = now()
        if i >= warmup:
            samples.append(t1 - t0)
    assert check is None or check(r), r
    return lat_stats(samples)


def latency_await(make, warmup: int, n: int, check=None) -> dict:
    """``latency`` for ``await make()``, in a fresh event loop."""
    async def go():
        samples = []
        for i in range(warmup + n):
            t0 = now()
            r = await make()
            t1 = now()
            if i >= warmup:
                samples.append(t1 - t0)
        assert check is None or check(r), r
        return lat_stats(samples)
    return asyncio.run(go())


def gather_latency(make, cfg: dict, n_expected: int, count=len) -> dict:
    """``await make()`` of a call to ``n_expected`` actors; ``count(result)`` must be that."""
    return latency_await(make, max(50, cfg["gather_iters"] // 10), cfg["gather_iters"],
                         lambda result: count(result) == n_expected)


def pipelined(issue, wait_all, n: int) -> float:
    """Calls per second: ``n`` calls issued back to back, then ``wait_all(handles)``."""
    t0 = time.perf_counter()
    handles = [issue() for _ in range(n)]
    wait_all(handles)
    return n / (time.perf_counter() - t0)


def pipelined_await(issue, n: int) -> float:
    """``pipelined``, awaiting each handle in order from an event loop."""
    async def go():
        t0 = time.perf_counter()
        handles = [issue() for _ in range(n)]
        for h in handles:
            await h
        return n / (time.perf_counter() - t0)
    return asyncio.run(go())


def pipelined_stats(rate, reps: int) -> dict:
    """``rate(n)`` once with 1000 calls to warm up, then ``reps`` times with PIPELINE_N."""
    rate(1000)
    rates = [rate(PIPELINE_N) for _ in range(reps)]
    return {"msgs_per_s_med": sorted(rates)[len(rates) // 2], "msgs_per_s_best": max(rates),
            "n": PIPELINE_N}


def bulk_round_trip(call, payload, reps: int, same_type: bool = False,
                    release: bool = False) -> dict:
    """MB/s of ``call(payload)`` returning the payload. Two warm-ups: the timed loop keeps
    the previous reply alive while the next arrives, so the steady state holds two
    replies; the second warm-up allocates the second. ``release``: drop each reply before
    the next call (Ray: frees its object-store copy)."""
    size = payload.nbytes if hasattr(payload, "nbytes") else len(payload)
    for _ in range(2):
        out = call(payload)                     # (and a correctness check)
    osize = out.nbytes if hasattr(out, "nbytes") else len(out)
    assert osize == size and (not same_type or type(out) is type(payload)), (type(out), osize)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = call(payload)
        times.append(time.perf_counter() - t0)
        if release:
            del out
    best, med = min(times), sorted(times)[len(times) // 2]
    return {"MBps_med": mbps(size, med), "MBps_best": mbps(size, best), "s_med": med,
            "reps": reps}


async def paired(a, b, rounds: int, block: int = 200) -> dict:
    """Latency of ``await a()`` and ``await b()`` measured in alternating blocks;
    ``ratio`` is b's median over a's.

    The VM's speed drifts by a third over minutes; two workloads timed one after the
    other can land in different phases, so their ratio mixes the workload with the
    drift. Alternating blocks of ``block`` calls puts both in the same phases."""
    s_a: list[int] = []
    s_b: list[int] = []
    for _ in range(block):                       # warm-up, not timed
        await a()
        await b()
    for _ in range(rounds):
        for fn, out in ((a, s_a), (b, s_b)):
            for _ in range(block):
                t0 = now()
                await fn()
                out.append(now() - t0)
    sa, sb = lat_stats(s_a), lat_stats(s_b)
    return {"a": sa, "b": sb, "ratio": sb["med_us"] / sa["med_us"], "block": block}


def mbps(payload_bytes: int, seconds: float) -> float:
    """Round-trip throughput in MB/s (1 MB = 1e6 B), counting the payload both ways."""
    return 2 * payload_bytes / seconds / 1e6


def now() -> int:
    return time.perf_counter_ns()


class Report:
    """Collects results and errors; prints the JSON line at the end."""

    def __init__(self, system: str):
        self.data = {"system": system, "python": platform.python_version(), "pid": os.getpid(),
                     "versions": {}, "results": {}, "errors": {}, "notes": []}

    def version(self, name: str, module) -> None:
        self.data["versions"][name] = getattr(module, "__version__", "?")

    def put(self, key: str, value) -> None:
        self.data["results"][key] = value
        print(f"  {self.data['system']}: {key} = {_short(value)}", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        self.data["notes"].append(text)

    def error(self, key: str, exc: BaseException) -> None:
        self.data["errors"][key] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)

    def run(self, key: str, fn, *args) -> None:
        """Run one workload; an exception is recorded under ``key`` and the rest go on."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001
            self.error(key, e)

    def emit(self) -> None:
        sys.stdout.write(MARKER + json.dumps(self.data) + "\n")
        sys.stdout.flush()


def _short(v) -> str:
    """One line for the progress log: floats to 4 digits, a list as its length (the JSON
    keeps every number)."""
    if isinstance(v, dict):
        return ", ".join(f"{k}={{{_short(x)}}}" if isinstance(x, dict) else f"{k}={_short(x)}"
                         for k, x in v.items())
    if isinstance(v, list):
        return f"[{len(v)} values]"
    return f"{v:.4g}" if isinstance(v, float) else str(v)
