"""Actors in the controller's own process (this_proc()), next to actors in processes of
their own, as Monarch's getting-started guide begins."""
import os

from monarch.actor import Actor, ActorError, endpoint, this_host, this_proc


class Counter(Actor):
    def __init__(self, initial_value: int):
        self.value = initial_value

    @endpoint
    def increment(self) -> None:
        self.value += 1

    @endpoint
    def get_value(self) -> int:
        return self.value

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Reader(Actor):
    @endpoint
    async def read(self, counter) -> int:
        return await counter.get_value.call_one()


class Grumpy(Actor):
    @endpoint
    def say_hello(self) -> str:
        raise ValueError("not today")


if __name__ == "__main__":
    counter = this_proc().spawn("counter", Counter, initial_value=0)
    print("value", counter.get_value.call_one().get())
    print("in this process", counter.pid.call_one().get() == os.getpid())
    counter.increment.broadcast()
    counter.increment.call_one().get()
    print("value", counter.get_value.call_one().get())

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    readers = procs.spawn("readers", Reader)
    print("read remotely", list(readers.read.call(counter).get().values()))
    counters = procs.spawn("counters", Counter, 10)
    counters.slice(gpus=1).increment.broadcast()
    print("counters", list(counters.get_value.call().get().values()))
    grumpy = this_proc().spawn("grumpy", Grumpy)
    try:
        grumpy.say_hello.call_one().get()
    except ActorError as e:
        print("it did not say hello:", "not today" in str(e))
    procs.stop().get()
