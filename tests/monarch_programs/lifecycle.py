"""An actor mesh stopped on its own while its processes go on; sizes and get() on results."""
from monarch.actor import Actor, current_rank, endpoint, this_host


class Shard(Actor):
    @endpoint
    def rank(self) -> int:
        return current_rank().rank


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 3})
    shards = procs.spawn("shards", Shard)
    print("sizes", shards.sizes, procs.sizes)
    ranks = shards.rank.call().get(timeout=60)
    print("get", ranks.get(4), "sizes", ranks.sizes)
    shards.stop().get(timeout=60)     # (a call to it now fails: in Monarch 0.7 it fails
    print("stopped")                  # the whole client, so this program makes none)
    fresh = procs.spawn("fresh", Shard)
    print("fresh", list(fresh.rank.call().get(timeout=60).values()))
    procs.stop().get()
