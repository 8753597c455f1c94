"""The mission's shape and beyond: spawn, call() and broadcast over many processes.

Each scenario builds one mesh of processes, then times:

- spawn: ``spawn_procs`` + ``spawn`` of an actor + the first ``call()`` reply from every
  member (what a user waits for before the first step);
- call(): the median of ``--reps`` calls of a no-op endpoint over every member;
- broadcast + call(): a broadcast followed by one call() (the broadcast's cost shows as
  the difference to call());
- the controller's CPU per call() (the controller process's CPU time over the calls,
  every thread of it, divided by the calls and the members): the figure that grows with
  processes while the controller talks to each;
- the frames of a call() through the host agents (``HPCMESH_RELAY``, on unless 0): casts
  the controller sent and folded replies it took per call() (0 / 0: it talked to every
  process itself);
- the machine's CPU per call() (every core's busy time, ``/proc/stat``): what the
  controller, agents and members spent together, to set beside ``bench_scale_floor.py``;
- the controller's CPU per broadcast (``--reps`` broadcasts in a row, then one call() to
  drain them, over the broadcasts), and in brackets the broadcasts alone (less that
  call()'s own CPU, as measured for call() above);
- stop.

Scenarios (``--scenario``, repeatable):

- ``local:N``      this_host(), N processes (one host agent, forked from its fork server)
- ``process:HxG``  ProcessJob with H local host agents, G processes on each
- ``slurm:HxG``    SlurmJob on H nodes of the test cluster, G processes on each (bring
                   the cluster up with ``HPCMESH_TEST_NODES=H tests/cluster/up.sh`` first)
- ``sim:HxG[:K]``  simulated hosts (``simulated_hosts.py``: what it models and what not),
                   H agents with G processes each, packed into K OS processes

    .venv/bin/python benchmarks/bench_scale.py --scenario local:64 --scenario local:128
    .venv/bin/python benchmarks/bench_scale.py --scenario process:64x8 --reps 20

Prints one markdown table row per scenario and writes ``--json`` if asked. Run with the
old tree on ``PYTHONPATH`` for a before/after in one sitting (``--label`` names the tree).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from hpcmesh.actor import Actor, endpoint, this_host
from hpcmesh.runtime import relay


class Noop(Actor):
    """Async endpoints: they run on the process's loop (a simulated process has no thread
    of its own for them), the same in every scenario."""

    @endpoint
    async def ping(self) -> int:
        return 0

    @endpoint
    async def tick(self) -> None:
        return None


def _procs(scenario: str, per_host: dict, job):
    """Spawn the scenario's processes: (proc mesh, what stops a simulation)."""
    kind, _, shape = scenario.partition(":")
    if kind == "sim":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from simulated_hosts import simulated_proc_mesh
        hosts, _, rest = shape.partition("x")
        per, _, sims = rest.partition(":")
        return simulated_proc_mesh(int(hosts), int(per), int(sims or 1))
    return job.spawn_procs(per_host=per_host, name="scale"), None


def _mesh(scenario: str):
    """(host mesh, per_host, what to stop after) for ``kind:shape``."""
    kind, _, shape = scenario.partition(":")
    if kind == "local":
        return this_host(), {"gpus": int(shape)}, None
    if kind == "sim":
        return None, None, None
    hosts, _, per = shape.partition("x")
    if kind == "process":
        from hpcmesh.job import ProcessJob
        job = ProcessJob({"w": int(hosts)})
    elif kind == "slurm":
        from hpcmesh.job import SlurmJob
        job = SlurmJob(meshes={"w": int(hosts)}, job_name="hpcmesh-bench-scale",
                       timeout=300, progress=False)
    else:
        raise SystemExit(f"--scenario {scenario!r}: local:N, process:HxG, slurm:HxG or "
                         f"sim:HxG[:K]")
    t0 = time.perf_counter()
    state = job.state(cached_path=None)
    attached = time.perf_counter() - t0
    return state.w, {"gpus": int(per)}, (job, attached)


