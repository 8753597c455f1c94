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
    return C.latency_await(lambda: a.echo.remote(C.SMALL), cfg["warmup"], cfg["lat_iters"],
                           lambda r: r == C.SMALL)


def lat_sync(a, cfg) -> dict:
    return C.latency(lambda: ray.get(a.echo.remote(C.SMALL)), cfg["warmup"], cfg["lat_iters"],
                     lambda r: r == C.SMALL)


def gather(actors, cfg) -> dict:
    return C.gather_latency(lambda: asyncio.gather(*(a.echo.remote(C.SMALL) for a in actors)),
                            cfg, len(actors))


def pipelined_sync(a, n: int) -> float:
    return C.pipelined(lambda: a.echo.remote(C.SMALL), ray.get, n)


def pipelined_async(a, n: int) -> float:
    return C.pipelined_await(lambda: a.echo.remote(C.SMALL), n)


def bulk(a, payload, reps: int) -> dict:
    return C.bulk_round_trip(lambda p: ray.get(a.echo.remote(p)), payload, reps, release=True)


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

    def pipe(key, fn):
        rep.put(key, C.pipelined_stats(lambda n: fn(a, n), cfg["pipe_reps"]))
    rep.run("pipelined_sync", pipe, "pipelined_sync", pipelined_sync)
    rep.run("pipelined_async", pipe, "pipelined_async", pipelined_async)
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
