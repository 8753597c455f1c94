"""Views over one actor mesh: extents, flatten, rename, slicing steps; spawn keywords."""
from monarch.actor import Actor, endpoint, this_host


class Tagged(Actor):
    def __init__(self, tag: str, scale: int = 1):
        self.tag = tag
        self.scale = scale

    @endpoint
    def describe(self, x: int) -> str:
        return f"{self.tag}:{x * self.scale}"


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 4})
    tagged = procs.spawn("tagged", Tagged, "t", scale=3)
    print("extent", dict(tagged.extent))
    print("procs extent", dict(procs.extent))
    flat = tagged.flatten("rank")
    print("flat extent", dict(flat.extent))
    evens = flat.slice(rank=slice(0, 8, 2))
    print("evens", list(evens.describe.call(1).get().values()))
    renamed = tagged.rename(gpus="devices")
    print("renamed extent", dict(renamed.extent))
    print("renamed one", renamed.slice(hosts=1, devices=3).describe.call_one(2).get(timeout=30))
    column = tagged.slice(gpus=2)
    print("column", dict(column.extent), list(column.describe.call(5).get().values()))
    procs.stop().get()
