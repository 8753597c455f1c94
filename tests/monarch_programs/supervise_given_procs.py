"""An actor that spawns an actor mesh on processes it was given (by the client, in a
message) owns that actor mesh: its __supervise__ gets a MeshFailure when a child's endpoint
fails or a child's process dies. Returning False fails the owner: its callers get a
SupervisionError and unhandled_fault_hook gets the owner's failure."""
import os
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
    async def die(self) -> None:
        os._exit(7)

    @endpoint
    async def ping(self) -> str:
        return "pong"


class Owner(Actor):
    def __init__(self, handles: bool):
        self.handles = handles
        self.seen = []

    @endpoint
    async def start(self, procs, how: str) -> None:
        self.kids = procs.spawn("kids", Child)
        await self.kids.initialized
        getattr(self.kids.slice(gpus=1), how).broadcast()

    @endpoint
    async def report(self) -> list:
        return [(type(f) is MeshFailure, f.mesh_name.startswith("kids"),
                 "and all its descendants have failed" in f.report()) for f in self.seen]

    @endpoint
    async def call_kid(self) -> str:
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


def ours(prefixes):
    return [f for f in failures if f.mesh_name.startswith(prefixes)]


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    # every mesh spawned before anything fails (Monarch 0.7 refuses to spawn on processes
    # with failures), each on processes of its own
    kid_procs = {how: this_host().spawn_procs(per_host={"gpus": 2})
                 for how in ("boom", "die", "dropped")}
    owners = {"boom": procs.spawn("keeper", Owner, True),
              "die": procs.spawn("watcher", Owner, True),
              "dropped": procs.spawn("dropper", Owner, False)}
    for how in ("boom", "die"):
        owner = owners[how]
        owner.start.call_one(kid_procs[how], how).get()
        wait(lambda: owner.report.call_one().get())
        print(how, "owner saw", owner.report.call_one().get())
        print(how, "other kid", owner.call_kid.call_one().get())
        print(how, "owner", owner.ping.call_one().get())

    dropper = owners["dropped"]
    dropper.start.call_one(kid_procs["dropped"], "boom").get()
    wait(lambda: ours("dropper"))
    try:
        dropper.ping.call_one().get()
    except Exception as e:  # Monarch's SupervisionError is not public
        print("dropper", type(e).__name__, "and all its descendants have failed" in str(e))
    mine = ours("dropper")
    print("hook got the dropper's failure", bool(mine),
          all("child went wrong" in f.report() for f in mine))
    print("hook got a keeper, watcher or kids failure",
          bool(ours(("keeper", "watcher", "kids"))))
    procs.stop().get()
    for p in kid_procs.values():
        p.stop().get()
