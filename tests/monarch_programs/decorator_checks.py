"""@concurrent_endpoint refuses what it cannot run concurrently, with Monarch's ValueError:
over @endpoint (its options go to @concurrent_endpoint instead), and over a plain def."""
import re

from monarch.actor import Actor, concurrent_endpoint, endpoint, this_host


def refusal(make_class) -> str:
    try:
        make_class()
    except Exception as e:
        words = {"over_endpoint": "concurrent_endpoint does not wrap @endpoint; pass endpoint "
                                  "options to @concurrent_endpoint",
                 "sync": "concurrent_endpoint can only wrap async endpoints"}
        said = [k for k, w in words.items() if re.search(re.escape(w), str(e))]
        return f"{type(e).__name__} {said}"
    return "accepted"


def over_endpoint():
    class Twice(Actor):
        @concurrent_endpoint
        @endpoint
        async def work(self) -> int:
            return 1


def over_sync():
    class Plain(Actor):
        @concurrent_endpoint
        def work(self) -> int:
            return 1


def with_options():
    class Options(Actor):
        @concurrent_endpoint(explicit_response_port=True)
        async def work(self, port) -> None:
            port.send(1)


class Both(Actor):
    @concurrent_endpoint
    async def slow(self, n: int) -> int:
        return n * 2

    @endpoint
    async def fast(self) -> str:
        return "fast"


if __name__ == "__main__":
    print("over @endpoint:", refusal(over_endpoint))
    print("over a plain def:", refusal(over_sync))
    print("with options:", refusal(with_options))
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    both = procs.spawn("both", Both)
    print("concurrent and plain async endpoints:", both.slow.call_one(21).get(),
          both.fast.call_one().get())
    procs.stop().get()
