"""What a broadcast costs the controller, split: sending it, and the call() that drains it.

``bench_scale.py``'s "controller CPU per broadcast" is 20 broadcasts and the one call()
that follows them, over 20; its bracketed "alone" subtracts an average call()'s CPU,
which the drain call is not (it is the first to find every member behind 20 relayed
messages), so that figure swings with the VM. This measures the three parts apart, five
rounds, medians: the controller process's CPU (every thread) while 20 ``broadcast()``
calls return (the sends happen there), the drain call() after them, and a plain call()
after a pause.

    .venv/bin/python benchmarks/bench_broadcast_split.py --scenario sim:1024x8:2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_scale import Noop, _mesh, _procs  # noqa: E402


def run(scenario: str, rounds: int) -> dict:
    hosts, per_host, job = _mesh(scenario)
    procs, stop_simulation = _procs(scenario, per_host, hosts)
    actors = procs.spawn("noop", Noop)
    n = len(actors.ping.call().get(timeout=600))
    for _ in range(3):
        actors.ping.call().get(timeout=60)
    sends, drains, plains = [], [], []
    for _ in range(rounds):
        c0 = time.process_time()
        for _ in range(20):
            actors.tick.broadcast()
        c1 = time.process_time()
        actors.ping.call().get(timeout=120)
        c2 = time.process_time()
        time.sleep(0.3)         # sleep: the members idle again before the plain call
        c3 = time.process_time()
        actors.ping.call().get(timeout=120)
        c4 = time.process_time()
        sends.append((c1 - c0) / 20 * 1e3)
        drains.append((c2 - c1) * 1e3)
        plains.append((c4 - c3) * 1e3)
    procs.stop().get(timeout=300)
    if stop_simulation is not None:
        stop_simulation()
    if job:
        job[0].kill()
    send, drain = statistics.median(sends), statistics.median(drains)
    return {"scenario": scenario, "members": n, "send_ms": send, "drain_ms": drain,
            "plain_ms": statistics.median(plains), "per_broadcast_ms": send + drain / 20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", action="append", required=True,
                    help="as bench_scale.py's (sim:HxG[:K], process:HxG, slurm:HxG)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--label", default=os.environ.get("PYTHONPATH", "this tree"))
    args = ap.parse_args()
    print("| tree | scenario | members | controller CPU: one broadcast sent ms | the drain "
          "call() after 20 ms | a plain call() ms | per broadcast with its share of the "
          "drain ms |")
    print("|---|---|---|---|---|---|---|")
    for s in args.scenario:
        r = run(s, args.rounds)
        print(f"| {args.label} | {s} | {r['members']} | {r['send_ms']:.2f} | "
              f"{r['drain_ms']:.1f} | {r['plain_ms']:.1f} | {r['per_broadcast_ms']:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