def _machine_cpu_s() -> float:
    """CPU seconds every core of this machine spent busy so far (``/proc/stat``): over a
    call() it is what the controller, the agents and every member spent, as
    ``bench_scale_floor.py`` counts it (and whatever else runs: measure on a quiet VM)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]                         # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run(scenario: str, reps: int) -> dict:
    hosts, per_host, job = _mesh(scenario)
    out: dict = {"scenario": scenario, "attached_s": job[1] if job else None}
    t0 = time.perf_counter()
    procs, stop_simulation = _procs(scenario, per_host, hosts)
    actors = procs.spawn("noop", Noop)
    n = len(actors.ping.call().get(timeout=600))
    out["members"] = n
    out["spawn_s"] = time.perf_counter() - t0
    for _ in range(3):                                   # warm the paths
        actors.ping.call().get(timeout=120)
    walls, cpu0, machine0 = [], time.process_time(), _machine_cpu_s()
    frames0 = dict(relay.STATS)
    for _ in range(reps):
        t = time.perf_counter()
        actors.ping.call().get(timeout=120)
        walls.append(time.perf_counter() - t)
    cpu = time.process_time() - cpu0
    out["machine_cpu_ms_per_call"] = (_machine_cpu_s() - machine0) / reps * 1e3
    # the controller's frames per call() through the host agents (0: it sent to each)
    out["casts_per_call"] = (relay.STATS["casts_sent"] - frames0["casts_sent"]) / reps
    out["folded_replies_per_call"] = (relay.STATS["replies_taken"]
                                      - frames0["replies_taken"]) / reps
    out["call_ms"] = statistics.median(walls) * 1e3
    out["controller_cpu_us_per_member"] = cpu / reps / n * 1e6
    walls = []
    for _ in range(reps):
        t = time.perf_counter()
        actors.tick.broadcast()
        actors.ping.call().get(timeout=120)
        walls.append(time.perf_counter() - t)
    out["broadcast_call_ms"] = statistics.median(walls) * 1e3
    cpu0 = time.process_time()          # broadcasts alone, then one call() to drain them
    for _ in range(reps):
        actors.tick.broadcast()
    actors.ping.call().get(timeout=120)
    spent = time.process_time() - cpu0
    out["controller_cpu_ms_per_broadcast"] = spent / reps * 1e3
    # a broadcast is sent on the runtime's thread after broadcast() returns: the drain call
    # is what says it was; without that call's own CPU (measured above) the broadcasts alone
    out["controller_cpu_ms_per_broadcast_alone"] = max(0.0, spent - cpu / reps) / reps * 1e3
    t = time.perf_counter()
    procs.stop().get(timeout=300)
    out["stop_s"] = time.perf_counter() - t
    if stop_simulation is not None:
        stop_simulation()
    if job:
        job[0].kill()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", action="append", required=True,
                    help="local:N, process:HxG or slurm:HxG (repeatable)")
    ap.add_argument("--reps", type=int, default=20, help="calls timed per figure")
    ap.add_argument("--label", default=os.environ.get("PYTHONPATH", "this tree"),
                    help="what tree this is, for the table")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    rows = [run(s, args.reps) for s in args.scenario]
    print("| tree | scenario | members | attached s | spawn s | call() ms | broadcast+call() ms "
          "| controller CPU µs/member/call | controller CPU ms/broadcast (alone) "
          "| casts / folded replies per call() | machine CPU ms/call | stop s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        att = f"{r['attached_s']:.1f}" if r["attached_s"] is not None else "-"
        print(f"| {args.label} | {r['scenario']} | {r['members']} | {att} | {r['spawn_s']:.1f} "
              f"| {r['call_ms']:.1f} | {r['broadcast_call_ms']:.1f} "
              f"| {r['controller_cpu_us_per_member']:.1f} "
              f"| {r['controller_cpu_ms_per_broadcast']:.2f} "
              f"({r['controller_cpu_ms_per_broadcast_alone']:.2f}) "
              f"| {r['casts_per_call']:.0f} / {r['folded_replies_per_call']:.1f} "
              f"| {r['machine_cpu_ms_per_call']:.1f} | {r['stop_s']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"label": args.label, "rows": rows}, f, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
