"""context().actor_instance.abort(reason) fails the actor: the call that aborted still
answers, a call queued behind it and later calls raise a SupervisionError giving the
reason, and the failure reaches unhandled_fault_hook; other actors go on."""
import asyncio
import time

import monarch.actor as monarch_actor
from monarch.actor import Actor, endpoint, context, this_host

failures = []
monarch_actor.unhandled_fault_hook = failures.append


class Quitter(Actor):
    @endpoint
    def quit(self, reason) -> str:
        context().actor_instance.abort(reason)
        return "answered after abort"

    @endpoint
    def quit_quietly(self) -> str:
        context().actor_instance.abort()
        return "answered after abort"

    @endpoint
    def ping(self) -> str:
        return "pong"


class AsyncQuitter(Actor):
    @endpoint
    async def quit(self, reason) -> str:
        context().actor_instance.abort(reason)
        await asyncio.sleep(0.5)    # sleep: suspends with the abort pending
        return "answered after abort"

    @endpoint
    async def ping(self) -> str:
        return "pong"


def outcome(fut) -> str:
    try:
        return f"value {fut.get()!r}"
    except Exception as e:  # Monarch's SupervisionError is not public
        text = str(e)
        return (f"{type(e).__name__}: {'and all its descendants have failed' in text}, "
                f"{text[text.index('actor explicitly'):]!r}")


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    sync, quiet, other = (procs.spawn(n, Quitter) for n in ("sync", "quiet", "other"))
    asyn = procs.spawn("async", AsyncQuitter)
    print("sync:", outcome(sync.quit.call_one("done here")))
    print("then:", outcome(sync.ping.call_one()))
    print("no reason:", outcome(quiet.quit_quietly.call_one()))
    print("then:", outcome(quiet.ping.call_one()))
    quitting = asyn.quit.call_one("async reason")
    queued = asyn.ping.call_one()       # calls to one actor run in order: this one waits
    print("async:", outcome(quitting))
    print("queued:", outcome(queued))
    print("other actor:", outcome(other.ping.call_one()))
    deadline = time.monotonic() + 30
    names = ("sync", "quiet", "async")
    while time.monotonic() < deadline:
        failed = sorted({n for n in names for f in failures if f.mesh_name.startswith(n)})
        if len(failed) == len(names):
            break
        time.sleep(0.1)
    print("hook got failures of", failed)
    procs.stop().get()
