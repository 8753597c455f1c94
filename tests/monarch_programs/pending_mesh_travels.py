"""An actor mesh still starting travels: returned from an endpoint, passed in a message,
sent through a port. Whoever gets it calls it as its spawner would: the calls wait until
its actors are up."""
import asyncio
import time

from monarch.actor import Actor, Channel, Port, endpoint, this_host, this_proc


class Slow(Actor):
    def __init__(self, tag: str) -> None:
        time.sleep(1.0)             # sleep: a slow constructor: the mesh is still starting when it travels
        self.tag = tag

    @endpoint
    def hello(self) -> str:
        return f"hello from {self.tag}"


class User(Actor):
    @endpoint
    async def use(self, mesh) -> list:
        return sorted((await mesh.hello.call()).values())


class Maker(Actor):
    @endpoint
    async def make(self, procs):
        return procs.spawn("returned", Slow, "returned")

    @endpoint
    async def hand_over(self, procs, user) -> list:
        return await user.use.call_one(procs.spawn("passed", Slow, "passed"))

    @endpoint
    async def send_through(self, procs, port: Port) -> None:
        port.send(procs.spawn("sent", Slow, "sent"))


async def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    await procs.initialized
    maker = this_proc().spawn("maker", Maker)
    user = this_proc().spawn("user", User)
    returned = await maker.make.call_one(procs)
    print("returned:", sorted((await returned.hello.call()).values()))
    print("passed:", await maker.hand_over.call_one(procs, user))
    port, receiver = Channel.open()
    await maker.send_through.call_one(procs, port)
    sent = await receiver.recv()
    print("sent:", await user.use.call_one(sent))
    await procs.stop()


if __name__ == "__main__":
    asyncio.run(main())
