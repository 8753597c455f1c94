"""Data-parallel training with torch's DDP: one script for torchrun and for hpcmesh.

As a plain torchrun script (hpcmesh is not imported on this path):

    torchrun --nproc-per-node 4 examples/train_ddp.py --out losses.json

As an hpcmesh program, which runs this same file, unchanged, in every process through
``SPMDActor`` after ``setup_torch_elastic_env``:

    python examples/train_ddp.py --out losses.json              # this host, 2 x 2 processes
    salloc -N2 python examples/train_ddp.py --allocation         # the nodes of an allocation
    python examples/train_ddp.py --slurm 3 --per-node 2          # a new SlurmJob (gloo on CPUs)

Every step trains on a global batch of ``--batch`` rows per process, cut in equal shards; so
the weights after N steps are those of N plain SGD steps on the whole batch in one process
(``reference()``), whatever the number of processes. Rank 0 writes the loss of every step and
the final weights to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

FEATURES, HIDDEN = 16, 32


def make_model(seed: int):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, 1))


def global_batch(step: int, rows: int, seed: int):
    """The step's whole batch, the same in every process (synthetic regression data)."""
    import torch
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    x = torch.randn(rows, FEATURES, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(rows, 1, generator=g)
    return x, y


def flat_weights(model) -> list[float]:
    import torch
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]).tolist()


def train(steps: int, batch: int, lr: float, seed: int) -> dict:
    """DDP training in the world torchrun's variables describe."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        return _steps(steps, batch, lr, seed, cuda)
    finally:        # after the DDP model is gone: its reducer still uses the group
        # every rank done before any tears its gloo pairs down: one that destroys its group
        # while a peer still talks to it can abort the peer at exit (torch 2.13, gloo:
        # "terminate called without an active exception", seen under torchrun)
        dist.barrier()
        dist.destroy_process_group()


def _steps(steps: int, batch: int, lr: float, seed: int, cuda: bool) -> dict:
    """The training loop; returns before the group is destroyed, with its model gone."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    model = DistributedDataParallel(make_model(seed).to(device),
                                    device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = global_batch(step, batch * world, seed)
        shard = slice(rank * batch, (rank + 1) * batch)
        x, y = x[shard].to(device), y[shard].to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()                     # DDP averages the gradients over the world
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    return {"world": world, "losses": losses, "weights": flat_weights(model.module)}


def reference(steps: int, rows: int, lr: float, seed: int) -> dict:
    """The same steps in one process on the whole batch: what DDP must end with."""
    import torch
    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = global_batch(step, rows, seed)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"world": 1, "losses": losses, "weights": flat_weights(model)}


def launch(args: argparse.Namespace, script_args: list[str]) -> None:
    """Start the processes with hpcmesh and run this file in each, as torchrun would."""
    from hpcmesh.actor import this_host
    from hpcmesh.spmd import SPMDActor, setup_torch_elastic_env

    job = None
    if args.slurm:
        from hpcmesh.job import SlurmJob
        job = SlurmJob(meshes={"hosts": args.slurm}, job_name=args.job_name,
                       time_limit="00:20:00")
        hosts = job.state().hosts
    elif args.allocation:
        from hpcmesh.job import SlurmAllocation
        job = SlurmAllocation()
        hosts = job.state().hosts
    else:
        hosts = this_host()
    per_host = {"gpus": args.per_node} if (args.slurm or args.allocation) else \
        {"hosts": 2, "gpus": args.per_node}
    procs = hosts.spawn_procs(per_host)
    try:
        print(procs.to_table())
        setup_torch_elastic_env(procs)
        trainers = procs.spawn("trainers", SPMDActor)
        trainers.main.call([os.path.abspath(__file__), *script_args]).get()
    finally:
        procs.stop().get()
        if job is not None:
            job.kill()
    if args.out:
        with open(args.out) as f:
            result = json.load(f)
        print(f"{result['world']} processes, loss {result['losses'][0]:.4f} -> "
              f"{result['losses'][-1]:.4f} after {len(result['losses'])} steps")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="rows per process and step")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="rank 0 writes the losses and final weights here (JSON)")
    ap.add_argument("--slurm", type=int, metavar="NODES", help="launch: submit a SlurmJob")
    ap.add_argument("--allocation", action="store_true", help="launch: use this allocation")
    ap.add_argument("--per-node", type=int, default=2, help="launch: processes per host")
    ap.add_argument("--job-name", default="hpcmesh-train-ddp", help="launch: the SlurmJob's name")
    args, _ = ap.parse_known_args(argv)
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:     # started by torchrun / SPMDActor
        result = train(args.steps, args.batch, args.lr, args.seed)
        if result and int(os.environ["RANK"]) == 0 and args.out:
            with open(args.out, "w") as f:
                json.dump(result, f)
        return
    keep = ["--steps", str(args.steps), "--batch", str(args.batch), "--lr", str(args.lr),
            "--seed", str(args.seed)] + (["--out", os.path.abspath(args.out)] if args.out else [])
    launch(args, keep)


if __name__ == "__main__":
    main(sys.argv[1:])
