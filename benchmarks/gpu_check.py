"""hpcmesh's NCCL path on this machine's GPUs: one process per GPU, PASS/FAIL per check.

    benchmarks/gpu_check.sh                 # sets up .venv-gpu (CUDA torch) and runs this
    PYTHON=/opt/py/bin/python benchmarks/gpu_check.sh      # a python with CUDA torch already
    python benchmarks/gpu_check.py --cpu --gpus 4          # development only: the same checks on gloo/CPU

What it checks, with N = torch.cuda.device_count() processes from
``this_host().spawn_procs({"gpus": N})`` (default GPU binding: every process sees every
GPU and LOCAL_RANK selects its own, as under torchrun):

* placement: each process sees N GPUs, LOCAL_RANKs are 0..N-1, ``torch.cuda.set_device
  (LOCAL_RANK)`` makes that GPU current;
* ``spmd.device_mesh()`` is a "cuda" DeviceMesh with the mesh's dims, and
  ``dist.all_reduce`` along each of its dims (and along both dims of a ``{"dp": 2, "tp":
  N/2}`` reshape when N >= 4 is even) gives the sum over exactly that group's members;
* ``hpcmesh.collectives.all_reduce`` of a CUDA tensor: right sum, still on the GPU;
* DDP on cuda (default process group = the mesh's world): a few SGD steps on a different
  shard per rank give the same weights everywhere, equal to one process stepping on the
  whole batch;
* bus bandwidth of ``dist.all_reduce`` of ``--mib`` MiB float32 (N >= 2; per iteration
  the slowest rank, median): 2*(N-1)/N * bytes / t.

Exit status: 0 all PASS, 1 any FAIL, 2 no GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

TIMEOUT_S = 120


def _actor_class():
    from hpcmesh.actor import Actor, current_rank, endpoint

    class GpuCheck(Actor):
        """Every check's rank-side half; returns plain data, the controller judges."""

        def _dev(self):
            import torch
            return torch.device("cuda", torch.cuda.current_device()) if self.cuda \
                else torch.device("cpu")

        @endpoint
        def placement(self, cuda: bool) -> dict:
            import torch
            self.cuda = cuda
            local = int(os.environ["LOCAL_RANK"])
            if cuda:
                torch.cuda.set_device(local)
            return {"rank": current_rank().rank, "local_rank": local,
                    "visible": torch.cuda.device_count() if cuda else None,
                    "current": torch.cuda.current_device() if cuda else None,
                    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}

        @endpoint
        def mesh_all_reduce(self, extent: dict | None) -> dict:
            """device_mesh() (or a reshape), then dist.all_reduce of rank+1 along each dim."""
            import torch
            import torch.distributed as dist
            from hpcmesh import collectives, spmd
            dm = spmd.device_mesh(extent) if extent else spmd.device_mesh()
            rank = current_rank().rank
            dims = {}
            for name in dm.mesh_dim_names:
                t = torch.full((1024,), float(rank + 1), device=self._dev())
                dist.all_reduce(t, group=dm.get_group(name))
                members = collectives.group_members(name, extent=extent)
                dims[name] = {"got": t[0].item(), "all_equal": bool((t == t[0]).all().item()),
                              "want": float(sum(m + 1 for m in members)),
                              "device": str(t.device), "members": members}
            return {"rank": rank, "device_type": dm.device_type,
                    "dim_names": list(dm.mesh_dim_names), "dims": dims}

        @endpoint
        def hpcmesh_all_reduce(self) -> dict:
            import torch
            from hpcmesh import collectives
            rank = current_rank().rank
            t = torch.full((4096,), float(rank + 1), device=self._dev())
            out = collectives.all_reduce(t)
            return {"got": t[-1].item(), "same_tensor": out is t, "device": str(t.device),
                    "all_equal": bool((t == t[0]).all().item())}

        @endpoint
        def ddp(self, steps: int) -> dict:
            """A few DDP steps, each rank on its own shard; weights and the reference."""
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel
            dev = self._dev()
            world, rank = dist.get_world_size(), dist.get_rank()

            def model():
                torch.manual_seed(0)
                return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                           torch.nn.Linear(64, 1)).to(dev)

            def batch(step: int):
                g = torch.Generator().manual_seed(1000 + step)
                x = torch.randn(16 * world, 32, generator=g)
                return x.to(dev), torch.sin(x.sum(1, keepdim=True)).to(dev)

            ddp = DistributedDataParallel(model(), device_ids=[dev.index] if self.cuda else None)
            ref = model()
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
            for step in range(steps):
                x, y = batch(step)
                shard = slice(16 * rank, 16 * (rank + 1))
                opt.zero_grad()
                torch.nn.functional.mse_loss(ddp(x[shard]), y[shard]).backward()
                opt.step()
                ref_opt.zero_grad()
                torch.nn.functional.mse_loss(ref(x), y).backward()
                ref_opt.step()
            flat = torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])
            ref_flat = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
            every = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(every, flat)
            return {"rank": rank, "world": world, "param_device": str(flat.device),
                    "same_on_all_ranks": all(torch.equal(e, every[0]) for e in every),
                    "max_diff_to_reference": (flat - ref_flat).abs().max().item(),
                    "moved": (flat - torch.cat([p.detach().reshape(-1)
                                                for p in model().parameters()])).abs().max().item()}

        @endpoint
        def bandwidth(self, numel: int, warmup: int, iters: int) -> dict:
            import torch
            import torch.distributed as dist
            dev = self._dev()
            t = torch.ones(numel, dtype=torch.float32, device=dev)
            sync = torch.cuda.synchronize if self.cuda else (lambda: None)
            for _ in range(warmup):
                dist.all_reduce(t)
            sync()
            times = []
            for _ in range(iters):
                t.fill_(1.0)
                sync()
                dist.barrier(device_ids=[dev.index]) if self.cuda else dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(t)
                sync()
                times.append(time.perf_counter() - t0)
            return {"times": times, "ok": t[0].item() == dist.get_world_size()}

    return GpuCheck


