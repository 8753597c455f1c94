"""hpcmesh quickstart: a 2x2 mesh of processes on this host, no Slurm needed.

    python examples/quickstart.py
"""

import asyncio

from hpcmesh.actor import Actor, context, endpoint, this_host


class Counter(Actor):
    def __init__(self, start: int):
        self.n = start

    @endpoint
    async def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    def where(self) -> str:
        rank = context().actor_instance.rank
        return f"host={rank['host']} gpu={rank['gpu']} (flat rank {rank.rank})"


def main() -> None:
    procs = this_host().spawn_procs({"host": 2, "gpu": 2})
    print("extent:", dict(procs.extent))
    print(procs.to_table())

    counters = procs.spawn("counters", Counter, 10)
    print("incr(5) on every actor:", counters.incr.call(5).get().values())

    row = counters.slice(host=1)
    print("incr(1) on the slice host=1:", row.incr.call().get().values())

    one = counters.slice(host=0, gpu=1)
    print("call_one on host=0,gpu=1:", one.where.call_one().get())

    async def from_async() -> int:
        return await one.incr.call_one(100)
    print("await from asyncio:", asyncio.run(from_async()))

    for point, value in counters.incr.call(0).get():
        print(f"  {point}: {value}")
    procs.stop().get()
    print("stopped")


if __name__ == "__main__":
    main()
