"""as_endpoint(mesh.method): a method without @endpoint called as one (call, call_one,
broadcast, explicit_response_port); read through the mesh, such a method cannot be called
directly, and as_endpoint takes nothing else."""
from monarch.actor import Actor, ActorError, Port, as_endpoint, endpoint, this_host


class Tally(Actor):
    def __init__(self) -> None:
        self.total = 0

    @endpoint
    def ping(self) -> str:
        return "pong"

    def add(self, k: int) -> int:
        self.total += k
        return self.total

    def doubled(self, port: Port, x: int) -> None:
        port.send(2 * x)

    def fails(self) -> None:
        raise ValueError("a plain method raised")


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    tally = procs.spawn("tally", Tally)
    try:
        tally.add(1)
    except RuntimeError as e:
        print("called directly: RuntimeError", "as_endpoint" in str(e))
    print("call:", sorted(as_endpoint(tally.add).call(2).get().values()))
    print("call_one:", as_endpoint(tally.slice(gpus=1).add).call_one(3).get())
    as_endpoint(tally.add).broadcast(10)
    print("after broadcast:", [v for _, v in as_endpoint(tally.add).call(0).get().items()])
    print("port:", sorted(as_endpoint(tally.doubled, explicit_response_port=True)
                           .call(21).get().values()))
    try:
        as_endpoint(tally.slice(gpus=0).fails).call_one().get()
    except ActorError as e:
        print("raised: ActorError", "a plain method raised" in str(e))
    print("still serves:", tally.slice(gpus=0).ping.call_one().get())
    for label, what in (("an endpoint", tally.ping), ("the class's function", Tally.add),
                        ("a number", 1)):
        try:
            as_endpoint(what)
        except ValueError:
            print("as_endpoint of", label, ": ValueError")
    try:
        tally.nothing
    except AttributeError:
        print("unknown name: AttributeError")
    procs.stop().get()
