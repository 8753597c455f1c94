"""A call that only broadcasts to a child which then fails returns to the client: the
child's failure goes through supervision (the parent handles none, so it fails and
unhandled_fault_hook gets it), not into the call that sent the broadcast. The parent's
later calls raise. Sync and async parents alike."""
import time

import monarch.actor as monarch_actor
from monarch.actor import Actor, endpoint, this_host

failures = []
monarch_actor.unhandled_fault_hook = failures.append


class Child(Actor):
    @endpoint
    def boom(self) -> None:
        raise ValueError("child went wrong")

    @endpoint
    def ping(self) -> str:
        return "pong"


class AsyncParent(Actor):
    def __init__(self, procs):
        self.kids = procs.spawn("kids", Child)

    @endpoint
    async def ready(self) -> str:
        return (await self.kids.ping.call()).item(gpus=0)

    @endpoint
    async def trigger(self) -> str:
        self.kids.slice(gpus=1).boom.broadcast()
        return "sent"

    @endpoint
    async def ping(self) -> str:
        return "pong"


class SyncParent(Actor):
    def __init__(self, procs):
        self.kids = procs.spawn("kids", Child)

    @endpoint
    def ready(self) -> str:
        return self.kids.ping.call().get().item(gpus=0)

    @endpoint
    def trigger(self) -> str:
        self.kids.slice(gpus=1).boom.broadcast()
        return "sent"

    @endpoint
    def ping(self) -> str:
        return "pong"


def wait(fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not fn() and time.monotonic() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    kid_procs = [this_host().spawn_procs(per_host={"gpus": 2}) for _ in range(2)]
    parents = {"async": procs.spawn("async_parent", AsyncParent, kid_procs[0]),
               "sync": procs.spawn("sync_parent", SyncParent, kid_procs[1])}
    for kind, parent in parents.items():
        print(kind, "ready", parent.ready.call_one().get())
    for kind, parent in parents.items():
        print(kind, "trigger returned", parent.trigger.call_one().get())
        wait(lambda: any(f.mesh_name.startswith(f"{kind}_parent") for f in failures))
        mine = [f for f in failures if f.mesh_name.startswith(f"{kind}_parent")]
        print(kind, "hook got the parent's failure", bool(mine),
              all("child went wrong" in f.report() for f in mine))
        try:
            parent.ping.call_one().get()
            print(kind, "parent still answers")
        except Exception as e:  # Monarch's SupervisionError is not public
            print(kind, "parent", type(e).__name__,
                  "and all its descendants have failed" in str(e))
    procs.stop().get()
    for p in kid_procs:
        p.stop().get()
