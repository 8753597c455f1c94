"""Ray workloads, run with /work/peers/ray/bin/python.

Mapping of the workloads onto Ray's API:
  call_one await  -> ``await actor.echo.remote(x)``      (ObjectRef is awaitable)
  call_one sync   -> ``ray.get(actor.echo.remote(x))``
  call() gather N -> ``await asyncio.gather(*(a.echo.remote(x) for a in actors[:N]))``
  pipelined       -> 10k ``actor.echo.remote(x)`` then ``ray.get(refs)`` / await each
  bulk            -> ``ray.get(actor.echo.remote(payload))``; Ray puts arguments > 100 KiB
                     into its shared-memory object store (plasma), so on one host the
                     payload is copied into /dev/shm, not sent over a socket.
  bring-up        -> first: ``ray.init(num_cpus=4, include_dashboard=False)`` + 4 actors +
                     first reply of all four; second: 4 more actors in the running cluster.
Actors are async actors (``async def echo``), the closest match to an async endpoint.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

T_IMPORT0 = time.perf_counter()
import ray  # noqa: E402
T_IMPORT = time.perf_counter() - T_IMPORT0


@ray.remote
class Echo:
    async def echo(self, x):
        return x

    async def ping(self) -> int:
        return os.getpid()


def init() -> None:
    ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING",
             log_to_driver=False)


def bringup(rep: C.Report) -> None:
    rep.put("import_s", T_IMPORT)
    t0 = time.perf_counter()
    init()
    rep.put("ray_init_s", time.perf_counter() - t0)
    for key in ("bringup_first_s", "bringup_second_s"):
        if key == "bringup_second_s":
            t0 = time.perf_counter()
        actors = [Echo.remote() for _ in range(4)]
        pids = ray.get([a.ping.remote() for a in actors], timeout=120)
        dt = time.perf_counter() - t0
        assert len(set(pids)) == 4
        rep.put(key, dt)
    rep.note("bring-up first = ray.init(num_cpus=4) + 4 actors + first replies; second = 4 more "
             "actors in the running local cluster")


def lat_await(a, cfg) -> dict:
    async def go():
        samples = []
        x = C.SMALL
        for i in range(cfg["warmup"] + cfg["lat_iters"]):
            t0 = C.now()
            r = await a.echo.remote(x)
            t1 = C.now()
            if i >= cfg["warmup"]:
                samples.append(t1 - t0)
        assert r == x
        return C.lat_stats(samples)
    return asyncio.run(go())


def lat_sync(a, cfg) -> dict:
    samples = []
    x = C.SMALL
    for i in range(cfg["warmup"] + cfg["lat_iters"]):
        t0 = C.now()
        r = ray.get(a.echo.remote(x))
        t1 = C.now()
        if i >= cfg["warmup"]:
            samples.append(t1 - t0)
    assert r == x
    return C.lat_stats(samples)


def gather(actors, cfg) -> dict:
    async def go():
        samples = []
        x = C.SMALL
        warm = max(50, cfg["gather_iters"] // 10)
        for i in range(warm + cfg["gather_iters"]):
            t0 = C.now()
            vals = await asyncio.gather(*(a.echo.remote(x) for a in actors))
            t1 = C.now()
            if i >= warm:
                samples.append(t1 - t0)
        assert len(vals) == len(actors)
        return C.lat_stats(samples)
    return asyncio.run(go())


def pipelined_sync(a, n: int) -> float:
    x = C.SMALL
    t0 = time.perf_counter()
    refs = [a.echo.remote(x) for _ in range(n)]
    ray.get(refs)
    return n / (time.perf_counter() - t0)


def pipelined_async(a, n: int) -> float:
    async def go():
        x = C.SMALL
        t0 = time.perf_counter()
        refs = [a.echo.remote(x) for _ in range(n)]
        for r in refs:
            await r
        return n / (time.perf_counter() - t0)
    return asyncio.run(go())


def bulk(a, payload, reps: int) -> dict:
    size = payload.nbytes if hasattr(payload, "nbytes") else len(payload)
    for _ in range(2):     # two warm-ups, as in bench_hpcmesh.bulk
        out = ray.get(a.echo.remote(payload))
    osize = out.nbytes if hasattr(out, "nbytes") else len(out)
    assert osize == size, (type(out), osize)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = ray.get(a.echo.remote(payload))
        times.append(time.perf_counter() - t0)
        del out
    best, med = min(times), sorted(times)[len(times) // 2]
    return {"MBps_med": C.mbps(size, med), "MBps_best": C.mbps(size, best), "s_med": med,
            "reps": reps}


def steady(rep: C.Report, cfg: dict) -> None:
    if not ray.is_initialized():
        init()
    actors = [Echo.remote() for _ in range(8)]
    ray.get([a.ping.remote() for a in actors], timeout=120)
    a = actors[0]
    for _ in range(cfg["warmup"]):
        ray.get(a.echo.remote(C.SMALL))
    rep.run("rt_await", lambda: rep.put("rt_await", lat_await(a, cfg)))
    rep.run("rt_sync", lambda: rep.put("rt_sync", lat_sync(a, cfg)))
    rep.run("gather4", lambda: rep.put("gather4", gather(actors[:4], cfg)))
    rep.run("gather8", lambda: rep.put("gather8", gather(actors, cfg)))
    rep.run("gather4_paired", lambda: rep.put("gather4_paired", asyncio.run(C.paired(
        lambda: a.echo.remote(C.SMALL),
        lambda: asyncio.gather(*(b.echo.remote(C.SMALL) for b in actors[:4])),
        cfg["paired_rounds"]))))

    def pipe(fn, key):
        fn(a, 1000)
        rates = [fn(a, C.PIPELINE_N) for _ in range(cfg["pipe_reps"])]
        rep.put(key, {"msgs_per_s_med": sorted(rates)[len(rates) // 2],
                      "msgs_per_s_best": max(rates), "n": C.PIPELINE_N})
    rep.run("pipelined_sync", pipe, pipelined_sync, "pipelined_sync")
    rep.run("pipelined_async", pipe, pipelined_async, "pipelined_async")
    payload = os.urandom(C.BULK_BYTES)
    rep.run("bulk_bytes", lambda: rep.put("bulk_bytes", bulk(a, payload, cfg["bulk_reps"])))
    payload = None      # free the 64 MiB before the tensor run

    def tensor():
        import torch
        rep.put("bulk_tensor", bulk(a, torch.rand(C.BULK_BYTES // 4, dtype=torch.float32),
                                    cfg["bulk_reps"]))
    rep.run("bulk_tensor", tensor)
    rep.note("ray: bulk arguments/results go through the plasma shared-memory object store "
             "(same host), not a socket; gather = asyncio.gather over N actor handles")


def main() -> None:
    args = C.parse_args()
    cfg = C.config(args.quick)
    rep = C.Report("ray")
    rep.version("ray", ray)
    try:
        if args.part in ("all", "bringup"):
            rep.run("bringup", bringup, rep)
        if args.part in ("all", "steady"):
            rep.run("steady", steady, rep, cfg)
    finally:
        rep.emit()
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
