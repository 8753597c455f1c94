"""What stopping stops, and in which order: stopping an actor stops the actor meshes it
spawned (on processes it was given and on its own: their __cleanup__ runs); ProcMesh.stop()
lets the processes' Python finalizers run (__del__ of a module global); and a concurrent
endpoint still running is cancelled before __cleanup__ runs."""
import asyncio
import os
import pathlib
import tempfile
import time

from monarch.actor import Actor, Port, concurrent_endpoint, endpoint, this_host


def note(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


class Cleaned(Actor):
    def __init__(self, path: str):
        self.path = path

    @endpoint
    def check(self) -> str:
        return "ok"

    def __cleanup__(self, exc: Exception | None) -> None:
        note(self.path, "cleanup")


class Wrapper(Actor):
    """Spawns two actor meshes and has no __cleanup__ of its own."""

    def __init__(self, procs, folder: str):
        self.own_procs = this_host().spawn_procs()
        self.on_given = procs.spawn("on_given", Cleaned, os.path.join(folder, "given"))
        self.on_own = self.own_procs.spawn("on_own", Cleaned, os.path.join(folder, "own"))

    @endpoint
    def check(self) -> list:
        return [self.on_given.check.call_one().get(), self.on_own.check.call_one().get()]


class Finalized:
    def __init__(self, path: str):
        self.file = open(path, "w")     # (open() is gone by interpreter finalization)

    def __del__(self) -> None:
        self.file.write("finalized")
        self.file.close()


_sentinel = None


class KeepsGlobal(Actor):
    def __init__(self, path: str):
        global _sentinel
        _sentinel = Finalized(path)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Ordered(Actor):
    def __init__(self, path: str):
        self.path = path
        self.unblock = asyncio.Event()

    @concurrent_endpoint(explicit_response_port=True)
    async def run(self, port: Port[str]) -> None:
        port.send("started")
        try:
            await self.unblock.wait()
        finally:
            note(self.path, "task cancelled")

    async def __cleanup__(self, exc: Exception | None) -> None:
        note(self.path, "cleanup")


def wait(fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not fn() and time.monotonic() < deadline:
        time.sleep(0.1)


def read(path: str) -> list:
    p = pathlib.Path(path)
    return p.read_text().splitlines() if p.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


if __name__ == "__main__":
    folder = tempfile.mkdtemp()
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    wrapper = procs.spawn("wrapper", Wrapper, procs, folder)
    print("wrapper's meshes", wrapper.check.call_one().get())
    wrapper.stop().get()
    given, own = os.path.join(folder, "given"), os.path.join(folder, "own")
    wait(lambda: read(given) and read(own))
    print("stopping the wrapper cleaned up", read(given), read(own))

    marker = os.path.join(folder, "finalizer")
    fin_procs = this_host().spawn_procs(per_host={"gpus": 1})
    pid = fin_procs.spawn("keeps", KeepsGlobal, marker).pid.call_one().get()
    fin_procs.stop().get()
    wait(lambda: not alive(pid))
    print("finalizer after ProcMesh.stop()", pathlib.Path(marker).read_text() if
          os.path.exists(marker) else "no file")

    order = os.path.join(folder, "order")
    ord_procs = this_host().spawn_procs(per_host={"gpus": 1})
    ordered = ord_procs.spawn("ordered", Ordered, order)
    print("concurrent endpoint", ordered.run.call_one().get())
    ord_procs.stop().get()
    wait(lambda: len(read(order)) >= 2)
    print("order after ProcMesh.stop()", read(order))
    order = os.path.join(folder, "order2")
    ordered = procs.spawn("ordered", Ordered, order)
    print("concurrent endpoint", ordered.run.call_one().get())
    ordered.stop().get()
    wait(lambda: len(read(order)) >= 2)
    print("order after ActorMesh.stop()", read(order))
    procs.stop().get()
