"""FSDP2 on the mesh's own DeviceMesh: actors, ``fully_shard(mesh=...)``, no torchrun.

    python examples/train_fsdp.py                    # this host, {"hosts": 2, "gpus": 2}
    salloc -N2 python examples/train_fsdp.py --allocation
    python examples/train_fsdp.py --slurm 3           # a new SlurmJob, 2 processes per node

Inside each actor ``hpcmesh.spmd.device_mesh()`` is the ``DeviceMesh`` of the actor mesh,
``mesh_dim_names == ("hosts", "gpus")``: FSDP2 shards the parameters along ``gpus`` and
replicates them along ``hosts`` (HSDP). The loss is averaged with ``hpcmesh.collectives`` over
the same groups. As in ``train_ddp.py`` every process trains on an equal shard of the step's
batch, so the weights must equal those of the same steps in one process, which this checks.
"""

from __future__ import annotations

import argparse
import os
import sys

import cloudpickle

from hpcmesh.actor import Actor, endpoint, this_host

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_ddp  # noqa: E402  (the model, the data and the one-process reference)

cloudpickle.register_pickle_by_value(train_ddp)   # the actors get it with the class


class FSDPTrainer(Actor):
    @endpoint
    def train(self, steps: int, batch: int, lr: float, seed: int) -> dict:
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        from hpcmesh import collectives, spmd

        mesh = spmd.device_mesh()
        model = train_ddp.make_model(seed).to(mesh.device_type)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        rank, world = dist.get_rank(), dist.get_world_size()
        losses = []
        for step in range(steps):
            x, y = train_ddp.global_batch(step, batch * world, seed)
            shard = slice(rank * batch, (rank + 1) * batch)
            loss = torch.nn.functional.mse_loss(model(x[shard].to(mesh.device_type)),
                                                y[shard].to(mesh.device_type))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(collectives.all_reduce(loss.detach().cpu(), op="avg").item())
        weights = torch.cat([p.full_tensor().reshape(-1).cpu() for p in model.parameters()])
        return {"dims": mesh.mesh_dim_names, "losses": losses, "weights": weights.tolist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8, help="rows per process and step")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--slurm", type=int, metavar="NODES", help="submit a SlurmJob")
    ap.add_argument("--allocation", action="store_true", help="use this Slurm allocation")
    ap.add_argument("--per-node", type=int, default=2)
    ap.add_argument("--job-name", default="hpcmesh-train-fsdp", help="the SlurmJob's name")
    args = ap.parse_args()

    job = None
    if args.slurm:
        from hpcmesh.job import SlurmJob
        job = SlurmJob(meshes={"hosts": args.slurm}, job_name=args.job_name,
                       time_limit="00:20:00")
    elif args.allocation:
        from hpcmesh.job import SlurmAllocation
        job = SlurmAllocation()
    hosts = job.state().hosts if job is not None else this_host()
    per_host = {"gpus": args.per_node} if job is not None else {"hosts": 2, "gpus": args.per_node}
    procs = hosts.spawn_procs(per_host)
    try:
        results = procs.spawn("fsdp", FSDPTrainer).train.call(
            args.steps, args.batch, args.lr, 0).get().values()
    finally:
        procs.stop().get()
        if job is not None:
            job.kill()
    first = results[0]
    world = len(results)
    ref = train_ddp.reference(args.steps, args.batch * world, args.lr, 0)
    same = all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(first["weights"], ref["weights"]))
    print(f"FSDP2 on DeviceMesh {first['dims']} over {world} processes: loss "
          f"{first['losses'][0]:.4f} -> {first['losses'][-1]:.4f}")
    print(f"weights equal to one process: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
