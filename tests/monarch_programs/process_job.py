"""ProcessJob: two roles of local "hosts", each host its own agent process."""

import os

from monarch.actor import Actor, current_rank, endpoint
from monarch.job import ProcessJob


class Where(Actor):
    @endpoint
    def where(self) -> tuple:
        return dict(current_rank()), os.getppid()


def main() -> None:
    job = ProcessJob({"trainers": 2, "dataloaders": 1})
    state = job.state(cached_path=None)
    print("trainers", dict(state.trainers.extent))
    print("dataloaders", dict(state.dataloaders.extent))
    procs = state.trainers.spawn_procs(per_host={"gpus": 2})
    got = procs.spawn("where", Where).where.call().get()
    points = [p for p, _ in got.values()]
    hosts = [parent for _, parent in got.values()]
    print("points", points)
    print("one parent per host", hosts[0] == hosts[1] != hosts[2] == hosts[3])
    loaders = state.dataloaders.spawn_procs().spawn("where", Where).where.call().get()
    print("dataloader parent is another host", loaders.values()[0][1] not in hosts)
    procs.stop().get()
    job.kill()
    print("done")


if __name__ == "__main__":
    main()
