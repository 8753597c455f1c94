"""gloo all_reduce through hpcmesh actors vs raw torch.distributed, in one run.

    .venv/bin/python benchmarks/bench_collectives.py            # 4 rounds x 5 blocks x 2 iters
    .venv/bin/python benchmarks/bench_collectives.py --quick    # 1 round  x 5 blocks x 2 iters
    .venv/bin/python benchmarks/bench_collectives.py --rounds 4 --blocks 8 --json out.json

Workload: all_reduce(sum) of one 64 MiB float32 tensor (16 Mi elements) over 4 ranks,
one process per rank, gloo over loopback (GLOO_SOCKET_IFNAME=lo on both sides).

Configurations (each gets fresh processes in every round):

* ``raw``: 4 processes from ``torch.multiprocessing.start_processes(start_method="spawn")``,
  ``dist.init_process_group("gloo", init_method="tcp://127.0.0.1:PORT")``, ``dist.all_reduce``;
* ``hpcmesh check=on``: ``this_host().spawn_procs({"gpus": 4})`` (default bootstrap command +
  GLOO_SOCKET_IFNAME=lo), an ActorMesh of 4 actors whose sync endpoint calls
  ``hpcmesh.collectives.all_reduce`` (default: the fingerprint check is on for CPU tensors);
* ``hpcmesh check=off``: the same with ``HPCMESH_COLLECTIVE_CHECK=0`` in the bootstrap env;
* ``MeshCollectives in raw procs`` (diagnostic): the raw processes, but instead of
  init_process_group, ``hpcmesh.collectives.MeshCollectives(rank, {"gpus": 4},
  Rendezvous(...), check=False)`` — hpcmesh's own TCPStore + ProcessGroupGloo without the
  actor runtime, to tell a gap caused by the group construction from one caused by the
  actor processes.

Timed loop (identical code on both sides, ``_block``, measured inside the ranks): per round,
3 warm-up all_reduces per configuration, then blocks of ``--block-iters`` (2) iterations:
reset the tensor to ones, barrier, each all_reduce timed with ``perf_counter``. An iteration's
time is the max over the 4 ranks; the figure is the median over all iterations of all rounds.
Bus bandwidth = 2*(n-1)/n * bytes / t (n=4), GB/s with 1 GB = 1e9 B.

Bring-up ("time to first collective", a 1-element all_reduce so that it measures bring-up
rather than 64 MiB of data; wall clock, same host):

* hpcmesh cold: ``spawn_procs()`` call -> first all_reduce completed on all 4 (new processes,
  ``spawn``, rendezvous, TCPStore, gloo group, check);
* hpcmesh warm: ``procs.spawn()`` of a second actor mesh on the running processes -> its
  first all_reduce completed (new rendezvous + store + gloo group; torch already imported);
* raw cold: ``start_processes()`` call -> first ``dist.all_reduce`` completed on all 4.

Fairness on a 2-core machine: the configurations never run concurrently. In each round the
four process sets are brought up one after the other (rotating order: round r starts with
configuration r mod 4; the cold figures are taken then), stay alive, and then take turns
block by block, the order within a turn rotating from block to block, so that slow phases
of the (shared) machine hit all of them alike. Idle sets wait in a blocking read (no CPU).
The client runtime (in-process host agent) is created before round 1 so that every cold
figure measures the same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

NRANKS = 4
NUMEL = 16 * 2**20                      # 64 MiB of float32
NBYTES = NUMEL * 4
IFNAME = "lo"
WARMUP = 3


# ----------------------------------------------------------------------------- shared block
def _block(t, all_reduce, barrier, iters: int) -> dict:
    """What both sides run per block: reset, barrier, ``iters`` individually timed all_reduces."""
    import torch
    t.fill_(1.0)
    barrier()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        all_reduce(t)
        times.append(time.perf_counter() - t0)
    expect = float(NRANKS ** iters)          # sum of ones over 4 ranks, iters times (exact)
    ok = bool(t[0].item() == expect and t[-1].item() == expect)
    return {"times": times, "ok": ok, "torch_threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS",
                                                     "HPCMESH_COLLECTIVE_CHECK")}}


# ----------------------------------------------------------------------------- raw torch
def _raw_worker(rank: int, port: int, numel: int, cmd_qs, res_q, mode: str = "raw") -> None:
    """One raw rank: init_process_group, first collective, then serve blocks until 'stop'.

    mode "mc": the same spawned process, but no init_process_group: hpcmesh's
    MeshCollectives (its own TCPStore + ProcessGroupGloo, check off) — isolates the way
    hpcmesh builds the group from everything the actor runtime adds."""
    os.environ["GLOO_SOCKET_IFNAME"] = IFNAME
    import torch
    import torch.distributed as dist
    if mode == "mc":
        from hpcmesh.collectives import MeshCollectives, Rendezvous
        mc = MeshCollectives(rank, {"gpus": NRANKS}, Rendezvous("127.0.0.1", port, "bench"),
                             timeout=120, check=False)
        all_reduce, barrier = mc.all_reduce, mc.barrier
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=NRANKS)
        all_reduce, barrier = dist.all_reduce, dist.barrier
    one = torch.ones(1)
    all_reduce(one)
    t_first = time.time()
    assert one.item() == NRANKS, one
    res_q.put({"rank": rank, "t_first": t_first})
    t = torch.ones(numel, dtype=torch.float32)
    while True:
        cmd, arg = cmd_qs[rank].get()
        if cmd == "stop":
            break
        out = _block(t, all_reduce, barrier, arg)
        out["rank"] = rank
        res_q.put(out)
    if mode == "mc":
        mc.close()
    else:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RawSet:
    """4 spawned processes with init_process_group('gloo'); blocks on command."""

    def __init__(self, numel: int, mode: str = "raw"):
        self.name = "raw" if mode == "raw" else "MeshCollectives in raw procs"
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.cmd_qs = [ctx.SimpleQueue() for _ in range(NRANKS)]
        self.res_q = ctx.SimpleQueue()
        port = _free_port()
        t0 = time.time()
        self.pctx = mp.start_processes(_raw_worker, args=(port, numel, self.cmd_qs, self.res_q, mode),
                                       nprocs=NRANKS, join=False, start_method="spawn")
        firsts = [self.res_q.get() for _ in range(NRANKS)]
        self.first_collective_s = max(f["t_first"] for f in firsts) - t0
        self.warm_first_collective_s = None

    def block(self, iters: int) -> list[dict]:
        for q in self.cmd_qs:
            q.put(("run", iters))
        return sorted((self.res_q.get() for _ in range(NRANKS)), key=lambda o: o["rank"])

    def close(self) -> None:
        for q in self.cmd_qs:
            q.put(("stop", None))
        self.pctx.join(timeout=60)


# ----------------------------------------------------------------------------- hpcmesh
def _actor_class():
    """Defined lazily so the raw workers (spawned, importing this module) never import hpcmesh."""
    from hpcmesh.actor import Actor, current_rank, endpoint

    class CollBench(Actor):
        @endpoint
        def first(self) -> float:
            import torch
            from hpcmesh import collectives
            one = torch.ones(1)
            collectives.all_reduce(one, timeout=120)
            t = time.time()
            assert one.item() == NRANKS, one
            return t

        @endpoint
        def block(self, numel: int, iters: int) -> dict:
            import torch
            from hpcmesh import collectives
            if getattr(self, "t", None) is None or self.t.numel() != numel:
                self.t = torch.ones(numel, dtype=torch.float32)
            out = _block(self.t, lambda x: collectives.all_reduce(x, timeout=120),
                         lambda: collectives.barrier(timeout=120), iters)
            out.update(rank=current_rank().rank,
                       check=collectives.get_collectives()._want_check(torch.device("cpu")))
            return out

    return CollBench


class HpcmeshSet:
    """this_host().spawn_procs({"gpus": 4}) + an ActorMesh calling hpcmesh.collectives."""

    def __init__(self, check: bool, numel: int):
        from hpcmesh.actor import default_bootstrap_cmd, this_host
        self.name = f"hpcmesh check={'on' if check else 'off'}"
        self.numel = numel
        cls = _actor_class()
        env = {"GLOO_SOCKET_IFNAME": IFNAME}
        if not check:
            env["HPCMESH_COLLECTIVE_CHECK"] = "0"
        cmd = default_bootstrap_cmd().with_env(env)
        host = this_host()
        t0 = time.time()
        self.procs = host.spawn_procs({"gpus": NRANKS}, bootstrap_command=cmd)
        try:
            self.mesh = self.procs.spawn("collbench", cls)
            firsts = self.mesh.first.call().get(timeout=300).values()
            self.first_collective_s = max(firsts) - t0
            # warm: a second actor mesh on the same (running) processes
            t1 = time.time()
            mesh2 = self.procs.spawn("collbench2", cls)
            self.warm_first_collective_s = max(mesh2.first.call().get(timeout=300).values()) - t1
        except BaseException:
            self.close()
            raise

    def block(self, iters: int) -> list[dict]:
        out = self.mesh.block.call(self.numel, iters).get(timeout=900).values()
        return sorted(out, key=lambda o: o["rank"])

    def close(self) -> None:
        self.procs.stop().get(timeout=60)


# ----------------------------------------------------------------------------- reporting
def _per_iter(ranks: list[dict]) -> list[float]:
    """Iteration i's time = the slowest rank's time for iteration i."""
    return [max(ts) for ts in zip(*(r["times"] for r in ranks))]


def busbw_gbps(t: float) -> float:
    return 2 * (NRANKS - 1) / NRANKS * NBYTES / t / 1e9


def load_avg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def tree_state() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "hpcmesh"],
                               capture_output=True, text=True, timeout=10).stdout.splitlines()
        return f"{head} + {len(dirty)} uncommitted change(s) under hpcmesh/"
    except Exception as e:  # noqa: BLE001
        return f"unknown ({e})"


MC = "MeshCollectives in raw procs"
CONFIGS = ("raw", "hpcmesh check=on", "hpcmesh check=off", MC)


def _make(cfg: str):
    if cfg == "raw":
        return RawSet(NUMEL)
    if cfg == MC:
        return RawSet(NUMEL, "mc")
    return HpcmeshSet(cfg.endswith("on"), NUMEL)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 round x 5 blocks x 2 iterations")
    ap.add_argument("--rounds", type=int, default=None, help="fresh process sets (default 4)")
    ap.add_argument("--blocks", type=int, default=None, help="blocks per round (default 5)")
    ap.add_argument("--block-iters", type=int, default=2, help="timed iterations per block")
    ap.add_argument("--json", default=None, help="write every sample here")
    ap.add_argument("--mib", type=int, default=64, help="tensor size in MiB (smoke tests only)")
    args = ap.parse_args(argv)
    global NUMEL, NBYTES
    NUMEL = args.mib * 2**20 // 4
    NBYTES = NUMEL * 4
    rounds = args.rounds or (1 if args.quick else 4)
    blocks = args.blocks or 5
    k = args.block_iters
    if not 1 <= k <= 60:
        ap.error("--block-iters must be in 1..60 (the sum of ones grows as 4**k)")
    per_cfg = rounds * blocks * k
    if per_cfg < 10:
        ap.error(f"only {per_cfg} timed iterations per configuration; need >= 10")

    print(f"bench_collectives: all_reduce {args.mib} MiB f32 x {NRANKS} ranks, gloo on {IFNAME}; "
          f"{rounds} round(s) x {blocks} blocks x {k} timed iterations per configuration "
          f"(+ {WARMUP} warm-up per round); load {load_avg()}; tree {tree_state()}",
          file=sys.stderr, flush=True)
    from hpcmesh.actor import this_host
    this_host()        # client runtime + in-process host agent, before any timed bring-up

    iters: dict[str, list[float]] = {c: [] for c in CONFIGS}
    round_meds: dict[str, list[float]] = {c: [] for c in CONFIGS}
    cold: dict[str, list[float]] = {c: [] for c in CONFIGS}
    warm: dict[str, list[float]] = {c: [] for c in CONFIGS}
    info: dict[str, dict] = {}
    ok = True
    orders, loads = [], [load_avg()]
    raw_blocks: list[dict] = []
    t_run = time.time()
    for r in range(rounds):
        order = CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]
        sets = {}
        try:
            for cfg in order:                    # bring-up: one set at a time, rotating order
                sets[cfg] = _make(cfg)
                cold[cfg].append(sets[cfg].first_collective_s)
                if sets[cfg].warm_first_collective_s is not None:
                    warm[cfg].append(sets[cfg].warm_first_collective_s)
            for cfg in order:                    # warm-up (connects, first touches)
                sets[cfg].block(WARMUP)
            this_round = {c: [] for c in CONFIGS}
            for b in range(blocks):              # interleaved blocks, rotating order
                border = order[b % len(order):] + order[:b % len(order)]
                orders.append(" → ".join(border))
                for cfg in border:
                    ranks = sets[cfg].block(k)
                    ok = ok and all(x["ok"] for x in ranks)
                    info.setdefault(cfg, {"torch_threads": sorted({x["torch_threads"] for x in ranks}),
                                          "env": ranks[0]["env"]})
                    this_round[cfg] += _per_iter(ranks)
                    raw_blocks.append({"round": r, "block": b, "cfg": cfg,
                                       "times": [x["times"] for x in ranks]})
        finally:
            for st in sets.values():
                st.close()
        for cfg in CONFIGS:
            iters[cfg] += this_round[cfg]
            round_meds[cfg].append(statistics.median(this_round[cfg]))
        loads.append(load_avg())
        print(f"  round {r + 1}: " + "; ".join(
            f"{c} median {statistics.median(this_round[c]) * 1e3:.1f} ms, cold {cold[c][-1]:.2f} s"
            + (f", warm {warm[c][-1]:.2f} s" if warm[c] else "") for c in CONFIGS)
            + f"  [load {load_avg()}]", file=sys.stderr, flush=True)

    # ---- table
    med = {c: statistics.median(iters[c]) for c in CONFIGS}
    raw_t = med["raw"]
    lines = [
        "| configuration | median ms | min–max ms | round medians ms | bus BW GB/s | "
        "throughput vs raw | spawn → 1st collective s (cold) | actor spawn → 1st collective s (warm procs) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def many(xs):
        return f"{statistics.median(xs):.3f} ({', '.join(f'{x:.2f}' for x in xs)})" if xs else "—"
    for cfg in CONFIGS:
        lines.append(
            f"| {cfg} | {med[cfg] * 1e3:.1f} | {min(iters[cfg]) * 1e3:.0f}–{max(iters[cfg]) * 1e3:.0f} | "
            f"{' / '.join(f'{x * 1e3:.0f}' for x in round_meds[cfg])} | {busbw_gbps(med[cfg]):.3f} | "
            f"{'1 (baseline)' if cfg == 'raw' else f'{raw_t / med[cfg]:.3f}'} | "
            f"{many(cold[cfg])} | {many(warm[cfg])} |")
    print("\n".join(lines))
    print()
    for cfg in CONFIGS[1:]:
        ratio = raw_t / med[cfg]
        if cfg == MC:
            print(f"- {MC} (diagnostic: hpcmesh's group construction without the actor runtime, "
                  f"check off): throughput vs raw {ratio:.3f}")
            continue
        print(f"- {cfg}: hpcmesh/raw throughput {ratio:.3f} "
              f"({'met' if ratio >= 0.95 else 'NOT met'}, target >= 0.95)")
    print(f"- {per_cfg} timed iterations per configuration ({rounds} rounds x {blocks} blocks x {k}); "
          f"the four process sets of a round are all alive, and run blocks in turn (never "
          f"concurrently); block orders: {' | '.join(orders[:len(CONFIGS)])} (repeating)")
    print(f"- results correct (4**k in the first and last element after every block): {ok}; "
          f"torch threads per rank: " + ", ".join(f"{c} {info[c]['torch_threads']}" for c in CONFIGS))
    print("- rank env: " + "; ".join(f"{c} {info[c]['env']}" for c in CONFIGS))
    print(f"- load average (1/5/15 min) at start and after each round: {' | '.join(loads)}; "
          f"wall {time.time() - t_run:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"iters": iters, "round_medians": round_meds, "cold": cold, "warm": warm,
                       "blocks": raw_blocks, "loads": loads, "info": info}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
