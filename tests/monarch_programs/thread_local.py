"""A threading.local set in __init__ is seen by the actor's endpoints (sync and async actors)."""
import threading

from monarch.actor import Actor, endpoint, this_host

class SyncActor(Actor):
    def __init__(self):
        self.local = threading.local()
        self.local.tag = "sync"
        self.init_thread = threading.get_ident()

    @endpoint
    def check(self) -> tuple:
        return getattr(self.local, "tag", None), threading.get_ident() == self.init_thread


class AsyncActor(Actor):
    def __init__(self):
        self.local = threading.local()
        self.local.tag = "async"
        self.init_thread = threading.get_ident()

    @endpoint
    async def check(self) -> tuple:
        return getattr(self.local, "tag", None), threading.get_ident() == self.init_thread


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    for cls in (SyncActor, AsyncActor):
        actors = procs.spawn(cls.__name__.lower(), cls)
        for _ in range(2):
            print(cls.__name__, sorted(actors.check.call().get(timeout=60).values()))
    procs.stop().get()
