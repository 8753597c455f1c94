"""A port made on the controller is passed to actors, who send values back through it."""
from monarch.actor import Actor, Channel, Port, current_rank, endpoint, this_host


class Producer(Actor):
    @endpoint
    def produce(self, port: Port, n: int) -> None:
        for i in range(n):
            port.send((current_rank().rank, i))


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    producers = procs.spawn("producers", Producer)
    port, receiver = Channel.open()
    producers.produce.call(port, 3).get()
    got = [receiver.recv().get() for _ in range(6)]
    print("received", sorted(got))
    per_sender = {}
    for rank, i in got:
        per_sender.setdefault(rank, []).append(i)
    print("in order per sender", dict(sorted(per_sender.items())))
    procs.stop().get()
