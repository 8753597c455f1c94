"""Training on hpcmesh vs torchrun (issue 14): all_reduce bandwidth and spawn → first step.

    .venv/bin/python benchmarks/bench_training.py --json benchmarks/out/training.json   # full, ~6-8 min
    .venv/bin/python benchmarks/bench_training.py --quick            # smoke test: 4 MiB, 1 round
    .venv/bin/python benchmarks/bench_training.py --no-slurm         # parts a and b only

This file is also the torchrun script both sides run (``--worker allreduce|ddp``), as
``examples/train_ddp.py`` is: under torchrun or ``SPMDActor`` (RANK and MASTER_ADDR set) it
is a rank, otherwise the driver.

a. all_reduce(sum) of one 64 MiB float32 tensor over N = 4 and N = 6 ranks, one process per
   rank, gloo over loopback (GLOO_SOCKET_IFNAME=lo on both sides). Configurations:

   * ``torchrun``: ``torchrun --nproc-per-node N --master-port P bench_training.py --worker
     allreduce``: ``init_process_group("gloo")``, ``dist.all_reduce(t)``;
   * ``hpcmesh DeviceMesh``: ``this_host().spawn_procs({"gpus": N})``, an actor per process,
     ``g = spmd.device_mesh().get_group("gpus")``, ``dist.all_reduce(t, group=g)``;
   * ``hpcmesh collectives``: the same processes (a second endpoint of the same actor),
     ``hpcmesh.collectives.all_reduce(t)`` with its default fingerprint check (on for CPU).

   Timed loop (``_block``, the same function on both sides, measured inside the ranks): reset
   the tensor to ones, barrier, ``--block-iters`` all_reduces each timed with perf_counter.
   An iteration's time is the max over the ranks; the figure is the median over all
   iterations of all rounds. Bus bandwidth = 2*(N-1)/N * bytes / t, GB/s with 1 GB = 1e9 B.
   Per round and N: both process sets come up one after the other (rotating order), 3
   warm-up all_reduces each, then blocks in turn, the order rotating from block to block; an
   idle set waits in a blocking read (torchrun ranks: a socket to the driver; actors: their
   next message). The two N run one after the other (order rotating between rounds), never
   concurrently. "cold": process start (Popen of torchrun / ``spawn_procs()`` call) → first
   1-element all_reduce done on every rank.

b. spawn → first training step done, this host, 4 processes: the same tiny DDP script
   (``--worker ddp``: gloo, a 16-32-1 MLP, SGD) writes ``time.time()`` after each rank's
   first ``opt.step()``; the figure is the last rank's stamp minus the launch's start:

   * ``torchrun``: ``subprocess.Popen([torchrun, --nproc-per-node, 4, ...])`` → first step;
   * ``hpcmesh, fresh launcher``: ``subprocess.Popen([python, bench_training.py, --launch
     local])`` → first step: that process imports hpcmesh, creates the client runtime
     (``this_host()``), ``spawn_procs({"gpus": 4})``, ``setup_torch_elastic_env``,
     ``procs.spawn("t", SPMDActor).main.call([this file, --worker ddp, ...])`` — like for like
     with torchrun (a process started from a shell);
   * ``hpcmesh, running controller``: the same calls in the driver, whose client runtime was
     created before any timing: ``spawn_procs()`` call → first step.

   Rounds alternate (rotating order); median over ``--rounds`` (>= 3).

c. The same on the Slurm test cluster (3 nodes x 2 processes, partition debug), submit →
   first step, rounds alternating:

   * ``hpcmesh SlurmJob``: ``SlurmJob(meshes={"hosts": 3}, ...)`` (the submit) →
     ``.state().hosts.spawn_procs({"gpus": 2})`` → setup_torch_elastic_env → SPMDActor.main;
   * ``sbatch + srun torchrun``: ``sbatch`` (the submit) of a script running
     ``srun -N3 --ntasks-per-node=1 torchrun --nnodes 3 --nproc-per-node 2 --rdzv-backend c10d
     --rdzv-endpoint <first node>:<port>``; GLOO_SOCKET_IFNAME=eth0 (the nodes' interface;
     hpcmesh's host agents choose it themselves).

   Skipped with a message when ``sinfo`` finds no usable node (``--no-slurm`` skips it).

Fairness on a 2-core machine: nothing timed runs concurrently with anything else of this
benchmark; other users of the machine do, and the load average is printed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)       # also when SPMDActor runs this file (runpy adds no path)
from bench_collectives import load_avg, tree_state  # noqa: E402 - the same notes as there
SCRIPT = os.path.abspath(__file__)
IFNAME = "lo"
WARMUP = 3
SIZES = (4, 6)


# ----------------------------------------------------------------------------- ranks (both sides)
def _block(t, all_reduce, barrier, iters: int, n: int) -> dict:
    """What every rank runs per block: reset, barrier, ``iters`` individually timed all_reduces."""
    import torch
    t.fill_(1.0)
    barrier()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        all_reduce(t)
        times.append(time.perf_counter() - t0)
    expect = float(n ** iters)          # sum of ones over n ranks, iters times (exact in f32)
    ok = bool(t[0].item() == expect and t[-1].item() == expect)
    return {"times": times, "ok": ok, "torch_threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS")}}


def _worker_allreduce(args) -> None:
    """A torchrun rank: first collective, then blocks on the driver's command (or, without
    --ctl, one standalone measurement printed as JSON by rank 0)."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    one = torch.ones(1)
    dist.all_reduce(one)
    t_first = time.time()
    assert one.item() == n, one
    t = torch.ones(args.numel, dtype=torch.float32)
    if not args.ctl:
        _block(t, dist.all_reduce, dist.barrier, WARMUP, n)
        out = _block(t, dist.all_reduce, dist.barrier, args.iters, n)
        every = [None] * n
        dist.all_gather_object(every, out["times"])
        if rank == 0:
            per_iter = [max(ts) for ts in zip(*every)]
            med = statistics.median(per_iter)
            print(json.dumps({"world": n, "bytes": t.numel() * 4, "iter_s": per_iter,
                              "median_s": med, "busbw_gbps": busbw_gbps(med, n, t.numel() * 4),
                              "ok": out["ok"]}))
        dist.destroy_process_group()
        return
    host, port = args.ctl.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        f = s.makefile("rw")
        f.write(json.dumps({"rank": rank, "t_first": t_first}) + "\n")
        f.flush()
        for line in f:
            cmd = json.loads(line)
            if cmd["cmd"] == "stop":
                break
            out = _block(t, dist.all_reduce, dist.barrier, cmd["iters"], n)
            out["rank"] = rank
            f.write(json.dumps(out) + "\n")
            f.flush()
    dist.destroy_process_group()


