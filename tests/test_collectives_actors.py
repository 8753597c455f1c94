"""Collectives from inside real actors: rendezvous comes from the controller."""

import pytest

torch = pytest.importorskip("torch")

from hpcmesh.actor import Actor, current_rank, default_bootstrap_cmd, endpoint, this_host


class Reducer(Actor):
    @endpoint
    def all_reduce(self, dims, extent=None):
        from hpcmesh import collectives
        t = torch.full((4,), float(current_rank().rank + 1))
        collectives.all_reduce(t, dims=dims, extent=extent, timeout=30)
        return t.tolist()

    @endpoint
    def all_gather(self, dims):
        from hpcmesh import collectives
        t = torch.tensor([current_rank().rank])
        return [int(x) for x in collectives.all_gather(t, dims=dims, timeout=30)]

    @endpoint
    def broadcast(self, dims):
        from hpcmesh import collectives
        t = torch.tensor([float(current_rank().rank)])
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
