"""How a Point prints: str() and repr() of current_rank() and of a ValueMesh's points."""
from monarch.actor import Actor, current_rank, endpoint, this_host


class Where(Actor):
    @endpoint
    def where(self) -> tuple:
        return str(current_rank()), repr(current_rank())


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    where = procs.spawn("where", Where)
    for s, r in sorted(where.where.call().get(timeout=60).values()):
        print(s, "|", r)
    for s, r in where.slice(gpus=1).where.call().get(timeout=60).values():
        print("slice", s, "|", r)
    print("points", [str(p) for p, _ in where.where.call().get(timeout=60).items()])
    procs.stop().get()
