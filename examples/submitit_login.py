"""Host meshes through submitit, driven from a login node.

    python examples/submitit_login.py                          # cluster="local": no Slurm
    python examples/submitit_login.py --cluster debug          # submitit's in-process executor
    python examples/submitit_login.py --cluster slurm --partition debug --nodes 2

One submitit task per node runs an hpcmesh host agent that dials back to this
script; the script then starts processes on the agents, places actors on them,
runs a shell command on every host with ``exec_command``, and kills the job.
With ``--keep`` the job stays up (for ``grace`` seconds after this script exits)
and is cached in ``.hpcmesh/``, so ``hpcmesh exec -- hostname`` reaches it.
"""

from __future__ import annotations

import argparse
import os
import socket
import time

from hpcmesh.actor import Actor, context, endpoint
from hpcmesh.job import SubmititJob, activate_context, exec_command


class Trainer(Actor):
    def __init__(self, lr: float):
        self.lr = lr
        self.steps = 0

    @endpoint
    def step(self) -> int:
        self.steps += 1
        return self.steps

    @endpoint
    def where(self) -> str:
        rank = context().actor_instance.rank
        return (f"{dict(rank.items())} on {socket.gethostname()} (pid {os.getpid()}, "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '-')})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", default="local", choices=["local", "debug", "slurm"])
    ap.add_argument("--nodes", type=int, default=2, help="hosts in the mesh")
    ap.add_argument("--gpus", type=int, default=2, help="processes per host")
    ap.add_argument("--partition", default=None, help="Slurm partition (--cluster slurm)")
    ap.add_argument("--folder", default=".hpcmesh/submitit", help="submitit's job folder "
                    "(on a shared filesystem for slurm)")
    ap.add_argument("--keep", action="store_true", help="leave the job running and cached")
    args = ap.parse_args()

    params = {"timeout_min": 30}
    if args.cluster == "slurm" and args.partition:
        params["slurm_partition"] = args.partition
    job = SubmititJob(meshes={"workers": args.nodes}, folder=args.folder, cluster=args.cluster,
                      grace=120 if args.keep else 30, **params)

    t0 = time.perf_counter()
    # --keep: cache the job in the current context (.hpcmesh/<context>/state.pkl), where
    # `hpcmesh status/exec/kill` find it
    state = job.state(cached_path=activate_context() if args.keep else None)
    workers = state.workers
    print(f"{args.nodes} agent(s) attached in {time.perf_counter() - t0:.2f} s: {workers}")
    try:
        procs = workers.spawn_procs({"gpus": args.gpus})
        trainers = procs.spawn("trainers", Trainer, lr=1e-3)
        for point, where in trainers.where.call().get():
            print("  trainer", where)
        print("step() on every trainer:", trainers.step.call().get().values())
        print("step() on hosts=0 only:", trainers.slice(hosts=0).step.call().get().values())

        code = exec_command(workers, "echo $(hostname) rank $HPCMESH_RANK_hosts of "
                                     "$HPCMESH_SIZE_hosts; nproc",
                            on_output=lambda label, stream, line: print(f"  [{label}] {line}")
                            ).get(timeout=120)
        print("exec_command exit code:", code)
        procs.stop().get(timeout=30)
    finally:
        if args.keep:
            print("job kept: try `hpcmesh exec -- hostname`, then `hpcmesh kill`")
        else:
            job.kill()
            print("job killed")


if __name__ == "__main__":
    main()
