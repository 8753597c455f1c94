"""The same kind of program written with asyncio: every Future is awaited."""
import asyncio

from monarch.actor import Actor, endpoint, this_host


class Adder(Actor):
    def __init__(self, base: int):
        self.base = base

    @endpoint
    async def add(self, x: int) -> int:
        await asyncio.sleep(0.01)   # sleep: an endpoint that takes a while
        return self.base + x



class SyncAdder(Actor):
    """Monarch does not allow sync and async endpoints on one actor class."""

    def __init__(self, base: int):
        self.base = base

    @endpoint
    def add_sync(self, x: int) -> int:
        return self.base + x


async def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    adders = procs.spawn("adders", Adder, 1000)
    one = await adders.slice(gpus=1).add.call_one(1)
    print("call_one", one)
    everyone = await adders.add.call(2)
    print("call", list(everyone.values()))
    sync_adders = procs.spawn("sync_adders", SyncAdder, 2000)
    many = await asyncio.gather(*(sync_adders.slice(gpus=0).add_sync.call_one(i) for i in range(5)))
    print("gathered", many)
    await procs.stop()
    print("stopped")


if __name__ == "__main__":
    asyncio.run(main())
