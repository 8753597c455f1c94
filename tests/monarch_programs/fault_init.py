"""An actor whose constructor raises has failed: calls to it raise SupervisionError naming
it, the other members still serve, and the failure reaches unhandled_fault_hook (replaced
here, so that it does not end the program)."""
import time

import monarch.actor as monarch_actor
from monarch.actor import Actor, MeshFailure, current_rank, endpoint, this_host

failures = []
monarch_actor.unhandled_fault_hook = failures.append


class Picky(Actor):
    def __init__(self):
        if current_rank()["gpus"] == 1:
            raise ValueError("rank 1 refuses to start")

    @endpoint
    def ping(self) -> str:
        return "pong"


def failures_of(prefix: str, at_least: int) -> list:
    deadline = time.monotonic() + 30
    while True:
        mine = [f for f in failures if f.mesh_name.startswith(prefix)]
        if len(mine) >= at_least or time.monotonic() > deadline:
            return mine
        time.sleep(0.1)


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    picky = procs.spawn("picky", Picky)
    print("rank 0:", picky.slice(gpus=0).ping.call_one().get())
    try:
        picky.slice(gpus=1).ping.call_one().get()
    except Exception as e:  # Monarch's SupervisionError is not public
        text = str(e)
        print("rank 1:", type(e).__name__, "picky.ping" in text,
              "and all its descendants have failed" in text, "rank 1 refuses to start" in text)
    mine = failures_of("picky", 1)
    print("hook got", len(mine), [type(f) is MeshFailure for f in mine])
    print("report", ["and all its descendants have failed" in f.report() for f in mine],
          ["rank 1 refuses to start" in f.report() for f in mine])
    procs.stop().get()
