"""Workloads for Monarch-style meshes: ``ep.call_one(x)`` / ``ep.call(x)`` returning a
Future usable with ``await`` or ``.get()``. hpcmesh copies Monarch's API, so
bench_hpcmesh.py and bench_monarch.py run these same functions (stdlib only)."""

from __future__ import annotations

import _common as C


def lat_await(ep, cfg) -> dict:
    return C.latency_await(lambda: ep.call_one(C.SMALL), cfg["warmup"], cfg["lat_iters"],
                           lambda r: r == C.SMALL)


def lat_sync(ep, cfg) -> dict:
    return C.latency(lambda: ep.call_one(C.SMALL).get(), cfg["warmup"], cfg["lat_iters"],
                     lambda r: r == C.SMALL)


def gather(ep, n_expected: int, cfg) -> dict:
    return C.gather_latency(lambda: ep.call(C.SMALL), cfg, n_expected,
                            lambda vm: len(list(vm.values())))


def pipelined_sync(ep, n: int) -> float:
    return C.pipelined(lambda: ep.call_one(C.SMALL), lambda futs: [f.get() for f in futs], n)


def pipelined_async(ep, n: int) -> float:
    return C.pipelined_await(lambda: ep.call_one(C.SMALL), n)


def bulk(ep, payload, reps: int, same_type: bool = False) -> dict:
    return C.bulk_round_trip(lambda p: ep.call_one(p).get(), payload, reps, same_type)
