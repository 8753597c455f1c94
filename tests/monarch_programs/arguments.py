"""Keyword arguments, tensors, and a ValueMesh passed back to actors as an argument."""
import torch

from monarch.actor import Actor, context, endpoint, this_host


class Shard(Actor):
    def __init__(self, width: int):
        self.rank = context().actor_instance.rank.rank
        self.weights = torch.full((width,), float(self.rank))

    @endpoint
    def scaled(self, factor: float = 1.0, *, offset: float = 0.0) -> torch.Tensor:
        return self.weights * factor + offset

    @endpoint
    def load(self, everyone) -> float:
        # everyone: the ValueMesh of every shard's tensor, as the controller got it
        total = sum(t.sum().item() for t in everyone.values())
        self.weights = self.weights + total
        return self.weights[0].item()

    @endpoint
    def add(self, t: torch.Tensor) -> list:
        return (self.weights + t).tolist()

    @endpoint
    def total(self, t: torch.Tensor) -> float:
        return t.sum().item() + self.rank


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    shards = procs.spawn("shards", Shard, width=4)
    tensors = shards.scaled.call(2.0, offset=0.5).get(timeout=60)
    print("scaled", [t.tolist() for t in tensors.values()])
    print("loaded", list(shards.load.call(tensors).get(timeout=60).values()))
    print("add", shards.slice(gpus=2).add.call_one(torch.arange(4.0)).get(timeout=60))
    big = torch.ones(1_000_000)
    print("big", list(shards.total.call(big).get(timeout=60).values()))
    procs.stop().get()
