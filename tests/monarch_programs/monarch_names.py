"""Names of monarch.actor beyond the basics: concurrent_endpoint, send() to a Port,
Actor.logger, get_or_spawn_controller, returns_future, Future.as_asyncio, shutdown_context."""
import asyncio

from monarch.actor import (Actor, Channel, concurrent_endpoint, current_rank, endpoint,
                           get_or_spawn_controller, returns_future, send, shutdown_context,
                           this_host)


class Gate(Actor):
    def __init__(self) -> None:
        self.opened = asyncio.Event()

    @concurrent_endpoint
    async def wait(self) -> str:
        await self.opened.wait()     # only returns if `open` runs while this one waits
        return "passed"

    @concurrent_endpoint
    async def open(self) -> str:
        self.opened.set()
        return "opened"


class Worker(Actor):
    @endpoint
    def rank(self, plus: int) -> int:
        return current_rank().rank + plus

    @endpoint
    def log_name(self) -> tuple:
        self.logger.debug("a debug line")
        return self.logger.name, self.logger.getEffectiveLevel()

    @endpoint
    def registry_value(self) -> int:
        return get_or_spawn_controller("registry", Registry).get().bump.call_one().get()


class Registry(Actor):
    def __init__(self) -> None:
        self.count = 0

    @endpoint
    def bump(self) -> int:
        self.count += 1
        return self.count


@returns_future
async def doubled(f) -> int:
    return 2 * await f


async def in_asyncio(worker) -> list:
    return [await worker.rank.call_one(1).as_asyncio(), await doubled(worker.rank.call_one(2))]


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    gate = procs.slice(gpus=0).spawn("gate", Gate)
    waiting = gate.wait.call_one()
    print("concurrent", gate.open.call_one().get(timeout=60), waiting.get(timeout=60))

    workers = procs.spawn("workers", Worker)
    port, receiver = Channel.open()
    send(workers.rank, (10,), {}, port=port)
    print("send all", sorted(receiver.recv().get(timeout=60) for _ in range(2)))
    send(workers.rank, (20,), {}, port=port, selection="choose")
    print("send choose", receiver.recv().get(timeout=60) in (20, 21))
    print("logger", list(workers.log_name.call().get(timeout=60).values()))

    registry = get_or_spawn_controller("registry", Registry).get(timeout=60)
    print("registry", registry.bump.call_one().get(timeout=60))
    again = get_or_spawn_controller("registry", Registry).get(timeout=60)
    print("same registry", again.bump.call_one().get(timeout=60))
    print("from an actor", sorted(workers.registry_value.call().get(timeout=60).values()))

    one = workers.slice(gpus=1)
    print("returns_future", doubled(one.rank.call_one(5)).get(timeout=60))
    print("asyncio", asyncio.run(in_asyncio(one)))
    procs.stop().get()
    print("shutdown", shutdown_context().get(timeout=60))
