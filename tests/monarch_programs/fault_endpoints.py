"""Which endpoint errors fail the actor: one called with call_one() returns an ActorError
and the actor serves on; one called with broadcast(), one that answers through its
response port, and a BaseException (sys.exit) each fail their actor, whose calls then
raise and reach unhandled_fault_hook."""
import sys
import time

import monarch.actor as monarch_actor
from monarch.actor import Actor, ActorError, Port, endpoint, this_host

failures = []
monarch_actor.unhandled_fault_hook = failures.append


class Faulty(Actor):
    @endpoint
    def raises(self) -> None:
        raise ValueError("endpoint raised")

    @endpoint(explicit_response_port=True)
    def answers_later(self, port: Port) -> None:
        raise ValueError("raised instead of answering")

    @endpoint
    def quits(self) -> None:
        sys.exit(3)

    @endpoint
    def ping(self) -> str:
        return "pong"


def outcome(fut) -> str:
    try:
        return f"value {fut.get()}"
    except ActorError:
        return "ActorError"
    except Exception as e:  # Monarch's SupervisionError is not public
        return f"{type(e).__name__} {'and all its descendants have failed' in str(e)}"


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    meshes = {name: procs.spawn(name, Faulty) for name in ("called", "broadcast", "port", "quit")}
    for m in meshes.values():
        m.initialized.get()
    print("call_one:", outcome(meshes["called"].raises.call_one()),
          "then", outcome(meshes["called"].ping.call_one()))
    meshes["broadcast"].raises.broadcast()
    print("broadcast: then", outcome(meshes["broadcast"].ping.call_one()))
    print("response port:", outcome(meshes["port"].answers_later.call_one()),
          "then", outcome(meshes["port"].ping.call_one()))
    print("sys.exit:", outcome(meshes["quit"].quits.call_one()),
          "then", outcome(meshes["quit"].ping.call_one()))
    deadline = time.monotonic() + 30
    names = ("called", "broadcast", "port", "quit")
    while time.monotonic() < deadline:
        failed = sorted({n for n in names for f in failures if f.mesh_name.startswith(n)})
        if len(failed) >= 3:
            break
        time.sleep(0.1)
    print("hook got failures of", failed)
    procs.stop().get()
