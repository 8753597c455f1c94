"""Does the controller's work per call() grow with hosts, not members? 8 a host against 2.

Issue 30's figure: the controller's CPU per ``call()`` over 64 hosts with 8 members a host,
against 2 a host (target: at most 1.5x). Two meshes spawned minutes apart land in
different phases of this VM's speed and in different machine states (576 processes
against 192), and ``bench_scale.py``'s two rows have read 1.3x to 2.1x for the same tree.
This times both on one mesh, in alternating blocks: a ``call()`` over every member, and a
``call()`` over a view of the first 2 of each host (``slice`` of the last dimension: to
the controller a mesh of 64 hosts x 2, with its own host groups, casts and replies). Per
block, the controller process's CPU (every thread) per call; per adjacent pair of blocks
(their order swapped each pair), the ratio.

What a view differs in from a mesh of 2 a host: the other members of each host are
alive, idle. What it does not differ in: what the controller does per call.

    .venv/bin/python benchmarks/bench_scale_ratio.py --scenario process:64x8
    .venv/bin/python benchmarks/bench_scale_ratio.py --scenario sim:64x8:2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_scale import Noop, _mesh, _procs  # noqa: E402


def _cpu_per_call(view, calls: int) -> float:
    """The controller's CPU seconds per call() over ``view``, ``calls`` in a row."""
    c0 = time.process_time()
    for _ in range(calls):
        view.ping.call().get(timeout=120)
    return (time.process_time() - c0) / calls


def run(scenario: str, small: int, pairs: int, calls: int) -> dict:
    hosts, per_host, job = _mesh(scenario)
    procs, stop_simulation = _procs(scenario, per_host, hosts)
    try:
        actors = procs.spawn("noop", Noop)
        actors.ping.call().get(timeout=600)
        dims = list(actors.extent)
        per_host = actors.extent[dims[-1]]
        if not 1 <= small < per_host:
            raise SystemExit(f"--small {small}: the view takes 1 to {per_host - 1} of the "
                             f"{per_host} members a host of {scenario}")
        few = actors.slice(**{dims[-1]: slice(0, small)})
        n_all, n_few = len(actors.ping.call().get(timeout=120)), len(
            few.ping.call().get(timeout=120))
        for _ in range(3):                      # warm both views (their host groups settle)
            actors.ping.call().get(timeout=120)
            few.ping.call().get(timeout=120)
        alls, fews, ratios = [], [], []
        for i in range(pairs):
            if i % 2 == 0:
                a = _cpu_per_call(actors, calls)
                f = _cpu_per_call(few, calls)
            else:
                f = _cpu_per_call(few, calls)
                a = _cpu_per_call(actors, calls)
            alls.append(a)
            fews.append(f)
            ratios.append(a / f)
    finally:
        procs.stop().get(timeout=300)
        if stop_simulation is not None:
            stop_simulation()
        if job:
            job[0].kill()
    return {"scenario": scenario, "members": n_all, "view": n_few,
            "all_ms": statistics.median(alls) * 1e3, "few_ms": statistics.median(fews) * 1e3,
            "ratio": statistics.median(ratios), "lo": min(ratios), "hi": max(ratios)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", action="append", required=True,
                    help="process:HxG, sim:HxG[:K] or slurm:HxG (repeatable)")
    ap.add_argument("--small", type=int, default=2, help="members a host in the view")
    ap.add_argument("--pairs", type=int, default=10, help="pairs of blocks")
    ap.add_argument("--calls", type=int, default=10, help="calls a block")
    ap.add_argument("--label", default=os.environ.get("PYTHONPATH", "this tree"),
                    help="what tree this is, for the table")
    args = ap.parse_args()
    if args.pairs < 1 or args.calls < 1:
        raise SystemExit(f"--pairs {args.pairs}, --calls {args.calls}: each at least 1")
    rows = [run(s, args.small, args.pairs, args.calls) for s in args.scenario]
    print("| tree | scenario | members | view | controller CPU ms/call, all | "
          "the view | ratio, median of pairs (range) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {args.label} | {r['scenario']} | {r['members']} | {r['view']} "
              f"| {r['all_ms']:.2f} | {r['few_ms']:.2f} "
              f"| {r['ratio']:.2f} ({r['lo']:.2f}–{r['hi']:.2f}) |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
