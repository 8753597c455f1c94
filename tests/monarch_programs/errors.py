"""A failing endpoint raises ActorError in the caller; the actor keeps serving."""
from monarch.actor import Actor, ActorError, endpoint, this_host


class Fragile(Actor):
    @endpoint
    def divide(self, a: int, b: int) -> float:
        return a / b

    @endpoint
    def check(self, name: str) -> str:
        if not name:
            raise ValueError("name must not be empty")
        return f"hello {name}"


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    fragile = procs.spawn("fragile", Fragile)
    for call in (lambda: fragile.divide.call_one(1, 0).get(),
                 lambda: fragile.check.call_one("").get()):
        try:
            call()
            print("no error")
        except ActorError as e:
            text = str(e)
            print("ActorError", [word for word in ("ZeroDivisionError", "ValueError",
                                                   "name must not be empty") if word in text])
    print("still serving", fragile.divide.call_one(6, 3).get(), fragile.check.call_one("x").get())
    procs.stop().get()
