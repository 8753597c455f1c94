"""An actor that spawns a mesh owns it: __supervise__ gets a MeshFailure for each failed
member. Returning True handles it (the owner serves on, nothing reaches the hook);
returning False fails the owner too, and unhandled_fault_hook gets its failure."""
import time

import monarch.actor as monarch_actor
from monarch.actor import Actor, MeshFailure, endpoint, this_host

failures = []
monarch_actor.unhandled_fault_hook = failures.append


class Child(Actor):
    @endpoint
    async def boom(self) -> None:
        raise ValueError("child went wrong")

    @endpoint
    async def ping(self) -> str:
        return "pong"


class Owner(Actor):
    def __init__(self, handles: bool):
        self.handles = handles
        self.seen = []

    @endpoint
    async def start(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"gpus": 2})
        self.kids = self.procs.spawn("kids", Child)
        await self.kids.initialized
        self.kids.slice(gpus=1).boom.broadcast()

    @endpoint
    async def report(self) -> list:
        return [(type(f) is MeshFailure, f.mesh_name.startswith("kids"),
                 "and all its descendants have failed" in f.report()) for f in self.seen]

    @endpoint
    async def call_kid(self) -> str:
        # the member that did not fail (calling the failed one from an actor fails that
        # actor in Monarch 0.7: the message is undeliverable)
        return await self.kids.slice(gpus=0).ping.call_one()

    @endpoint
    async def ping(self) -> str:
        return "pong"

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(failure)
        return self.handles


def wait(fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not fn() and time.monotonic() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    keeper = procs.spawn("keeper", Owner, True)
    dropper = procs.spawn("dropper", Owner, False)
    keeper.start.call_one().get()
    wait(lambda: keeper.report.call_one().get())
    print("keeper saw", keeper.report.call_one().get())
    print("keeper's other kid", keeper.call_kid.call_one().get())
    print("keeper", keeper.ping.call_one().get())

    dropper.start.call_one().get()
    wait(lambda: any(f.mesh_name.startswith("dropper") for f in failures))
    try:
        dropper.ping.call_one().get()
    except Exception as e:  # Monarch's SupervisionError is not public
        print("dropper", type(e).__name__, "and all its descendants have failed" in str(e))
    mine = [f for f in failures if f.mesh_name.startswith("dropper")]
    print("hook got the dropper's failure", bool(mine),
          all("child went wrong" in f.report() for f in mine))
    print("hook got a keeper failure", any(f.mesh_name.startswith(("keeper", "kids"))
                                            for f in failures))
    procs.stop().get()