class Checks:
    """Collects PASS/FAIL lines; a check that raises is a FAIL with the error's first line."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def report(self, name: str, ok: bool, detail: str = "") -> bool:
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f": {detail}" if detail else ""), flush=True)
        if not ok:
            self.failed.append(name)
        return ok

    def run(self, name: str, fn) -> bool:
        try:
            ok, detail = fn()
        except Exception as e:  # noqa: BLE001 - reported, the other checks still run
            msg = str(e).strip().splitlines()
            return self.report(name, False, f"{type(e).__name__}: {msg[0] if msg else ''}")
        return self.report(name, ok, detail)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="all_reduce size for the bandwidth")
    ap.add_argument("--iters", type=int, default=10, help="timed bandwidth iterations")
    ap.add_argument("--steps", type=int, default=5, help="DDP steps")
    ap.add_argument("--gpus", type=int, default=None, help="processes (default: every GPU)")
    ap.add_argument("--cpu", action="store_true",
                    help="development only: run the same checks on gloo/CPU (not a GPU check)")
    args = ap.parse_args(argv)

    import torch
    cuda = not args.cpu
    if cuda:
        if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
            why = ("this torch has no CUDA (torch " + torch.__version__ + ")"
                   if torch.version.cuda is None else "torch.cuda.device_count() == 0")
            print(f"gpu_check: no NVIDIA GPU found: {why}", file=sys.stderr)
            return 2
        n = args.gpus or torch.cuda.device_count()
        print(f"gpu_check: {n} of {torch.cuda.device_count()} GPU(s) "
              f"({torch.cuda.get_device_name(0)}), torch {torch.__version__}, CUDA "
              f"{torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}",
              flush=True)
    else:
        n = args.gpus or 2
        print(f"gpu_check --cpu: {n} processes on gloo/CPU (smoke test of the script, NOT a "
              "GPU check)", flush=True)

    from hpcmesh.actor import this_host
    c = Checks()
    t_start = time.time()
    procs = this_host().spawn_procs({"gpus": n})
    try:
        m = procs.spawn("gpu_check", _actor_class())

        def placement():
            got = sorted(m.placement.call(cuda).get(timeout=TIMEOUT_S).values(),
                         key=lambda r: r["rank"])
            locals_ = [r["local_rank"] for r in got]
            ok = locals_ == list(range(n))
            if cuda:
                ok = ok and all(r["visible"] == torch.cuda.device_count() and
                                r["current"] == r["local_rank"] for r in got)
            return ok, "; ".join(f"rank {r['rank']}: LOCAL_RANK {r['local_rank']}, sees "
                                 f"{r['visible']}, current {r['current']}, CUDA_VISIBLE_DEVICES="
                                 f"{r['CUDA_VISIBLE_DEVICES']}" for r in got)
        if not c.run("placement (default binding: every GPU visible, LOCAL_RANK = current)",
                     placement):
            return 1                    # the other checks would only repeat the cause

        def mesh_check(extent):
            def check():
                got = list(m.mesh_all_reduce.call(extent).get(timeout=TIMEOUT_S).values())
                want_type = "cuda" if cuda else "cpu"
                want_dims = list(extent) if extent else ["gpus"]
                bad = [f"rank {r['rank']}: device_type {r['device_type']}, dims {r['dim_names']}"
                       for r in got if r["device_type"] != want_type or r["dim_names"] != want_dims]
                for r in got:
                    for name, d in r["dims"].items():
                        if d["got"] != d["want"] or not d["all_equal"] or \
                                not d["device"].startswith(want_type):
                            bad.append(f"rank {r['rank']} dim {name}: got {d['got']} on "
                                       f"{d['device']}, want {d['want']} (members {d['members']})")
                sizes = {name: len(d["members"]) for name, d in got[0]["dims"].items()}
                return not bad, "; ".join(bad[:4]) or f"device_type {want_type}, dims {sizes}"
            return check
        c.run("device_mesh() on " + ("cuda" if cuda else "cpu") + ", dist.all_reduce along each dim",
              mesh_check(None))
        if n >= 4 and n % 2 == 0:
            c.run(f"device_mesh(extent={{'dp': 2, 'tp': {n // 2}}}), all_reduce along dp and tp",
                  mesh_check({"dp": 2, "tp": n // 2}))

        def coll():
            got = list(m.hpcmesh_all_reduce.call().get(timeout=TIMEOUT_S).values())
            want = float(n * (n + 1) // 2)
            bad = [r for r in got if r["got"] != want or not r["all_equal"] or not r["same_tensor"]
                   or not r["device"].startswith("cuda" if cuda else "cpu")]
            return not bad, f"sum {want:g} on {got[0]['device']}" if not bad else f"{bad[:2]}"
        c.run("hpcmesh.collectives.all_reduce of a " + ("CUDA" if cuda else "CPU") + " tensor", coll)

        def ddp():
            got = list(m.ddp.call(args.steps).get(timeout=TIMEOUT_S).values())
            diff = max(r["max_diff_to_reference"] for r in got)
            ok = (all(r["same_on_all_ranks"] and r["world"] == n for r in got) and diff < 1e-4
                  and min(r["moved"] for r in got) > 1e-3
                  and all(r["param_device"].startswith("cuda" if cuda else "cpu") for r in got))
            return ok, (f"{args.steps} steps, world {got[0]['world']}, params on "
                        f"{got[0]['param_device']}, same on all ranks: "
                        f"{all(r['same_on_all_ranks'] for r in got)}, max |w - reference| {diff:.2e}")
        c.run("DDP on " + ("cuda" if cuda else "cpu") + " (weights = one process on the whole batch)",
              ddp)

        if n >= 2:
            numel = args.mib * 2**20 // 4

            def bw():
                got = list(m.bandwidth.call(numel, 3, args.iters).get(timeout=TIMEOUT_S).values())
                per_iter = [max(ts) for ts in zip(*(r["times"] for r in got))]
                med = statistics.median(per_iter)
                busbw = 2 * (n - 1) / n * numel * 4 / med / 1e9
                return all(r["ok"] for r in got), (
                    f"{args.mib} MiB f32 over {n}: median {med * 1e3:.2f} ms, bus bandwidth "
                    f"{busbw:.1f} GB/s (algorithm {numel * 4 / med / 1e9:.1f} GB/s), "
                    f"{args.iters} iterations, min-max {min(per_iter) * 1e3:.2f}-"
                    f"{max(per_iter) * 1e3:.2f} ms")
            c.run("all_reduce bus bandwidth (result right)", bw)
        else:
            print(f"-     all_reduce bus bandwidth: not measured with 1 GPU (nothing to move)")
    finally:
        procs.stop().get(timeout=60)
    print(f"gpu_check: {'FAIL: ' + ', '.join(c.failed) if c.failed else 'all PASS'} "
          f"({time.time() - t_start:.0f} s)")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
