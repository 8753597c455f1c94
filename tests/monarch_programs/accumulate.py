"""Accumulator folds one endpoint's results over a mesh; current_actor_name() names the actor."""
from monarch.actor import Accumulator, Actor, current_actor_name, current_rank, endpoint, this_host


class Worker(Actor):
    @endpoint
    def work(self, units: int) -> int:
        return units * (current_rank().rank + 1)

    @endpoint
    def name(self) -> bool:
        name = current_actor_name()
        return isinstance(name, str) and len(name) > 0


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    workers = procs.spawn("workers", Worker)
    total = Accumulator(workers.work, 0, lambda acc, x: acc + x)
    print("total", total.accumulate(10).get(timeout=60))
    largest = Accumulator(workers.slice(gpus=slice(0, 2)).work, 0, max)
    print("largest of two", largest.accumulate(5).get(timeout=60))
    print("named", list(workers.name.call().get(timeout=60).values()))
    procs.stop().get()