def _worker_ddp(args) -> None:
    """The tiny DDP script: each rank writes when its first optimizer step is done."""
    t_start = time.time()
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    t_torch = time.time()
    dist.init_process_group("gloo")
    t_pg = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    stamps = {"t_ddp": time.time()}
    for step in range(args.steps):
        g = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(8, 16, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), torch.sin(x.sum(1, keepdim=True)))
        opt.zero_grad()
        loss.backward()                 # DDP's gradient all_reduce
        opt.step()
        if step == 0:
            stamps["t_step1"] = time.time()
    dist.destroy_process_group()
    stamps.update(t_start=t_start, t_torch=t_torch, t_pg=t_pg, rank=rank, world=world,
                  host=socket.gethostname(), loss=loss.item())
    if args.stamps:
        tmp = os.path.join(args.stamps, f".rank{rank}.tmp")
        with open(tmp, "w") as f:
            json.dump(stamps, f)
        os.replace(tmp, os.path.join(args.stamps, f"rank{rank}.json"))


def busbw_gbps(t: float, n: int, nbytes: int) -> float:
    return 2 * (n - 1) / n * nbytes / t / 1e9


# ----------------------------------------------------------------------------- a: process sets
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun() -> str:
    return os.path.join(os.path.dirname(sys.executable), "torchrun")


