"""SlurmJob from a login node: submit host agents with sbatch, drive actors on them.

    python examples/slurm_sbatch.py                     # 3 nodes x 2 GPUs, then kill
    python examples/slurm_sbatch.py --nodes 2 --keep    # leave the job running ...
    python examples/slurm_sbatch.py --nodes 2 --keep    # ... and a rerun reconnects to it
    python examples/slurm_sbatch.py --nodes 2           # reconnect once more, then kill

The job is cached in .hpcmesh/job_state.pkl: a rerun with the same spec reconnects to
the running agents instead of queueing again (within their lease, --grace seconds
after the previous client left). The sbatch script, secret, logs and time-limit
notices live in .hpcmesh/logs/<job name>-<id>/.
"""

import argparse
import time

from hpcmesh.actor import Actor, context, endpoint
from hpcmesh.job import SlurmJob


class Trainer(Actor):
    def __init__(self):
        self.steps = 0

    @endpoint
    def where(self) -> str:
        import os
        import socket
        rank = context().actor_instance.rank
        return (f"hosts={rank['hosts']} gpus={rank['gpus']} on {socket.gethostname()} "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} "
                f"LOCAL_RANK={os.environ.get('LOCAL_RANK')}")

    @endpoint
    def train(self, n: int) -> int:
        from hpcmesh.job import slurm_notice
        for _ in range(n):
            if slurm_notice():           # Slurm's time-limit/preemption warning arrived
                break
            self.steps += 1
        return self.steps

    @endpoint
    def checkpoint(self) -> str:
        return f"checkpointed at step {self.steps}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=2, help="GPUs per node (0: none)")
    ap.add_argument("--partition", default=None)
    ap.add_argument("--time", default="00:30:00")
    ap.add_argument("--grace", type=float, default=120, help="agents' lease, seconds")
    ap.add_argument("--keep", action="store_true", help="leave the job running at the end")
    args = ap.parse_args()

    job = SlurmJob(meshes={"trainers": args.nodes}, gpus_per_node=args.gpus or None,
                   partition=args.partition, time_limit=args.time, job_name="hpcmesh-example",
                   grace=args.grace)
    t0, started = time.monotonic(), time.time()
    state = job.state()              # submits, or reconnects to the cached running job
    print(f"job {job.job_id}: {state.trainers} after {time.monotonic() - t0:.1f} s")
    t = job.timings
    if t.get("submit", 0) >= started:
        print(f"  submit -> RUNNING {t['submit_to_running_s']:.2f} s, RUNNING -> all agents "
              f"attached {t['running_to_attached_s']:.2f} s")
    else:
        print("  reconnected to the running job's agents (cached in .hpcmesh/job_state.pkl)")

    per_host = {"gpus": args.gpus} if args.gpus else {"gpus": 1}
    procs = state.trainers.spawn_procs(per_host=per_host)   # one GPU per process
    print(procs.to_table())
    trainers = procs.spawn("trainers", Trainer)
    for line in trainers.where.call().get().values():
        print(" ", line)

    # The mesh is told about Slurm's warning (--signal=B:USR1@90): checkpoint through an endpoint.
    stop = job.watch_notices(lambda n: print(f"warning from Slurm on {n['host']}: "
                                             f"{trainers.checkpoint.call().get().values()}"))
    print("trained steps:", trainers.train.call(1000).get().values())
    stop.set()
    procs.stop().get()
    if args.keep:
        print(f"leaving job {job.job_id} running; rerun within {args.grace:g} s to reconnect")
    else:
        job.kill()
        print(f"job {job.job_id} cancelled")


if __name__ == "__main__":
    main()
