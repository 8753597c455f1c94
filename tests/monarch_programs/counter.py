"""Counters on a 1-D mesh of four processes, driven from synchronous code."""
from monarch.actor import Actor, endpoint, this_host


class Counter(Actor):
    def __init__(self, start: int):
        self.n = start

    @endpoint
    def incr(self, by: int = 1) -> None:
        self.n += by

    @endpoint
    def value(self) -> int:
        return self.n


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    counters = procs.spawn("counters", Counter, 10)
    counters.incr.broadcast()
    counters.slice(gpus=0).incr.call_one(5).get()
    counters.slice(gpus=slice(2, 4)).incr.call(100).get()
    values = counters.value.call().get()
    print("values", list(values.values()))
    print("items", [(point["gpus"], v) for point, v in values.items()])
    print("item gpus=3", values.item(gpus=3))
    print("len", len(values))
    print("one", counters.slice(gpus=1).value.call_one().get())
    print("chosen in range", 11 <= counters.value.choose().get() <= 111)
    print("streamed", sorted(f.get() for f in counters.value.stream()))
    procs.stop().get()
    print("stopped")
