"""Endpoints that answer through the response port they are given (explicit_response_port)
instead of returning: here, the answer is sent once a later message makes it ready."""
import asyncio

from monarch.actor import Actor, Port, endpoint, this_host


class Latch(Actor):
    def __init__(self):
        self.waiting: list = []
        self.opened = False

    @endpoint(explicit_response_port=True)
    def wait(self, port: Port, tag: str) -> None:
        if self.opened:
            port.send(f"{tag}: already open")
        else:
            self.waiting.append((port, tag))

    @endpoint
    def open(self) -> int:
        self.opened = True
        for port, tag in self.waiting:
            port.send(f"{tag}: opened")
        n, self.waiting = len(self.waiting), []
        return n


async def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    latch = procs.spawn("latch", Latch)
    first = latch.wait.call_one("a")        # calls to one actor run in order: both wait
    second = latch.wait.call_one("b")       # in the actor, unanswered, when open() comes
    print("released", await latch.open.call_one())
    print(await first, "|", await second)
    print(await latch.wait.call_one("c"))
    await procs.stop()


if __name__ == "__main__":
    asyncio.run(main())
