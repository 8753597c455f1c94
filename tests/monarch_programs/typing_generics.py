"""Typing generics subscripted in code, not only in annotations: Port[int],
PortReceiver[int], Future[int], ValueMesh[int], Endpoint[[int], int], Channel[int].open()."""
import typing

from monarch.actor import (Accumulator, Actor, Channel, Endpoint, Future, Port, PortReceiver,
                           ValueMesh, endpoint, this_host)


class Counter(Actor):
    def __init__(self) -> None:
        self.value = 0

    @endpoint
    def incr(self, by: int) -> int:
        self.value += by
        return self.value

    @endpoint
    def report(self, port: Port[int]) -> None:
        port.send(self.value)


def total(values: ValueMesh[int]) -> int:
    return sum(values.values())


def first(f: Future[int]) -> int:
    return f.get(timeout=60)


IntPort = Port[int]
IntReceiver = PortReceiver[int]
IncrEndpoint = Endpoint[[int], int]
IntFuture = Future[int]
IntValues = ValueMesh[int]


if __name__ == "__main__":
    print("hints", sorted(typing.get_type_hints(total)), sorted(typing.get_type_hints(first)))
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    counters = procs.spawn("counters", Counter)
    one = counters.slice(gpus=0)
    print("call_one", first(one.incr.call_one(1)))
    print("call", total(counters.incr.call(2).get(timeout=60)))
    acc = Accumulator(counters.incr, 0, lambda a, b: a + b)
    print("accumulate", acc.accumulate(1).get(timeout=60))
    port, receiver = Channel[int].open()
    one.report.call_one(port).get(timeout=60)
    print("channel", receiver.recv().get(timeout=60))
    procs.stop().get()
