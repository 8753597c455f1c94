"""Inside an allocation: adopt its nodes (no new job), one host agent per node.

    salloc -N2 --gpus-per-node=2 python examples/slurm_salloc.py
    sbatch -N2 sbatch/client_in_allocation.sh examples/slurm_salloc.py

The agents are one `srun --overlap` step of the allocation you are in; they end
with kill(), with this program, or (after a crash) once their lease runs out.
"""

import os
import time

from hpcmesh.actor import Actor, context, endpoint
from hpcmesh.hosts import hosts_from_config
from hpcmesh.job import SlurmAllocation, current_allocation


class Where(Actor):
    @endpoint
    def where(self) -> str:
        import socket
        rank = context().actor_instance.rank
        return (f"{dict(rank.coords)} on {socket.gethostname()} (job "
                f"{os.environ.get('SLURM_JOB_ID')}, step {os.environ.get('SLURM_STEP_ID')}, "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}, "
                f"LOCAL_RANK={os.environ.get('LOCAL_RANK')})")


def main() -> None:
    alloc = current_allocation()
    if alloc is None:
        raise SystemExit("run me inside an allocation: salloc -N2 python examples/slurm_salloc.py")
    print(f"allocation {alloc.job_id}: nodes {alloc.nodes}, GPUs per node {alloc.gpus_per_node}")

    t0 = time.monotonic()
    if os.environ.get("HPCMESH_HOSTS"):
        hosts = hosts_from_config()          # the hosts file decides (scheduler: slurm adopts)
        job = hosts.job
    else:
        job = SlurmAllocation()
        hosts = job.state().hosts
    print(f"{hosts} in {time.monotonic() - t0:.2f} s")

    gpus = alloc.gpus_per_node or 1
    procs = hosts.spawn_procs(per_host={"gpus": gpus})
    for line in procs.spawn("where", Where).where.call().get().values():
        print(" ", line)
    procs.stop().get()
    job.kill()
    print("agents stopped; the allocation is still yours")


if __name__ == "__main__":
    main()
