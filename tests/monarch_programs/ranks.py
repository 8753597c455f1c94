"""Ranks and sizes seen inside actors on a two-dimensional mesh, and through slices."""
from monarch.actor import Actor, context, current_rank, current_size, endpoint, this_host


class Where(Actor):
    @endpoint
    def where(self) -> tuple:
        rank = context().actor_instance.rank
        message = context().message_rank
        return (rank["replicas"], rank["gpus"], rank.rank, current_rank().rank,
                dict(current_size()), {k: message[k] for k in current_size()})


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"replicas": 2, "gpus": 3})
    where = procs.spawn("where", Where)
    everyone = where.where.call().get()
    print("all", list(everyone.values()))
    corner = where.slice(replicas=1, gpus=slice(1, 3)).where.call().get()
    print("slice", [(p["gpus"], v) for p, v in corner.items()])
    print("sizes", len(everyone), len(corner))
    procs.stop().get()
