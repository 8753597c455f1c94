"""Accumulator gets its results through the endpoint's stream(), as Monarch's does: an
object standing in for an endpoint, with a stream() of its own, sees it used."""
from monarch.actor import Accumulator, Actor, current_rank, endpoint, this_host


class Worker(Actor):
    @endpoint
    def work(self, units: int) -> int:
        return units * (current_rank().rank + 1)


class CountingStream:
    """Stands in for an endpoint: counts its stream() calls, passes them on."""

    def __init__(self, ep):
        self.ep = ep
        self.streams = []

    def stream(self, *args, **kwargs):
        self.streams.append(args)
        return self.ep.stream(*args, **kwargs)


class TwoMembers:
    """Stands in for an endpoint: its stream is the Futures of two call_one()s."""

    def __init__(self, mesh):
        self.mesh = mesh

    def stream(self, units):
        return iter([self.mesh.slice(gpus=0).work.call_one(units),
                     self.mesh.slice(gpus=2).work.call_one(units)])


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    workers = procs.spawn("workers", Worker)
    counting = CountingStream(workers.work)
    total = Accumulator(counting, 0, lambda acc, x: acc + x)
    print("total", total.accumulate(10).get(timeout=60))
    print("through stream()", counting.streams)
    pair = Accumulator(TwoMembers(workers), 0, lambda acc, x: acc + x)
    print("ranks 0 and 2", pair.accumulate(5).get(timeout=60))
    biggest = Accumulator(workers.work, 0, max)
    print("largest", biggest.accumulate(7).get(timeout=60))
    procs.stop().get()
