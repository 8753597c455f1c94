"""What recording costs a call, telemetry on and off in alternating blocks (one run).

    .venv/bin/python benchmarks/bench_telemetry_paired.py [--rounds 10] [--mode both|ctl|worker]

Two runs of ``run.py`` (``hpcmesh`` beside ``hpcmesh+telemetry``) land in different phases
of this VM, whose speed drifts by a third over minutes: their ratio moves by ±0.3 from
one run to the next. Here one controller and one actor process switch their recorders
on and off (``--mode``: both sides, only the controller's sends, only the worker's
handled calls) between blocks, in alternating order: a pipelined burst of 10 000
``call_one`` (sync ``.get()``) and 300 ``await call_one`` each block. The collector is
parked (``HPCMESH_TELEMETRY_INTERVAL=1000``, buffers large enough to keep every row):
this is the cost on the call's path; what collecting costs besides is in
``bench_telemetry_memory.py``'s time per call.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

os.environ.setdefault("HPCMESH_TELEMETRY_INTERVAL", "1000")
os.environ.setdefault("HPCMESH_TELEMETRY_BUFFER", "20000000")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from _monarch_style import pipelined_sync  # noqa: E402
from _telemetry_switch import T, RecordingSwitch, switch_recording  # noqa: E402

from hpcmesh.actor import endpoint, this_host  # noqa: E402
from hpcmesh.telemetry import TelemetryConfig  # noqa: E402
from hpcmesh.telemetry.server import start_telemetry  # noqa: E402


class Echo(RecordingSwitch):     # record(on): switch() below
    @endpoint
    async def echo(self, x):
        return x

    @endpoint
    async def pin(self, cpu: int) -> None:
        os.sched_setaffinity(0, {cpu})

    @endpoint
    async def drain(self) -> None:
        if T.RECORDER is not None:
            T.RECORDER.drain()

    @endpoint
    async def cpu(self) -> float:
        return time.process_time()



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--mode", default="both", choices=("both", "ctl", "worker"))
    ap.add_argument("--drain", action="store_true",
                    help="empty both recorders between blocks (the collector drains about "
                         "once a second; without this every row of the run is kept)")
    ap.add_argument("--pin", action="store_true",
                    help="the controller on CPU 0, the actor's process on CPU 1 (less noise "
                         "from the two sharing a core)")
    args = ap.parse_args()
    start_telemetry(TelemetryConfig())
    rec = T.RECORDER
    kept = [None]       # the controller's recorder while switched off
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn("echo", Echo)
    ep = mesh.echo
    if args.pin:
        os.sched_setaffinity(0, {0})
        mesh.pin.call_one(1).get()
    pipelined_sync(ep, 2000)

    def switch(on: bool) -> None:
        if args.drain:          # what the collector does about once a second
            rec.drain()
            mesh.drain.call_one().get()
        kept[0] = switch_recording(on and args.mode != "worker", kept[0])
        w = on and args.mode != "ctl"
        assert mesh.record.call_one(w).get() == w

    async def block(n: int = 300) -> list[int]:
        out = []
        for _ in range(n):
            t0 = C.now()
            await ep.call_one(C.SMALL)
            out.append(C.now() - t0)
        return out

    pipe: dict = {False: [], True: []}
    lat: dict = {False: [], True: []}
    # CPU seconds of each side over the pipelined bursts: what recording costs a call,
    # less exposed than the wall clock to this VM's drift and to the two sides' overlap
    cpu: dict = {(side, on): 0.0 for side in ("ctl", "worker") for on in (False, True)}
    for r in range(args.rounds):
        for on in (False, True) if r % 2 == 0 else (True, False):
            switch(on)
            c0, w0 = time.process_time(), mesh.cpu.call_one().get()
            pipe[on].append(pipelined_sync(ep, C.PIPELINE_N))
            c1, w1 = time.process_time(), mesh.cpu.call_one().get()
            cpu["ctl", on] += c1 - c0
            cpu["worker", on] += w1 - w0
            lat[on] += asyncio.run(block())
    switch(False)
    procs.stop().get(timeout=30)
    po, pn = statistics.median(pipe[False]), statistics.median(pipe[True])
    # each round's on/off from its own adjacent pair of bursts: the VM's drift cancels
    paired = statistics.median(on / off for on, off in zip(pipe[True], pipe[False]))
    lo, ln = C.lat_stats(lat[False]), C.lat_stats(lat[True])
    rep = C.Report("telemetry_paired")
    rep.put("mode", args.mode)
    rep.put("pipelined_off", po)
    rep.put("pipelined_on", pn)
    rep.put("pipelined_ratio", pn / po)
    rep.put("pipelined_ratio_paired", paired)
    rep.put("await_off", lo)
    rep.put("await_on", ln)
    rep.put("await_ratio", ln["med_us"] / lo["med_us"])
    per_call = {f"{side}_{'on' if on else 'off'}_us": v / (args.rounds * C.PIPELINE_N) * 1e6
                for (side, on), v in cpu.items()}
    rep.put("cpu_per_call", per_call)
    rep.emit()
    print(f"recording on {args.mode}, {args.rounds} rounds of alternating blocks\n"
          f"| workload | off | on | on/off |\n|---|---|---|---|\n"
          f"| pipelined 10k, sync (msg/s; µs a call) | {po / 1e3:.0f}k; {1e6 / po:.2f} | "
          f"{pn / 1e3:.0f}k; {1e6 / pn:.2f} | {pn / po:.3f} (by pairs {paired:.3f}) |\n"
          f"| call_one await, median (µs) | {lo['med_us']:.1f} | {ln['med_us']:.1f} | "
          f"{ln['med_us'] / lo['med_us']:.3f} |")
    for side in ("ctl", "worker"):
        off, on = per_call[f"{side}_off_us"], per_call[f"{side}_on_us"]
        print(f"| CPU a pipelined call, {'controller' if side == 'ctl' else 'worker'} (µs) | "
              f"{off:.2f} | {on:.2f} | {on / off:.3f} |")


if __name__ == "__main__":
    main()
