"""A ProcMesh passed to an actor right after spawn_procs(), while it may still be starting:
the actor spawns its own actors on it."""
from monarch.actor import Actor, endpoint, this_host, this_proc


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x * 10


class Spawner(Actor):
    @endpoint
    def use(self, procs) -> list:
        echoes = procs.spawn("echoes", Echo)
        return sorted(echoes.echo.call(4).get(timeout=60).values())


if __name__ == "__main__":
    spawner = this_proc().spawn("spawner", Spawner)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    print("used", spawner.use.call_one(procs).get(timeout=120))
    procs.stop().get()
