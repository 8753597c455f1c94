"""hpcmesh.collectives with real processes (gloo over loopback).

A pool of 8 spawned workers (spawning is the expensive part) runs each
multi-process scenario once per module: every worker builds a
MeshCollectives on a shared rendezvous and reports plain lists; the expected
values are computed here, independently of the module's group arithmetic.
Two-member cases run as threads of this process.  No actor runtime needed.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing as mp
import os
import queue as queue_mod
import socket
import sys
import time
import traceback
from pathlib import Path

import pytest
from ci_gate import import_or_skip, skip_or_fail

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # pytest puts only tests/ on sys.path
    sys.path.insert(0, str(ROOT))

torch = import_or_skip("torch")
dist = import_or_skip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    skip_or_fail("torch.distributed with gloo is required")

from hpcmesh import collectives as C  # noqa: E402

HG22 = {"hosts": 2, "gpus": 2}
HG23 = {"hosts": 2, "gpus": 3}
BASE_DIMS = [None, "hosts", "gpus", ("gpus", "hosts"), ["hosts"], ()]
OPS = ["sum", "prod", "min", "max", "avg", "SUM_enum", "MAX_enum", "AVG_obj"]


# ---------------------------------------------------------------- helpers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vals(rank: int) -> list[float]:
    v = float(rank + 1)
    return [v, 2 * v, v * v]


def _label(extent, dims) -> str:
    return f"{'base' if extent is None else dict(extent)}|{dims!r}"


def _torch_op(name):
    R = dist.ReduceOp
    return {"SUM_enum": R.SUM, "MAX_enum": R.MAX, "AVG_obj": R(R.AVG)}.get(name, name)


def _exercise(mc, rank, dims, extent) -> dict:
    """Every op along one dims choice; returns plain lists."""
    kw = {"extent": extent}
    out = {
        "rank": mc.group_rank(dims, **kw),
        "size": mc.group_size(dims, **kw),
        "members": mc.group_members(dims, **kw),
    }
    n, me = out["size"], out["rank"]
    f64 = torch.float64
    for name in OPS:
        t = torch.tensor(_vals(rank), dtype=f64)
        assert mc.all_reduce(t, dims, _torch_op(name), **kw) is t
        out[f"all_reduce:{name}"] = t.tolist()
    ti = torch.tensor([rank + 1, 7 * (rank + 1)], dtype=torch.int64)
    out["all_reduce:int_sum"] = mc.all_reduce(ti, dims, "sum", **kw).tolist()
    ti = torch.tensor([rank + 1, 7 * (rank + 1)], dtype=torch.int64)
    out["all_reduce:int_avg"] = mc.all_reduce(ti, dims, "avg", **kw).tolist()
    v = _vals(rank)
    nc = torch.tensor([[v[0], v[1]], [v[2], 0.0]], dtype=f64).t()
    assert not nc.is_contiguous()
    mc.all_reduce(nc, dims, **kw)
    out["all_reduce:noncontig"] = nc.tolist()
    for name in ("sum", "avg"):
        t = torch.tensor(_vals(rank), dtype=f64)
        mc.reduce(t, n - 1, dims, name, **kw)
        if me == n - 1:
            out[f"reduce:{name}"] = t.tolist()
    out["all_gather"] = [x.tolist() for x in mc.all_gather(torch.tensor(_vals(rank), dtype=f64), dims, **kw)]
    for name in ("sum", "avg", "max"):
        ins = [torch.full((2,), float(100 * (rank + 1) + j), dtype=f64) for j in range(n)]
        o = torch.empty(2, dtype=f64)
        assert mc.reduce_scatter(o, ins, dims, name, **kw) is o
        out[f"reduce_scatter:{name}"] = o.tolist()
    t = torch.tensor(_vals(rank), dtype=f64)
    mc.broadcast(t, 1 % n, dims, **kw)
    out["broadcast"] = t.tolist()
    mc.barrier(dims, **kw)
    return out


def _scenario_full(mc, rank, overrides) -> dict:
    res = {}
    for dims in BASE_DIMS:
        res[_label(None, dims)] = _exercise(mc, rank, dims, None)
    for ext in overrides:
        for dims in [None, *ext.keys()]:
            res[_label(ext, dims)] = _exercise(mc, rank, dims, ext)
    if mc.check is False:
        return res  # without the check a mismatch would hang or abort gloo
    # consistency check: mismatched shapes / ops are reported on every member
    # of the group, and the group stays usable afterwards.
    g = mc.group("gpus")
    try:
        mc.all_reduce(torch.ones(3 + g.rank), "gpus")
        res["mismatch_shape"] = "no error"
    except C.CollectiveMismatchError as e:
        res["mismatch_shape"] = str(e)
    try:
        if mc.group("hosts").rank == 0:
            mc.all_reduce(torch.ones(2), "hosts")
        else:
            mc.broadcast(torch.ones(2), 0, "hosts")
        res["mismatch_op"] = "no error"
    except C.CollectiveMismatchError as e:
        res["mismatch_op"] = str(e)
    res["after_mismatch"] = mc.all_reduce(torch.ones(2), "gpus").tolist()
    return res


def _scenario_failure(mc, rank) -> dict:
    """Member 3 first idles (others must time out), then dies (its gpus-group
    peer must fail fast); the unaffected group keeps working."""
    res = {}
    mc.all_reduce(torch.ones(1))
    mc.all_reduce(torch.ones(1), "gpus")
    if rank == 3:
        # sleep: idles past the collective's timeout, so that the others' all_reduce times out
        time.sleep(mc.timeout.total_seconds() + 2)
        os._exit(3)
    t0 = time.monotonic()
    try:
        mc.all_reduce(torch.ones(4))
        res["hang"] = ("no error", time.monotonic() - t0)
    except C.CollectiveError as e:
        res["hang"] = (str(e), time.monotonic() - t0)
    t0 = time.monotonic()
    try:
        res["dead"] = (mc.all_reduce(torch.ones(2), "gpus").tolist(), time.monotonic() - t0)
    except C.CollectiveError as e:
        res["dead"] = (str(e), time.monotonic() - t0)
    t0 = time.monotonic()
    try:
        mc.all_reduce(torch.ones(1))
        res["reuse"] = ("no error", time.monotonic() - t0)
    except C.CollectiveError as e:
        res["reuse"] = (str(e), time.monotonic() - t0)
    return res


_MEMBER_SCENARIOS: dict = {}   # name -> fn(mc, rank), filled where the tests are


def _scenario(rank, extent, port, prefix, scenario, kwargs):
    mc = C.MeshCollectives(rank, extent, C.Rendezvous("127.0.0.1", port, prefix),
                           timeout=kwargs.get("timeout", 20), check=kwargs.get("check"))
    if scenario == "failure":
        return mc, _scenario_failure(mc, rank)
    if scenario in _MEMBER_SCENARIOS:
        return mc, _MEMBER_SCENARIOS[scenario](mc, rank)
    return mc, _scenario_full(mc, rank, kwargs.get("overrides", []))


def _pool_worker(commands, results):
    """Runs scenarios sent by the parent until told to stop (None)."""
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    while True:
        cmd = commands.get()
        if cmd is None:
            return
        tag, rank, extent, port, prefix, scenario, kwargs = cmd
        try:
            mc, res = _scenario(rank, extent, port, prefix, scenario, kwargs)
        except BaseException:
            results.put((tag, rank, "error", traceback.format_exc()))
            continue
        results.put((tag, rank, "ok", res))
        if scenario == "full":
            mc.barrier(timeout=20)  # member 0 serves the store: nobody leaves early
        mc.close()


class _Pool:
    """Spawned workers reused across scenarios: spawning (importing torch)
    dominates the cost on small machines, so it is paid once."""

    def __init__(self, n: int):
        self.ctx = mp.get_context("spawn")
        self.results = self.ctx.Queue()
        self.procs: list = [None] * n
        self.cmds: list = [None] * n
        self.seq = 0
        for i in range(n):
            self._start(i)

    def _start(self, i):
        q = self.ctx.Queue()
        p = self.ctx.Process(target=_pool_worker, args=(q, self.results), daemon=True)
        p.start()
        self.procs[i], self.cmds[i] = p, q

    def run(self, extent, scenario, deadline=45.0, **kwargs) -> dict:
        n = math.prod(extent.values())
        for i in range(n):
            if not self.procs[i].is_alive():
                self._start(i)
        self.seq += 1
        tag = self.seq
        port = _free_port()
        prefix = f"test-{scenario}-{os.getpid()}-{tag}"
        for rank in range(n):
            self.cmds[rank].put((tag, rank, dict(extent), port, prefix, scenario, kwargs))
        want = n - 1 if scenario == "failure" else n
        results, errors = {}, {}
        end = time.monotonic() + deadline
        while len(results) + len(errors) < want:
            try:
                got_tag, rank, status, payload = self.results.get(timeout=max(0.1, end - time.monotonic()))
            except queue_mod.Empty:
                raise AssertionError(f"workers did not report within {deadline}s; got {sorted(results)}") from None
            if got_tag == tag:
                (results if status == "ok" else errors)[rank] = payload
        assert not errors, "\n".join(f"member {r}:\n{tb}" for r, tb in sorted(errors.items()))
        exitcodes = []
        for i in range(n):
            if scenario == "failure" and i == 3:
                self.procs[i].join(max(0.1, end - time.monotonic()))
            exitcodes.append(self.procs[i].exitcode)
        return {"results": results, "exitcodes": exitcodes}

    def close(self):
        for p, q in zip(self.procs, self.cmds):
            if p.is_alive():
                q.put(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)


# ---------------------------------------------- independent expectations


def _expected_members(rank, extent: dict, dims) -> list[int]:
    names = list(extent)
    coords = list(itertools.product(*(range(s) for s in extent.values())))  # row-major
    chosen = set(names if dims is None else ([dims] if isinstance(dims, str) else dims))
    fixed = [i for i, k in enumerate(names) if k not in chosen]
    return [m for m, c in enumerate(coords) if all(c[i] == coords[rank][i] for i in fixed)]


def _expected(rank, members) -> dict:
    n = len(members)
    vals = [_vals(m) for m in members]
    col = list(zip(*vals))
    s = [sum(c) for c in col]
    exp = {
        "rank": members.index(rank),
        "size": n,
        "members": members,
        "all_reduce:sum": s,
        "all_reduce:SUM_enum": s,
        "all_reduce:prod": [math.prod(c) for c in col],
        "all_reduce:min": [min(c) for c in col],
        "all_reduce:max": [max(c) for c in col],
        "all_reduce:MAX_enum": [max(c) for c in col],
        "all_reduce:avg": [x / n for x in s],
        "all_reduce:AVG_obj": [x / n for x in s],
        "all_reduce:int_sum": [sum(m + 1 for m in members), 7 * sum(m + 1 for m in members)],
        "all_reduce:int_avg": [sum(m + 1 for m in members) // n, 7 * sum(m + 1 for m in members) // n],
        "all_reduce:noncontig": [[s[0], s[2]], [s[1], 0.0]],
        "all_gather": vals,
        "broadcast": _vals(members[1 % n]),
    }
    i = members.index(rank)
    rs = [100 * (m + 1) + i for m in members]
    exp["reduce_scatter:sum"] = [float(sum(rs))] * 2
    exp["reduce_scatter:avg"] = [sum(rs) / n] * 2
    exp["reduce_scatter:max"] = [float(max(rs))] * 2
    if i == n - 1:
        exp["reduce:sum"] = s
        exp["reduce:avg"] = [x / n for x in s]
    return exp


def _flat(x) -> list:
    return [y for item in x for y in _flat(item)] if isinstance(x, list) else [x]


def _check_full(run, base: dict, overrides):
    results = run["results"]
    n = math.prod(base.values())
    assert sorted(results) == list(range(n))
    checked = 0
    for rank, res in results.items():
        cases = [(None, d, base) for d in BASE_DIMS] + [(o, d, o) for o in overrides for d in [None, *o]]
        for ext, dims, shape in cases:
            got = res[_label(ext, dims)]
            exp = _expected(rank, _expected_members(rank, shape, dims))
            assert set(got) == set(exp), (rank, ext, dims)
            for key, want in exp.items():
                if isinstance(want, list) and want and isinstance(want[0], (float, list)):
                    assert _flat(got[key]) == pytest.approx(_flat(want)), (rank, ext, dims, key)
                    assert len(got[key]) == len(want), (rank, ext, dims, key)
                else:
                    assert got[key] == want, (rank, ext, dims, key)
                checked += 1
    assert checked > 0
    return results


@pytest.fixture(scope="module")
def pool():
    p = _Pool(8)
    yield p
    p.close()


@pytest.fixture(scope="module")
def mesh22(pool):
    return pool.run(HG22, "full", overrides=[{"dp": 2, "tp": 2}, {"a": 4}])


@pytest.fixture(scope="module")
def mesh23(pool):
    # checks off: exercises the plain path; {"dp": 3, "tp": 2} is a real reshape
    return pool.run(HG23, "full", check=False, overrides=[{"dp": 3, "tp": 2}])


@pytest.fixture(scope="module")
def mesh8(pool):
    return pool.run({"hosts": 2, "gpus": 4}, "full", overrides=[{"dp": 4, "tp": 2}])


@pytest.fixture(scope="module")
def failure(pool):
    return pool.run(HG22, "failure", timeout=5.0, deadline=40.0)


# ------------------------------------------------------ multi-process tests


def test_every_op_every_dims_2x2(mesh22):
    _check_full(mesh22, HG22, [{"dp": 2, "tp": 2}, {"a": 4}])


def test_every_op_every_dims_2x3_without_check(mesh23):
    _check_full(mesh23, HG23, [{"dp": 3, "tp": 2}])


def test_dp_tp_view_of_8_processes(mesh8):
    res = _check_full(mesh8, {"hosts": 2, "gpus": 4}, [{"dp": 4, "tp": 2}])
    view = {"dp": 4, "tp": 2}
    assert res[5][_label(view, "dp")]["members"] == [1, 3, 5, 7]
    assert res[5][_label(view, "tp")]["members"] == [4, 5]
    assert res[5][_label(view, "dp")]["all_reduce:sum"][0] == 2 + 4 + 6 + 8


def test_intra_and_inter_host_groups_2x2(mesh22):
    r = mesh22["results"]
    assert r[2][_label(None, "gpus")]["members"] == [2, 3]  # same host
    assert r[2][_label(None, "hosts")]["members"] == [0, 2]  # same gpu index
    assert r[2][_label(None, "gpus")]["all_reduce:sum"] == [7.0, 14.0, 25.0]
    assert r[1][_label(None, "hosts")]["all_gather"] == [_vals(1), _vals(3)]


def test_mismatched_shapes_and_ops_reported_on_every_member(mesh22):
    for rank, res in mesh22["results"].items():
        msg = res["mismatch_shape"]
        assert "disagree" in msg and "all_reduce" in msg, msg
        assert "float32[3]" in msg and "float32[4]" in msg, msg
        assert "'gpus'" in msg
        msg = res["mismatch_op"]
        assert "broadcast" in msg and "all_reduce" in msg, msg
        assert res["after_mismatch"] == [2.0, 2.0]


def test_dead_or_hung_member_fails_others_within_timeout(failure):
    res = failure["results"]
    assert sorted(res) == [0, 1, 2]
    assert failure["exitcodes"][3] == 3
    for rank in (0, 1, 2):
        msg, took = res[rank]["hang"]
        assert "all_reduce" in msg and "[0, 1, 2, 3]" in msg, msg
        assert took < 5.0 + 3.0, took
        msg, took = res[rank]["reuse"]
        assert "unusable" in msg and took < 1.0, msg
    # the gpus group without the dead member is unaffected
    assert res[0]["dead"][0] == [2.0, 2.0] and res[1]["dead"][0] == [2.0, 2.0]
    msg, took = res[2]["dead"]
    assert "all_reduce" in msg and "[2, 3]" in msg, msg
    assert took < 5.0 + 3.0, took


# ------------------------------------------------------ in-process tests


def _mc(rank=0, extent=HG22, rendezvous=None, **kw):
    return C.MeshCollectives(rank, extent, rendezvous, **kw)


def test_group_arithmetic_by_hand():
    g = C.compute_group(3, HG22, "gpus")
    assert (g.members, g.rank, g.index) == ((2, 3), 1, 1)
    g = C.compute_group(3, HG22, "hosts")
    assert (g.members, g.rank, g.index) == ((1, 3), 1, 1)
    g = C.compute_group(3, HG22, ("gpus", "hosts"))
    assert (g.dims, g.members, g.rank, g.index) == (("hosts", "gpus"), (0, 1, 2, 3), 3, 0)
    g = C.compute_group(4, {"hosts": 2, "gpus": 3}, "hosts")
    assert g.members == (1, 4) and g.rank == 1
    g = C.compute_group(6, {"dp": 4, "tp": 2}, "dp")
    assert g.members == (0, 2, 4, 6) and g.rank == 3
    g = C.compute_group(5, {"a": 2, "b": 2, "c": 2}, ("a", "c"))
    assert g.members == (0, 1, 4, 5) and g.rank == 3 and g.index == 0
    assert C.compute_group(2, HG22, ()).members == (2,)


def test_unknown_dim_names_dim_and_choices():
    mc = _mc()
    with pytest.raises(KeyError) as ei:
        mc.all_reduce(torch.ones(1), "gpu")
    msg = str(ei.value)
    assert "'gpu'" in msg and "['hosts', 'gpus']" in msg and "'hosts': 2" in msg
    with pytest.raises(KeyError, match="'hosts'"):
        mc.group_size("hosts", extent={"dp": 2, "tp": 2})
    with pytest.raises(KeyError):
        mc.barrier(("hosts", "nodes"))


def test_reduce_scatter_wrong_list_length():
    mc = _mc()
    with pytest.raises(ValueError, match="one input per group member: got 3 inputs for a group of 2"):
        mc.reduce_scatter(torch.empty(2), [torch.ones(2)] * 3, "gpus")
    with pytest.raises(ValueError, match=r"inputs\[1\]"):
        mc.reduce_scatter(torch.empty(2), [torch.ones(2), torch.ones(3)], "gpus")


def test_argument_errors():
    mc = _mc()
    with pytest.raises(ValueError, match="8 members"):
        mc.group(extent={"dp": 4, "tp": 2})
    with pytest.raises(ValueError, match="unknown reduce op"):
        mc.all_reduce(torch.ones(1), op="median")
    with pytest.raises(ValueError, match="src=2"):
        mc.broadcast(torch.ones(1), 2, "gpus")
    with pytest.raises(ValueError, match="dst=-1"):
        mc.reduce(torch.ones(1), -1, "gpus")
    with pytest.raises(ValueError, match="outside"):
        _mc(rank=4)
    with pytest.raises(ValueError, match="positive"):
        _mc(extent={"hosts": 0})


def test_missing_rendezvous_is_a_clear_error():
    with pytest.raises(C.CollectiveError, match="rendezvous"):
        _mc().all_reduce(torch.ones(1), "gpus")


def test_nccl_unavailable_and_odd_devices():
    mc = _mc(rendezvous=C.Rendezvous("127.0.0.1", 1, "x"))
    if not dist.is_nccl_available():
        with pytest.raises(C.CollectiveError, match=r"cuda.*NCCL is not available"):
            mc.backend("gpus", "cuda")
    with pytest.raises(C.CollectiveError, match="meta"):
        mc.all_reduce(torch.ones(2, device="meta"), "gpus")


def test_single_member_groups_need_no_rendezvous():
    mc = _mc(rank=3)
    t = torch.tensor([1.0, 2.0])
    assert mc.all_reduce(t, (), "avg").tolist() == [1.0, 2.0]
    assert [x.tolist() for x in mc.all_gather(t, ())] == [[1.0, 2.0]]
    out = torch.empty(2)
    assert mc.reduce_scatter(out, [t], ()).tolist() == [1.0, 2.0]
    mc.barrier(())
    solo = C.MeshCollectives(0, {}, None)
    assert solo.group_members() == [0] and solo.all_reduce(t).tolist() == [1.0, 2.0]


def test_timeout_from_argument_and_env(monkeypatch):
    monkeypatch.setenv(C.TIMEOUT_ENV, "2.5")
    assert _mc().timeout.total_seconds() == 2.5
    from datetime import timedelta

    assert _mc(timeout=timedelta(seconds=7)).timeout.total_seconds() == 7
    monkeypatch.setenv(C.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=C.TIMEOUT_ENV):
        _mc()
    monkeypatch.delenv(C.TIMEOUT_ENV)
    assert _mc().timeout.total_seconds() == C.DEFAULT_TIMEOUT_S


def test_module_functions_use_current_actor():
    # the context the runtime sets around an endpoint call is what the functions read
    from hpcmesh.runtime.context import ActorInstance, Context, current_context_var
    from hpcmesh.shapes import Extent, Point

    point = Point(0, Extent({"hosts": 1, "gpus": 1}))
    inst = ActorInstance(rank=point, actor_id="a", mesh_name="m")
    token = current_context_var.set(Context(inst, point))
    try:
        t = torch.ones(2)
        assert C.all_reduce(t, "gpus") is t
        assert C.group_members() == [0] and C.group_size("hosts") == 1 and C.group_rank() == 0
        mc = C.get_collectives()
        assert isinstance(mc, C.MeshCollectives) and C.get_collectives() is mc   # one per actor
        with pytest.raises(KeyError, match="nodes"):
            C.barrier("nodes")
    finally:
        current_context_var.reset(token)


def test_module_functions_outside_an_actor(monkeypatch):
    def context():
        raise RuntimeError("no actor here")

    monkeypatch.setattr(C, "context", context)
    with pytest.raises(RuntimeError, match="inside an actor"):
        C.all_reduce(torch.ones(1))


# ------------------------------------- two members in the pool's processes
#
# torch has one default process group per process, so every member is a process of its own.


def _complex_scenario(mc, rank):
    z = torch.tensor([1 + 2j, 3 - 1j]) * (rank + 1)
    s = mc.all_reduce(z.clone()).tolist()
    a = mc.all_reduce(z.clone(), op="avg").tolist()
    g = [x.tolist() for x in mc.all_gather(z)]
    b = mc.broadcast(z.clone(), 1).tolist()
    with pytest.raises(ValueError, match="complex"):
        mc.all_reduce(z.clone(), op="max")
    return s, a, g, b


def _refused_scenario(mc, rank):
    with pytest.raises(ValueError, match="gloo supports only"):
        # private: torch has no public constructor of a PREMUL_SUM op
        mc.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0))
    with pytest.raises(ValueError, match="bool"):
        mc.all_reduce(torch.ones(2, dtype=torch.bool), op="avg")
    with pytest.raises(ValueError, match="integer or bool"):
        mc.all_reduce(torch.ones(2), op="bxor")
    bits = mc.all_reduce(torch.tensor([1 << rank, 3]), op="bor").tolist()
    return bits, mc.all_reduce(torch.ones(2)).tolist()


def _timeout_scenario(mc, rank):
    mc.barrier()
    if rank == 1:
        time.sleep(2.5)  # sleep: never joins the collective below, past its 0.5 s timeout
        return None
    t0 = time.monotonic()
    with pytest.raises(C.CollectiveError, match=r"broadcast.*timeout 0.5s") as ei:
        mc.broadcast(torch.ones(1), 0, timeout=0.5)
    took = time.monotonic() - t0
    with pytest.raises(C.CollectiveError, match="unusable"):
        mc.barrier()
    return took, str(ei.value)


_MEMBER_SCENARIOS.update(complex=_complex_scenario, refused=_refused_scenario,
                         timeout=_timeout_scenario)


def test_complex_tensors_travel_as_real_views(pool):
    out = pool.run({"a": 2}, "complex", timeout=10)["results"]
    z = [1 + 2j, 3 - 1j]
    for rank in (0, 1):
        s, a, g, b = out[rank]
        assert s == [3 * x for x in z] and a == [1.5 * x for x in z]
        assert g == [z, [2 * x for x in z]] and b == [2 * x for x in z]


def test_refused_ops_leave_the_group_usable(pool):
    out = pool.run({"a": 2}, "refused", timeout=10)["results"]
    assert out[0] == out[1] == ([3, 3], [2.0, 2.0])


def test_per_call_timeout_and_unusable_group(pool):
    took, msg = pool.run({"a": 2}, "timeout", timeout=10)["results"][0]
    assert took < 2.0, took
    assert "[0, 1]" in msg


def test_members_sharing_a_gpu_are_named():
    from hpcmesh.collectives.mesh import gpu_identity, members_sharing_a_gpu
    a, b = gpu_identity("node1", "GPU-aaa"), gpu_identity("node1", "GPU-bbb")
    other_host = gpu_identity("node2", "GPU-aaa")
    assert members_sharing_a_gpu([a, b, other_host]) == []
    assert members_sharing_a_gpu([a, b, a, other_host, b]) == [[0, 2], [1, 4]]