class TorchrunSet:
    """``torchrun --nproc-per-node n`` of ``--worker allreduce``; its ranks take commands
    from a socket of the driver."""

    name = "torchrun"

    def __init__(self, n: int, numel: int, logdir: str):
        self.n = n
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(n)
        env = dict(os.environ, GLOO_SOCKET_IFNAME=IFNAME)
        self.log = open(os.path.join(logdir, f"torchrun-allreduce-{n}-{time.time():.0f}.log"), "w")
        t0 = time.time()
        self.proc = subprocess.Popen(
            [_torchrun(), "--nproc-per-node", str(n), "--master-port", str(_free_port()), SCRIPT,
             "--worker", "allreduce", "--numel", str(numel),
             "--ctl", f"127.0.0.1:{lsock.getsockname()[1]}"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        lsock.settimeout(300)
        self.files = {}
        try:
            for _ in range(n):
                conn, _ = lsock.accept()
                conn.settimeout(None)
                f = conn.makefile("rw")
                hello = json.loads(f.readline())
                self.files[hello["rank"]] = (conn, f, hello)
        except BaseException:
            self.proc.kill()
            raise
        finally:
            lsock.close()
        self.first_collective_s = max(h["t_first"] for _, _, h in self.files.values()) - t0

    def block(self, iters: int) -> list[dict]:
        for _, f, _ in self.files.values():
            f.write(json.dumps({"cmd": "run", "iters": iters}) + "\n")
            f.flush()
        return [json.loads(self.files[r][1].readline()) for r in sorted(self.files)]

    def close(self) -> None:
        for conn, f, _ in self.files.values():
            try:
                f.write('{"cmd": "stop"}\n')
                f.flush()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        for conn, f, _ in self.files.values():
            conn.close()
        self.log.close()


def _actor_class():
    """Defined lazily (and pickled by value) so torchrun ranks never import hpcmesh."""
    from hpcmesh.actor import Actor, current_rank, endpoint

    class TrainBench(Actor):
        @endpoint
        def first(self, n: int) -> float:
            import torch
            import torch.distributed as dist
            from hpcmesh import spmd
            one = torch.ones(1)
            dist.all_reduce(one, group=spmd.device_mesh().get_group("gpus"))
            t = time.time()
            assert one.item() == n, one
            return t

        @endpoint
        def block(self, how: str, numel: int, iters: int, n: int) -> dict:
            import torch
            import torch.distributed as dist
            from hpcmesh import collectives, spmd
            if getattr(self, "t", None) is None or self.t.numel() != numel:
                self.t = torch.ones(numel, dtype=torch.float32)
            if how == "dm":
                g = spmd.device_mesh().get_group("gpus")
                out = _block(self.t, lambda x: dist.all_reduce(x, group=g),
                             lambda: dist.barrier(group=g), iters, n)
            else:
                out = _block(self.t, lambda x: collectives.all_reduce(x, timeout=120),
                             lambda: collectives.barrier(timeout=120), iters, n)
                out["check"] = collectives.get_collectives()._want_check(torch.device("cpu"))
            out["rank"] = current_rank().rank
            return out

    return TrainBench


class HpcmeshSet:
    """``this_host().spawn_procs({"gpus": n})`` + one actor mesh with both paths."""

    name = "hpcmesh"

    def __init__(self, n: int, numel: int):
        from hpcmesh.actor import default_bootstrap_cmd, this_host
        self.n, self.numel = n, numel
        cmd = default_bootstrap_cmd().with_env({"GLOO_SOCKET_IFNAME": IFNAME})
        host = this_host()
        t0 = time.time()
        self.procs = host.spawn_procs({"gpus": n}, bootstrap_command=cmd)
        try:
            self.mesh = self.procs.spawn("trainbench", _actor_class())
            self.first_collective_s = max(self.mesh.first.call(n).get(timeout=300).values()) - t0
        except BaseException:
            self.close()
            raise

    def block(self, how: str, iters: int) -> list[dict]:
        out = self.mesh.block.call(how, self.numel, iters, self.n).get(timeout=900).values()
        return sorted(out, key=lambda o: o["rank"])

    def close(self) -> None:
        self.procs.stop().get(timeout=60)


A_CONFIGS = ("torchrun", "hpcmesh DeviceMesh", "hpcmesh collectives")


def _per_iter(ranks: list[dict]) -> list[float]:
    """Iteration i's time = the slowest rank's time for iteration i."""
    return [max(ts) for ts in zip(*(r["times"] for r in ranks))]


def part_a(args, logdir: str, out: dict) -> None:
    numel = args.mib * 2**20 // 4
    res = out.setdefault("a", {n: {c: {"iters": [], "round_medians": [], "cold": []}
                                   for c in A_CONFIGS} for n in SIZES})
    info = out.setdefault("a_info", {})
    for r in range(args.rounds):
        for n in (SIZES if r % 2 == 0 else SIZES[::-1]):
            sets = {}
            try:
                kinds = ("torchrun", "hpcmesh") if r % 2 == 0 else ("hpcmesh", "torchrun")
                for kind in kinds:
                    sets[kind] = TorchrunSet(n, numel, logdir) if kind == "torchrun" \
                        else HpcmeshSet(n, numel)
                res[n]["torchrun"]["cold"].append(sets["torchrun"].first_collective_s)
                for c in A_CONFIGS[1:]:
                    res[n][c]["cold"].append(sets["hpcmesh"].first_collective_s)

                def run(cfg: str, iters: int) -> list[dict]:
                    if cfg == "torchrun":
                        return sets["torchrun"].block(iters)
                    return sets["hpcmesh"].block("dm" if "DeviceMesh" in cfg else "coll", iters)
                order = A_CONFIGS[r % 3:] + A_CONFIGS[:r % 3]
                for cfg in order:
                    run(cfg, WARMUP)
                this_round = {c: [] for c in A_CONFIGS}
                for b in range(args.blocks):
                    for cfg in order[b % 3:] + order[:b % 3]:
                        ranks = run(cfg, args.block_iters)
                        if not all(x["ok"] for x in ranks):
                            out["ok"] = False
                        info.setdefault(f"{n} {cfg}", {
                            "torch_threads": sorted({x["torch_threads"] for x in ranks}),
                            "env": ranks[0]["env"], "check": ranks[0].get("check")})
                        this_round[cfg] += _per_iter(ranks)
            finally:
                for st in sets.values():
                    st.close()
            for c in A_CONFIGS:
                res[n][c]["iters"] += this_round[c]
                res[n][c]["round_medians"].append(statistics.median(this_round[c]))
            print(f"  a round {r + 1}, {n} ranks: " + "; ".join(
                f"{c} {statistics.median(this_round[c]) * 1e3:.1f} ms" for c in A_CONFIGS)
                + f"  [load {load_avg()}]", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- b: first step
def _stamps(d: str, n: int, timeout: float = 300, proc=None) -> list[dict]:
    """The n ranks' stamp files (waits for them; a launcher that exits first is a failure)."""
    deadline = time.time() + timeout
    while True:
        files = glob.glob(os.path.join(d, "rank*.json"))
        if len(files) >= n:
            out = []
            for p in files:
                with open(p) as f:
                    out.append(json.load(f))
            return out
        if proc is not None and proc.poll() is not None and len(files) < n:
            raise RuntimeError(f"launcher exited with {proc.returncode} after {len(files)} of "
                               f"{n} stamps (see the logs)")
        if time.time() > deadline:
            raise TimeoutError(f"{len(files)} of {n} stamps in {d} after {timeout} s")
        time.sleep(0.01)


def _ddp_args(stamps: str, steps: int) -> list[str]:
    return [SCRIPT, "--worker", "ddp", "--stamps", stamps, "--steps", str(steps)]


def _summary(stamps: list[dict], t0: float, t_end: float) -> dict:
    """Seconds from t0: the last rank's first step (the figure), and where the time went."""
    last = lambda k: max(s[k] for s in stamps) - t0      # noqa: E731
    return {"first_step_s": last("t_step1"), "script_start_s": last("t_start"),
            "torch_imported_s": last("t_torch"), "pg_ready_s": last("t_pg"),
            "ddp_ready_s": last("t_ddp"),
            "launcher_exit_s": t_end - t0, "world": stamps[0]["world"],
            "hosts": sorted({s["host"] for s in stamps})}


def _log_tail(path: str) -> str:
    with open(path, errors="replace") as f:
        lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("[gpus=")]
    return " | ".join(lines[-2:])


def b_torchrun(tmp: str, logdir: str, steps: int) -> dict:
    d = tempfile.mkdtemp(dir=tmp)
    env = dict(os.environ, GLOO_SOCKET_IFNAME=IFNAME)
    with open(os.path.join(logdir, f"b-torchrun-{os.path.basename(d)}.log"), "w") as log:
        t0 = time.time()
        p = subprocess.Popen([_torchrun(), "--nproc-per-node", "4", "--master-port",
                              str(_free_port()), *_ddp_args(d, steps)],
                             env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        st = _stamps(d, 4, proc=p)
        rc = p.wait(timeout=120)
    if rc:
        raise RuntimeError(f"torchrun exited with {rc}")
    return _summary(st, t0, time.time())


def b_hpcmesh_fresh(tmp: str, logdir: str, steps: int) -> dict:
    d = tempfile.mkdtemp(dir=tmp)
    with open(os.path.join(logdir, f"b-hpcmesh-fresh-{os.path.basename(d)}.log"), "w") as log:
        t0 = time.time()
        p = subprocess.Popen([sys.executable, SCRIPT, "--launch", "local", "--stamps", d,
                              "--steps", str(steps)],
                             stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            st = _stamps(d, 4, proc=p)
        except RuntimeError as e:
            log.flush()
            raise RuntimeError(f"{e}: {_log_tail(log.name)}") from None
        rc = p.wait(timeout=120)
    if rc:
        raise RuntimeError(f"hpcmesh launcher exited with {rc}")
    return _summary(st, t0, time.time())


def hpcmesh_train(hosts, per_host: dict, stamps: str, steps: int, env: dict | None) -> None:
    """What an hpcmesh launcher does: processes, torchrun's variables, the script."""
    from hpcmesh.actor import default_bootstrap_cmd
    from hpcmesh.spmd import SPMDActor, setup_torch_elastic_env
    kw = {"bootstrap_command": default_bootstrap_cmd().with_env(env)} if env else {}
    procs = hosts.spawn_procs(per_host, **kw)
    try:
        setup_torch_elastic_env(procs)
        procs.spawn("t", SPMDActor).main.call(_ddp_args(stamps, steps)).get(timeout=300)
    finally:
        procs.stop().get(timeout=60)


def b_hpcmesh_running(tmp: str, logdir: str, steps: int) -> dict:
    from hpcmesh.actor import this_host
    d = tempfile.mkdtemp(dir=tmp)
    host = this_host()          # created before the first timing
    t0 = time.time()
    hpcmesh_train(host, {"gpus": 4}, d, steps, {"GLOO_SOCKET_IFNAME": IFNAME})
    return _summary(_stamps(d, 4, timeout=5), t0, time.time())


B_CONFIGS = {"torchrun": b_torchrun, "hpcmesh, fresh launcher": b_hpcmesh_fresh,
             "hpcmesh, running controller": b_hpcmesh_running}


def part_b(args, tmp: str, logdir: str, out: dict) -> None:
    res = out.setdefault("b", {c: [] for c in B_CONFIGS})
    names = list(B_CONFIGS)
    for r in range(args.step_rounds):
        for c in names[r % 3:] + names[:r % 3]:
            try:
                res[c].append(B_CONFIGS[c](tmp, logdir, args.steps))
            except Exception as e:      # noqa: BLE001 - reported in the table, the rest goes on
                out["failed"] = True
                res[c].append({"error": f"{type(e).__name__}: {e}"})
        print(f"  b round {r + 1}: " + "; ".join(
            f"{c} " + (f"{res[c][-1]['first_step_s']:.2f} s" if "first_step_s" in res[c][-1]
                       else res[c][-1]["error"]) for c in names)
            + f"  [load {load_avg()}]", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- c: Slurm
SBATCH = """#!/bin/bash
#SBATCH --job-name=bench-torchrun
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --partition={partition}
#SBATCH --time=00:10:00
#SBATCH --output={log}
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
export GLOO_SOCKET_IFNAME=eth0
srun -N{nodes} --ntasks-per-node=1 {torchrun} --nnodes {nodes} --nproc-per-node {per} \\
    --rdzv-backend c10d --rdzv-endpoint "$head:{port}" --rdzv-id "$SLURM_JOB_ID" {args}
"""


def _squeue_empty(ids: list[str], timeout: float = 120) -> None:
    """Wait until squeue has forgotten our jobs, so the next round starts on idle nodes."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        p = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                           timeout=30)
        if not set(p.stdout.split()) & set(ids):
            return
        time.sleep(0.1)


def c_sbatch(tmp: str, logdir: str, steps: int, nodes: int, per: int, partition: str) -> dict:
    d = tempfile.mkdtemp(dir=tmp)
    script = os.path.join(d, "job.sh")
    with open(script, "w") as f:
        f.write(SBATCH.format(nodes=nodes, partition=partition, per=per, port=29400 + os.getpid() % 500,
                              log=os.path.join(logdir, f"c-sbatch-{os.path.basename(d)}-%j.log"),
                              torchrun=_torchrun(), args=" ".join(_ddp_args(d, steps))))
    t0 = time.time()
    p = subprocess.run(["sbatch", "--parsable", script], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    if p.returncode:
        raise RuntimeError(f"sbatch failed: {p.stderr.strip()}")
    jid = p.stdout.strip().split(";")[0]
    try:
        st = _stamps(d, nodes * per, timeout=180)
        _squeue_empty([jid], timeout=60)         # the job ends by itself after the steps
        t_end = time.time()
    finally:
        subprocess.run(["scancel", jid], capture_output=True, timeout=30)
        _squeue_empty([jid])
    return {**_summary(st, t0, t_end), "job_id": jid}


def c_slurmjob(tmp: str, logdir: str, steps: int, nodes: int, per: int, partition: str) -> dict:
    from hpcmesh.job import SlurmJob
    d = tempfile.mkdtemp(dir=tmp)
    t0 = time.time()
    job = SlurmJob(meshes={"hosts": nodes}, partition=partition, job_name="bench-train",
                   exclusive=False, time_limit="00:10:00", progress=False, timeout=120,
                   log_dir=tempfile.mkdtemp(prefix="slurmjob-", dir=logdir))
    try:
        hpcmesh_train(job.state(cached_path=None).hosts, {"gpus": per}, d, steps, None)
        t_end = time.time()
        timings = {k: job.timings.get(k) for k in ("submit_to_running_s", "running_to_attached_s")}
    finally:
        ids = [str(j) for j in job.job_ids]
        job.kill()
        _squeue_empty(ids)
    return {**_summary(_stamps(d, nodes * per, timeout=5), t0, t_end), **timings,
            "job_id": ",".join(ids)}


C_CONFIGS = {"sbatch + srun torchrun": c_sbatch, "hpcmesh SlurmJob": c_slurmjob}


def slurm_usable() -> tuple[bool, str]:
    if not shutil.which("sinfo"):
        return False, "no sinfo on PATH"
    p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    states = p.stdout.split()
    ok = p.returncode == 0 and any(s in ("idle", "mixed") for s in states)
    return ok, f"sinfo: {' '.join(states) or p.stderr.strip()}"


def part_c(args, tmp: str, logdir: str, out: dict) -> None:
    res = out.setdefault("c", {c: [] for c in C_CONFIGS})
    names = list(C_CONFIGS)
    for r in range(args.slurm_rounds):
        for c in (names if r % 2 == 0 else names[::-1]):
            try:
                res[c].append(C_CONFIGS[c](tmp, logdir, args.steps, args.nodes, 2, args.partition))
            except Exception as e:      # noqa: BLE001 - reported in the table, the rest goes on
                out["failed"] = True
                res[c].append({"error": f"{type(e).__name__}: {e}"})
        print(f"  c round {r + 1}: " + "; ".join(
            f"{c} " + (f"{res[c][-1]['first_step_s']:.2f} s" if "first_step_s" in res[c][-1]
                       else res[c][-1]["error"]) for c in names)
            + f"  [load {load_avg()}]", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- reporting
def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({', '.join(f'{x:.2f}' for x in xs)})" if xs else "—"


def report(args, out: dict) -> None:
    nbytes = args.mib * 2**20 // 4 * 4
    if "a" in out:
        print(f"a. all_reduce {args.mib} MiB f32, gloo on {IFNAME}; "
              f"{args.rounds * args.blocks * args.block_iters} timed iterations per row\n")
        print("| ranks | configuration | median ms | min–max ms | round medians ms | bus BW GB/s | "
              "hpcmesh / torchrun | start → 1st collective s |")
        print("|---|---|---|---|---|---|---|---|")
        for n in SIZES:
            a = out["a"][n]
            base = statistics.median(a["torchrun"]["iters"])
            for c in A_CONFIGS:
                it = a[c]["iters"]
                m = statistics.median(it)
                ratio = "1 (baseline)" if c == "torchrun" else f"**{base / m:.3f}**"
                print(f"| {n} | {c} | {m * 1e3:.1f} | {min(it) * 1e3:.0f}–{max(it) * 1e3:.0f} | "
                      f"{' / '.join(f'{x * 1e3:.0f}' for x in a[c]['round_medians'])} | "
                      f"{busbw_gbps(m, n, nbytes):.3f} | {ratio} | {_med(a[c]['cold'])} |")
        print()
        for n in SIZES:
            base = statistics.median(out["a"][n]["torchrun"]["iters"])
            for c in A_CONFIGS[1:]:
                ratio = base / statistics.median(out["a"][n][c]["iters"])
                print(f"- {n} ranks, {c}: hpcmesh/torchrun {ratio:.3f} "
                      f"({'met' if ratio >= 0.97 else 'NOT met'}, target >= 0.97)")
        print("- rank info: " + "; ".join(f"{k}: {v}" for k, v in out["a_info"].items()))
        print(f"- results correct (n**k in the first and last element after every block): "
              f"{out.get('ok', True)}\n")
    for part, title in (("b", "b. spawn → first training step, this host, 4 processes (s)"),
                        ("c", f"c. submit → first training step, Slurm, {args.nodes} nodes x 2 (s)")):
        if part not in out:
            continue
        print(f"{title}\n")
        done = "launcher exited" if part == "b" else "done (sbatch: job left squeue; SlurmJob: procs stopped)"
        print("| configuration | first step, median (each round) | ratio to torchrun | script started | "
              f"torch imported | process group ready | DDP built | {done} |")
        print("|---|---|---|---|---|---|---|---|")
        rows = out[part]
        base_name = next(iter(rows))
        good = {c: [x for x in rows[c] if "first_step_s" in x] for c in rows}
        base = statistics.median([x["first_step_s"] for x in good[base_name]]) \
            if good[base_name] else None
        for c, xs in good.items():
            if not xs:
                print(f"| {c} | failed: {rows[c][0].get('error')} | | | | | | |")
                continue
            col = lambda k: statistics.median([x[k] for x in xs])     # noqa: E731
            m = col("first_step_s")
            ratio = "1 (baseline)" if c == base_name else (f"{m / base:.2f}" if base else "—")
            print(f"| {c} | {_med([x['first_step_s'] for x in xs])} | {ratio} | "
                  f"{col('script_start_s'):.2f} | {col('torch_imported_s'):.2f} | "
                  f"{col('pg_ready_s'):.2f} | {col('ddp_ready_s'):.2f} | {col('launcher_exit_s'):.2f} |")
        errs = [f"{c}: {x['error']}" for c in rows for x in rows[c] if "error" in x]
        if errs:
            print("\n- failures: " + "; ".join(errs))
        if part == "c":
            sj = good.get("hpcmesh SlurmJob") or []
            if sj:
                print(f"- SlurmJob timings (median): submit → RUNNING "
                      f"{statistics.median([x['submit_to_running_s'] for x in sj]):.2f} s, "
                      f"RUNNING → attached "
                      f"{statistics.median([x['running_to_attached_s'] for x in sj]):.2f} s; "
                      f"hosts {sj[0]['hosts']}")
        print()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 4 MiB, 1 round x 3 blocks, 1 round of b and c")
    ap.add_argument("--rounds", type=int, default=None, help="a: rounds (default 3)")
    ap.add_argument("--blocks", type=int, default=None, help="a: blocks per round (default 4)")
    ap.add_argument("--block-iters", type=int, default=2, help="a: timed iterations per block")
    ap.add_argument("--mib", type=int, default=None, help="a: tensor MiB (default 64)")
    ap.add_argument("--step-rounds", type=int, default=None, help="b: rounds (default 5)")
    ap.add_argument("--slurm-rounds", type=int, default=None, help="c: rounds (default 3)")
    ap.add_argument("--nodes", type=int, default=3, help="c: Slurm nodes")
    ap.add_argument("--partition", default="debug")
    ap.add_argument("--only", default="a,b,c", help="parts to run, e.g. a,b")
    ap.add_argument("--no-slurm", action="store_true", help="skip part c")
    ap.add_argument("--json", default=None, help="write every sample here")
    ap.add_argument("--steps", type=int, default=3, help="DDP steps of the b/c script")
    # the ranks' and the fresh launcher's arguments
    ap.add_argument("--worker", choices=("allreduce", "ddp"), help=argparse.SUPPRESS)
    ap.add_argument("--launch", choices=("local",), help=argparse.SUPPRESS)
    ap.add_argument("--numel", type=int, default=16 * 2**20, help=argparse.SUPPRESS)
    ap.add_argument("--iters", type=int, default=10, help=argparse.SUPPRESS)
    ap.add_argument("--ctl", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--stamps", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker == "allreduce":
        _worker_allreduce(args)
        return 0
    if args.worker == "ddp":
        _worker_ddp(args)
        return 0
    if args.launch == "local":              # b's fresh launcher: everything after Popen
        from hpcmesh.actor import this_host
        hpcmesh_train(this_host(), {"gpus": 4}, args.stamps, args.steps,
                      {"GLOO_SOCKET_IFNAME": IFNAME})
        return 0

    args.rounds = args.rounds or (1 if args.quick else 3)
    args.blocks = args.blocks or (3 if args.quick else 4)
    args.mib = args.mib or (4 if args.quick else 64)
    args.step_rounds = args.step_rounds or (1 if args.quick else 5)
    args.slurm_rounds = args.slurm_rounds or (1 if args.quick else 3)
    if not 1 <= args.block_iters <= 20:
        ap.error("--block-iters must be in 1..20 (the sum of ones grows as 6**k)")
    parts = set(args.only.split(","))
    if args.no_slurm:
        parts.discard("c")
    print(f"bench_training: parts {','.join(sorted(parts))}; a: {args.mib} MiB x {SIZES} ranks, "
          f"{args.rounds} round(s) x {args.blocks} blocks x {args.block_iters}; b: "
          f"{args.step_rounds} round(s); c: {args.slurm_rounds} round(s); load {load_avg()}; "
          f"tree {tree_state()}", file=sys.stderr, flush=True)
    out: dict = {"loads": [load_avg()]}
    tmp = tempfile.mkdtemp(prefix="bench-training-", dir=os.path.join(ROOT, ".hpcmesh")
                           if os.path.isdir(os.path.join(ROOT, ".hpcmesh")) else None)
    logdir = os.path.join(tmp, "logs")
    os.makedirs(logdir)
    t_run = time.time()
    try:
        from hpcmesh.actor import this_host
        this_host()         # client runtime + in-process host agent, before any timing
        if "a" in parts:
            part_a(args, logdir, out)
            out["loads"].append(load_avg())
        if "b" in parts:
            part_b(args, tmp, logdir, out)
            out["loads"].append(load_avg())
        if "c" in parts:
            ok, why = slurm_usable()
            if ok:
                part_c(args, tmp, logdir, out)
                out["loads"].append(load_avg())
            else:
                print(f"c. SKIPPED: no usable Slurm cluster ({why}); start it with "
                      f"tests/cluster/up.sh\n")
        report(args, out)
        print(f"- load average (1/5/15 min) at the start and after each part: "
              f"{' | '.join(out['loads'])}; wall {time.time() - t_run:.0f} s; tree {tree_state()}")
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
        return 0 if out.get("ok", True) and not out.get("failed") else 1
    except BaseException:
        out["failed"] = True
        raise
    finally:
        if os.environ.get("HPCMESH_BENCH_KEEP") or out.get("failed") or not out.get("ok", True):
            print(f"kept {tmp} (logs of every launch under logs/)", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
