"""Collectives from inside real actors: rendezvous comes from the controller."""

import pytest
from ci_gate import import_or_skip

torch = import_or_skip("torch")

from hpcmesh.actor import Actor, context, default_bootstrap_cmd, endpoint, this_host


def _spawn_rank() -> int:
    """The member's rank in the mesh it was spawned in (current_rank() follows the message:
    through a slice it is the rank in that slice)."""
    return context().actor_instance.rank.rank


class Reducer(Actor):
    @endpoint
    def all_reduce(self, dims, extent=None):
        from hpcmesh import collectives
        t = torch.full((4,), float(_spawn_rank() + 1))
        collectives.all_reduce(t, dims=dims, extent=extent, timeout=30)
        return t.tolist()

    @endpoint
    def all_gather(self, dims):
        from hpcmesh import collectives
        t = torch.tensor([_spawn_rank()])
        return [int(x) for x in collectives.all_gather(t, dims=dims, timeout=30)]

    @endpoint
    def broadcast(self, dims):
        from hpcmesh import collectives
        t = torch.tensor([float(_spawn_rank())])
        collectives.broadcast(t, src=0, dims=dims, timeout=30)
        return t.item()


@pytest.fixture(scope="module")
def mesh():
    cmd = default_bootstrap_cmd().with_env({"GLOO_SOCKET_IFNAME": "lo"})
    procs = this_host().spawn_procs({"hosts": 2, "gpus": 2}, bootstrap_command=cmd)
    yield procs.spawn("reducer", Reducer)
    procs.stop().get(timeout=30)


def _sums(groups):
    return {r: float(sum(m + 1 for m in g)) for g in groups for r in g}


def test_all_reduce_along_each_dims_choice(mesh):
    # flat ranks: (h, g) -> 2h + g
    expected = {
        "gpus": _sums([[0, 1], [2, 3]]),
        "hosts": _sums([[0, 2], [1, 3]]),
        None: _sums([[0, 1, 2, 3]]),
    }
    for dims, exp in expected.items():
        got = mesh.all_reduce.call(dims).get(timeout=60).values()
        assert [v[0] for v in got] == [exp[r] for r in range(4)], dims


def test_all_gather_and_broadcast(mesh):
    assert mesh.all_gather.call("gpus").get(timeout=60).values() == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert mesh.broadcast.call("hosts").get(timeout=60).values() == [0.0, 1.0, 0.0, 1.0]


def test_split_view_extent(mesh):
    # the same 4 processes seen as {"dp": 2, "tp": 2} (row-major), reduce along tp
    got = mesh.all_reduce.call("tp", {"dp": 2, "tp": 2}).get(timeout=60).values()
    assert [v[0] for v in got] == [3.0, 3.0, 7.0, 7.0]


class TorchrunUser(Actor):
    @endpoint
    def env(self):
        import os
        return {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                               "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}

    @endpoint
    def own_process_group(self):
        import torch.distributed as dist
        dist.init_process_group("gloo")          # no arguments: torchrun's variables
        try:
            t = torch.ones(1) * (dist.get_rank() + 1)
            dist.all_reduce(t)
            return t.item()
        finally:
            dist.destroy_process_group()


def test_torchrun_variables_let_users_init_their_own_group():
    cmd = default_bootstrap_cmd().with_env({"GLOO_SOCKET_IFNAME": "lo"})
    procs = this_host().spawn_procs({"hosts": 2, "gpus": 2}, bootstrap_command=cmd)
    try:
        m = procs.spawn("torchrun", TorchrunUser)
        envs = m.env.call().get(timeout=60).values()
        assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
        assert {e["WORLD_SIZE"] for e in envs} == {"4"}
        assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
        assert m.own_process_group.call().get(timeout=60).values() == [10.0] * 4
    finally:
        procs.stop().get(timeout=30)


def test_group_without_member_zero_on_a_fresh_mesh():
    # the first collective ever is among hosts=1 only: member 0 never joins a group, yet the
    # store it serves from spawn lets the others meet
    cmd = default_bootstrap_cmd().with_env({"GLOO_SOCKET_IFNAME": "lo"})
    procs = this_host().spawn_procs({"hosts": 2, "gpus": 2}, bootstrap_command=cmd)
    try:
        fresh = procs.spawn("fresh", Reducer)
        got = fresh.slice(hosts=1).all_reduce.call("gpus").get(timeout=60).values()
        assert [v[0] for v in got] == [7.0, 7.0]
    finally:
        procs.stop().get(timeout=30)
