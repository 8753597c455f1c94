"""What failures say, where programs match on it: a call to an actor whose process was
killed or exited, a failure in a mesh an actor spawned for itself, calls to a stopped proc
mesh and to a stopped actor mesh, and an endpoint that raises (concurrent or not). A
SupervisionError is a RuntimeError."""
import os
import re
import signal
import time

import monarch.actor as monarch_actor
from monarch.actor import Actor, ActorError, concurrent_endpoint, endpoint, this_host

reports = []
monarch_actor.unhandled_fault_hook = lambda failure: reports.append(failure.report())


class Worker(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def ping(self) -> str:
        return "pong"

    @endpoint
    async def exit(self, code: int) -> None:
        os._exit(code)

    @endpoint
    async def check(self, name: str) -> str:
        if not name:
            raise ValueError("name must not be empty")
        return name

    @concurrent_endpoint
    async def bad(self) -> None:
        raise ValueError("concurrent boom")


class Lambda(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Nest(Actor):
    def __init__(self):
        self.nest = this_host().spawn_procs(per_host={"a_dim": 1}).spawn("nested", Lambda)

    @endpoint
    def kill_nest(self) -> None:
        os.kill(self.nest.pid.call_one().get(), signal.SIGKILL)


def matches(text: str, *patterns: str) -> list[bool]:
    return [bool(re.search(p, text, re.S)) for p in patterns]


def raised(fut, *patterns: str) -> str:
    try:
        fut.get(timeout=60)
    except RuntimeError as e:       # a SupervisionError is one
        return f"RuntimeError {matches(str(e), *patterns)}"
    except ActorError as e:
        return f"ActorError {matches(str(e), *patterns)}"
    return "no error"


def wait_for_report(*patterns: str) -> list[bool]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for r in list(reports):
            if all(matches(r, *patterns)):
                return matches(r, *patterns)
        time.sleep(0.1)
    return [False] * len(patterns)


ACTOR_FAILED = r"The actor .*and all its descendants have failed"
KILLED = r"the process this actor was running on failed: Killed\(sig=9\)"

if __name__ == "__main__":
    host = this_host()
    victims = host.spawn_procs(per_host={"gpus": 2}).spawn("victims", Worker)
    exiter_procs = host.spawn_procs(per_host={"gpus": 1})
    exiter = exiter_procs.spawn("exiter", Worker)
    alpha_procs = host.spawn_procs(per_host={"gpus": 1})
    alpha = alpha_procs.spawn("alpha", Worker)
    beta_procs = host.spawn_procs(per_host={"gpus": 1})
    beta = beta_procs.spawn("beta", Worker)
    top = host.spawn_procs(per_host={"gpus": 1}).spawn("top", Nest)
    for mesh in (victims, exiter, alpha, beta, top):
        mesh.initialized.get(timeout=60)

    print("endpoint raises:", raised(alpha.check.call_one(""), r"Actor call alpha\.check failed",
                                     "name must not be empty"))
    print("concurrent endpoint raises:", raised(alpha.bad.call_one(),
                                                r"Actor call alpha\.bad failed",
                                                "concurrent boom"))

    os.kill(victims.pid.call().get(timeout=60).item(gpus=1), signal.SIGKILL)
    print("killed process reported:", wait_for_report(r"victims\{'gpus': 1/2\}", KILLED))
    print("call to its actor:", raised(victims.slice(gpus=1).ping.call_one(),
                                       r"^Endpoint call victims\.ping\(\) failed, " +
                                       ACTOR_FAILED,
                                       r"__main__\.Worker victims\{'gpus': 1/2\}", KILLED))

    print("process exits:", raised(exiter.exit.call_one(3),
                                   r"^Endpoint call exiter\.exit\(\) failed, " + ACTOR_FAILED,
                                   r"exiter\{'gpus': 0/1\}",
                                   "the process this actor was running on exited with "
                                   "non-zero code 3"))
    print("then:", raised(exiter.ping.call_one(),
                          r"^Endpoint call exiter\.ping\(\) failed, " + ACTOR_FAILED))

    top.kill_nest.call_one().get(timeout=60)
    print("nested process killed:", wait_for_report(r"(nested|logger-.*)\{'a_dim': 0/1\}",
                                                    KILLED))

    alpha_procs.stop().get()
    print("proc mesh stopped:", raised(alpha.ping.call_one(),
                                       r"Endpoint call alpha\.ping\(\) failed, ",
                                       r"actor mesh is stopped due to proc mesh shutdown|"
                                       r"Supervision event: actor .* has status:"))
    beta.stop().get()
    print("actor mesh stopped:", raised(beta.ping.call_one(),
                                        r"Endpoint call beta\.ping\(\) failed, ",
                                        r"(The actor|Supervision event: actor) .* (and all its "
                                        r"descendants have failed|has status:).*stopped"))
    beta_procs.stop().get()
