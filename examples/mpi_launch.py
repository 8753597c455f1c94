"""hpcmesh under an MPI launcher: every MPI rank is one process of the mesh.

    mpiexec -n 4 .venv/bin/python -m hpcmesh.mpi --script examples/mpi_launch.py
    srun --mpi=pmi2 -N2 --ntasks-per-node=2 .venv/bin/python -m hpcmesh.mpi \\
        --script examples/mpi_launch.py

Rank 0 runs this file as the controller (and keeps hosting its own actor); the
mesh's extent is {"hosts": nodes, "gpus": ranks per node}. Actors may use
mpi4py themselves: MPI is already initialised (MPI_THREAD_MULTIPLE) in every
rank by the launcher.
"""

import os
import socket

from hpcmesh.actor import Actor, context, endpoint
from hpcmesh.mpi import mpi_proc_mesh, world_ranks


class Worker(Actor):
    def __init__(self, scale: int):
        self.scale = scale

    @endpoint
    def where(self) -> str:
        from mpi4py import MPI
        p = context().actor_instance.rank
        return (f"point {p.coords} (flat {p.rank}) = MPI rank {MPI.COMM_WORLD.Get_rank()} "
                f"of {MPI.COMM_WORLD.Get_size()} on {socket.gethostname()}, pid {os.getpid()}")

    @endpoint
    def allreduce(self, x: int) -> int:
        """An MPI collective inside an endpoint: every member must be called together."""
        from mpi4py import MPI
        return MPI.COMM_WORLD.allreduce(x * self.scale)

    @endpoint
    async def square(self, x: int) -> int:
        return x * x


def main() -> None:
    procs = mpi_proc_mesh()
    print("extent:", dict(procs.extent))
    print(procs.to_table())
    print("MPI world ranks in mesh order:", world_ranks(procs))

    workers = procs.spawn("workers", Worker, 10)
    for line in workers.where.call().get(timeout=30).values():
        print(" ", line)
    print("square(7) on every rank:", workers.square.call(7).get(timeout=30).values())
    print("MPI allreduce of 10*1 over all ranks:", workers.allreduce.call(1).get(timeout=30)
          .values())
    first_host = workers.slice(hosts=0)
    print("slice hosts=0, gpus:", [p["gpus"] for p, _ in first_host.square.call(1).get()])
    codes = procs.stop().get(timeout=30)
    print("stopped:", sorted(codes.values()))


if __name__ == "__main__":
    main()
