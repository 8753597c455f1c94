"""``for f in endpoint.stream(): await f`` inside async code, as sync code does with get()."""
import asyncio

from monarch.actor import Actor, current_rank, endpoint, this_host


class Square(Actor):
    @endpoint
    def square(self, x: int) -> int:
        return (x + current_rank().rank) ** 2


class Summer(Actor):
    @endpoint
    async def total(self, squares, x: int) -> int:
        return sum([await f for f in squares.square.stream(x)])


async def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    squares = procs.spawn("squares", Square)
    got = []
    for f in squares.square.stream(1):
        got.append(await f)
    print("awaited", sorted(got))
    got = [await f for f in squares.square.stream(2)]
    print("comprehension", sorted(got))
    summer = procs.slice(gpus=0).spawn("summer", Summer)
    print("inside an actor", await summer.total.call_one(squares, 3))
    await procs.stop()


if __name__ == "__main__":
    asyncio.run(main())
