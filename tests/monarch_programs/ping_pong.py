"""Actors that call each other directly: a mesh is passed to another actor as an argument."""
from monarch.actor import Actor, current_rank, endpoint, this_host


class Pong(Actor):
    def __init__(self):
        self.hits = 0

    @endpoint
    def hit(self, ball: int) -> int:
        self.hits += 1
        return ball + 1

    @endpoint
    def count(self) -> int:
        return self.hits


class Ping(Actor):
    def __init__(self, pong):
        self.pong = pong

    @endpoint
    async def rally(self, rounds: int) -> list:
        ball, seen = 0, []
        me = current_rank().rank
        for _ in range(rounds):
            ball = await self.pong.slice(gpus=me).hit.call_one(ball)
            seen.append(ball)
        return seen


if __name__ == "__main__":
    pong_procs = this_host().spawn_procs(per_host={"gpus": 2})
    ping_procs = this_host().spawn_procs(per_host={"gpus": 2})
    pong = pong_procs.spawn("pong", Pong)
    ping = ping_procs.spawn("ping", Ping, pong)
    rallies = ping.rally.call(3).get()
    print("rallies", [(p["gpus"], v) for p, v in rallies.items()])
    print("hits", list(pong.count.call().get().values()))
    ping_procs.stop().get()
    pong_procs.stop().get()
