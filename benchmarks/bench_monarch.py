"""torchmonarch (``monarch.actor``) workloads, run with /work/peers/monarch/bin/python.

Same workloads as bench_hpcmesh.py through Monarch's API, which hpcmesh copies:
``this_host().spawn_procs(per_host={"gpus": N})``, ``procs.spawn(name, Cls)``,
``mesh.ep.call_one(x)`` / ``.call(x)``, Futures usable with ``await`` or ``.get()``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from _monarch_style import (bulk, gather, lat_await, lat_sync,  # noqa: E402
                            pipelined_async, pipelined_sync)

T_IMPORT0 = time.perf_counter()
import monarch  # noqa: E402
from monarch.actor import Actor, endpoint, this_host  # noqa: E402
T_IMPORT = time.perf_counter() - T_IMPORT0


class Echo(Actor):
    @endpoint
    async def echo(self, x):
        return x

    @endpoint
    async def ping(self) -> int:
        return os.getpid()


def bringup(rep: C.Report) -> None:
    rep.put("import_s", T_IMPORT)
    for key in ("bringup_first_s", "bringup_second_s"):
        t0 = time.perf_counter()
        procs = this_host().spawn_procs(per_host={"gpus": 4})
        mesh = procs.spawn("echo", Echo)
        vals = mesh.ping.call().get(timeout=120)
        dt = time.perf_counter() - t0
        assert len(set(vals.values())) == 4
        rep.put(key, dt)


def steady(rep: C.Report, cfg: dict) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 8})
    mesh = procs.spawn("echo", Echo)
    one = mesh.slice(gpus=0)
    ep = one.echo
    for _ in range(cfg["warmup"]):
        ep.call_one(C.SMALL).get()
    rep.run("rt_await", lambda: rep.put("rt_await", lat_await(ep, cfg)))
    rep.run("rt_sync", lambda: rep.put("rt_sync", lat_sync(ep, cfg)))
    rep.run("gather4", lambda: rep.put("gather4", gather(mesh.slice(gpus=slice(0, 4)).echo, 4,
                                                         cfg)))
    rep.run("gather8", lambda: rep.put("gather8", gather(mesh.echo, 8, cfg)))
    four = mesh.slice(gpus=slice(0, 4)).echo
    rep.run("gather4_paired", lambda: rep.put("gather4_paired", asyncio.run(C.paired(
        lambda: ep.call_one(C.SMALL), lambda: four.call(C.SMALL), cfg["paired_rounds"]))))

    def pipe(key, fn):
        rep.put(key, C.pipelined_stats(lambda n: fn(ep, n), cfg["pipe_reps"]))
    rep.run("pipelined_sync", pipe, "pipelined_sync", pipelined_sync)
    rep.run("pipelined_async", pipe, "pipelined_async", pipelined_async)
    payload = os.urandom(C.BULK_BYTES)
    rep.run("bulk_bytes", lambda: rep.put("bulk_bytes", bulk(ep, payload, cfg["bulk_reps"])))
    payload = None      # free the 64 MiB before the tensor run

    def tensor():
        import torch
        rep.put("bulk_tensor", bulk(ep, torch.rand(C.BULK_BYTES // 4, dtype=torch.float32),
                                    cfg["bulk_reps"]))
    rep.run("bulk_tensor", tensor)
    try:
        procs.stop().get(timeout=30)
    except Exception as e:  # noqa: BLE001
        rep.note(f"procs.stop() failed: {e}")


def main() -> None:
    args = C.parse_args()
    cfg = C.config(args.quick)
    rep = C.Report("monarch")
    rep.version("torchmonarch", monarch)
    try:
        from importlib.metadata import version
        rep.data["versions"]["torchmonarch"] = version("torchmonarch")
    except Exception:  # noqa: BLE001
        pass
    if args.part in ("all", "bringup"):
        rep.run("bringup", bringup, rep)
    if args.part in ("all", "steady"):
        rep.run("steady", steady, rep, cfg)
    rep.emit()
    os._exit(0)


if __name__ == "__main__":
    main()
