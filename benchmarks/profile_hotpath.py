"""cProfile both ends of an hpcmesh hot path (controller main thread and the worker).

    .venv/bin/python benchmarks/profile_hotpath.py sync|await|pipelined|bulk_bytes|bulk_tensor [N]

The worker is started through a BootstrapCommand that runs this file with
``--worker``: it profiles ``hpcmesh.runtime.proc.main`` and dumps the stats
when the process exits. Prints the top functions of each side by tottime, in µs
per operation (cProfile roughly doubles Python-heavy costs; compare relative
sizes, and see micro_hotpath.py for unprofiled costs of the pieces).
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker() -> None:
    prof = cProfile.Profile()
    out = os.environ["BENCH_PROFILE_OUT"]
    real_exit = os._exit

    def _exit(code):
        prof.disable()
        prof.dump_stats(f"{out}.worker")
        real_exit(code)
    os._exit = _exit
    from hpcmesh.runtime import proc   # the public name: this tree's and older ones'
    prof.enable()
    proc.main()


def show(path: str, ops: int, title: str, top: int = 22) -> None:
    s = io.StringIO()
    st = pstats.Stats(path, stream=s)
    st.sort_stats("tottime")
    print(f"===== {title}: top {top} by own time (µs per op over {ops} ops)")
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (file, line, fn), (cc, nc, tt, ct, _) in rows:
        where = file.split("site-packages/")[-1].split("/main/")[-1]
        print(f"  {tt / ops * 1e6:8.2f} own {ct / ops * 1e6:8.2f} cum  {nc / ops:6.2f} calls/op  "
              f"{fn} ({where}:{line})")


def main() -> None:
    sys.path.insert(0, HERE)
    import _common as C
    from hpcmesh.actor import Actor, default_bootstrap_cmd, endpoint, this_host
    workload = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else (20 if workload.startswith("bulk") else 5000)
    scratch = tempfile.TemporaryDirectory(prefix="hpcmesh-prof-")   # removed at exit
    out = os.path.join(scratch.name, "prof")
    base = default_bootstrap_cmd()
    cmd = base.__class__(sys.executable, [os.path.abspath(__file__), "--worker"],
                         {"BENCH_PROFILE_OUT": out, "PYTHONPATH": HERE + os.pathsep +
                          os.environ.get("PYTHONPATH", "")})

    class Echo(Actor):
        @endpoint
        async def echo(self, x):
            return x
    if workload == "bulk_tensor":
        import torch  # noqa: F401  (before spawning: see "torch import race" in git log -p benchmarks/RESULTS.md)
    procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=cmd)
    ep = procs.spawn("echo", Echo).echo
    if workload.startswith("bulk"):
        if workload == "bulk_bytes":
            x = os.urandom(C.BULK_BYTES)
        else:
            import torch
            x = torch.rand(C.BULK_BYTES // 4)
    else:
        x = C.SMALL
    for _ in range(min(n, 200)):
        ep.call_one(x).get()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    if workload == "await":
        async def go():
            for _ in range(n):
                await ep.call_one(x)
        asyncio.run(go())
    elif workload == "pipelined":
        futs = [ep.call_one(x) for _ in range(n)]
        for f in futs:
            f.get()
    else:
        for _ in range(n):
            ep.call_one(x).get()
    prof.disable()
    dt = time.perf_counter() - t0
    prof.dump_stats(out + ".ctl")
    procs.stop().get(timeout=30)
    for _ in range(50):
        if os.path.exists(out + ".worker"):
            break
        time.sleep(0.1)
    print(f"{workload}: {n} ops, {dt / n * 1e6:.1f} µs/op wall under cProfile")
    show(out + ".ctl", n, "controller (main thread only)")
    if os.path.exists(out + ".worker"):
        show(out + ".worker", n, "worker (loop thread; includes startup)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker()
    else:
        main()
