"""Training on the mesh with torch's own tools (issue 14): worlds, DeviceMesh, torchrun scripts.

Real processes on this host (gloo over loopback), torch's public API on the user's side.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest
from ci_gate import import_or_skip

torch = import_or_skip("torch")

from hpcmesh import spmd  # noqa: E402
from hpcmesh.actor import Actor, ActorError, context, endpoint, this_host  # noqa: E402
from hpcmesh.runtime.errors import MeshStoppedError, SupervisionError  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAIN_DDP = REPO / "examples" / "train_ddp.py"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Member(Actor):
    """What a training actor sees of its world."""

    @endpoint
    def mesh_groups(self):
        import torch.distributed as dist

        from hpcmesh import collectives
        mesh = spmd.device_mesh()
        rank = dist.get_rank()
        per_dim = {}
        for name in mesh.mesh_dim_names:
            t = torch.tensor([float(rank + 1)])
            dist.all_reduce(t, group=mesh.get_group(name))       # torch's call, torch's group
            u = torch.tensor([float(rank + 1)])
            collectives.all_reduce(u, dims=name)                 # hpcmesh's call, same group
            per_dim[name] = (t.item(), u.item())
        return {"names": mesh.mesh_dim_names, "shape": tuple(mesh.shape), "rank": rank,
                "per_dim": per_dim}

    @endpoint
    def own_world(self):
        """What a torchrun script does: init_process_group() from the variables."""
        import torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                          "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME")}
        names = spmd.device_mesh().mesh_dim_names      # adopts the world the user formed
        return {"world": dist.get_world_size(), "sum": t.item(), "env": env, "names": names}

    @endpoint
    def tensor_parallel(self):
        """TP along "gpus" of the mesh's DeviceMesh: a column-sharded Linear gives the full
        layer's output, each member holding half of its weight."""
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
        mesh = spmd.device_mesh()
        torch.manual_seed(0)
        layer = torch.nn.Linear(4, 6)
        full = layer(torch.ones(2, 4)).detach()
        parallelize_module(layer, mesh["gpus"], ColwiseParallel(use_local_output=False))
        out = layer(torch.ones(2, 4))           # a DTensor sharded along the output columns
        return (torch.allclose(out.full_tensor(), full, atol=1e-6),
                tuple(layer.weight.to_local().shape))

    @endpoint
    def mesh_names(self, extent):
        return spmd.device_mesh(extent).mesh_dim_names

    @endpoint
    def spawn_rank(self):
        return context().actor_instance.rank.rank

    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def reduce_all(self, timeout):
        from hpcmesh import collectives
        t = torch.ones(1)
        collectives.all_reduce(t, timeout=timeout)
        return t.item()


@pytest.fixture
def procs():
    p = this_host().spawn_procs({"hosts": 2, "gpus": 2})
    yield p
    p.stop().get(timeout=60)


def test_device_mesh_has_the_mesh_dims_and_torch_groups(procs):
    members = procs.spawn("members", Member)
    got = members.mesh_groups.call().get(timeout=120).values()
    # flat rank (h, g) -> 2h + g; values rank + 1
    assert [g["names"] for g in got] == [("hosts", "gpus")] * 4
    assert [g["shape"] for g in got] == [(2, 2)] * 4
    assert [g["per_dim"]["gpus"] for g in got] == [(3.0, 3.0), (3.0, 3.0), (7.0, 7.0), (7.0, 7.0)]
    assert [g["per_dim"]["hosts"] for g in got] == [(4.0, 4.0), (6.0, 6.0), (4.0, 4.0), (6.0, 6.0)]
    # a rename view of the same members: the DeviceMesh and the dims follow it
    renamed = members.rename(hosts="dp", gpus="tp").mesh_groups.call().get(timeout=120).values()
    assert [g["names"] for g in renamed] == [("dp", "tp")] * 4
    assert [g["per_dim"]["tp"] for g in renamed] == [(3.0, 3.0), (3.0, 3.0), (7.0, 7.0), (7.0, 7.0)]
    flat = members.flatten("rank").mesh_groups.call().get(timeout=120).values()
    assert [g["per_dim"]["rank"] for g in flat] == [(10.0, 10.0)] * 4


def test_tensor_parallel_along_a_mesh_dim(procs):
    got = procs.spawn("tp", Member).tensor_parallel.call().get(timeout=120).values()
    assert got == [(True, (3, 4))] * 4


def test_a_slice_is_a_world_of_its_own_again_and_again(procs):
    one_host = procs.slice(hosts=1)
    spmd.setup_torch_elastic_env(one_host)
    got = one_host.spawn("a", Member).own_world.call().get(timeout=120).values()
    assert [g["world"] for g in got] == [2, 2] and {g["sum"] for g in got} == {3.0}
    assert [g["env"]["RANK"] for g in got] == ["0", "1"]
    assert {g["env"]["LOCAL_WORLD_SIZE"] for g in got} == {"2"}
    # LOCAL_RANK keeps selecting the process's own slot on the host (2 and 3 of this host's 4)
    assert [g["env"]["LOCAL_RANK"] for g in got] == ["2", "3"]
    assert {g["names"] for g in got} == {("gpus",)}
    # the other direction, on the same processes: a new world, the earlier group out of the way
    column = procs.slice(gpus=0)
    spmd.setup_torch_elastic_env(column)
    got = column.spawn("b", Member).own_world.call().get(timeout=120).values()
    assert [g["world"] for g in got] == [2, 2] and {g["sum"] for g in got} == {3.0}
    assert {g["names"] for g in got} == {("hosts",)}
    # and the whole mesh again
    spmd.setup_torch_elastic_env(procs)
    got = procs.spawn("c", Member).own_world.call().get(timeout=120).values()
    assert [g["world"] for g in got] == [4] * 4 and {g["sum"] for g in got} == {10.0}
    assert [g["env"]["LOCAL_RANK"] for g in got] == ["0", "1", "2", "3"]
    assert {g["env"]["ROLE_NAME"] for g in got} == {"default"}
    assert {g["names"] for g in got} == {("hosts", "gpus")}


def test_async_setup_in_an_actor_free_controller(procs):
    import asyncio

    asyncio.run(spmd.setup_torch_elastic_env_async(procs.slice(hosts=0)))
    got = procs.slice(hosts=0).spawn("a", Member).own_world.call().get(timeout=120).values()
    assert [g["world"] for g in got] == [2, 2]


def test_ddp_script_under_hpcmesh_and_torchrun_equals_one_process(tmp_path):
    """The same file as a torchrun script and through SPMDActor on {"hosts": 2, "gpus": 2}:
    equal loss curves step for step, and the weights of the same steps in one process."""
    steps = 6
    hp = tmp_path / "hpcmesh.json"
    run = subprocess.run([sys.executable, str(TRAIN_DDP), "--steps", str(steps), "--out", str(hp)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 processes, loss" in run.stdout, run.stdout
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    assert torchrun, "torchrun is installed with torch"
    tr = tmp_path / "torchrun.json"
    run = subprocess.run([torchrun, "--nproc-per-node", "4", str(TRAIN_DDP), "--steps", str(steps),
                          "--out", str(tr)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    a, b = json.loads(hp.read_text()), json.loads(tr.read_text())
    assert a["world"] == b["world"] == 4
    assert a["losses"] == b["losses"] and a["weights"] == b["weights"]
    ref = _example("train_ddp").reference(steps, 8 * 4, 0.05, 0)
    assert a["losses"] == pytest.approx(ref["losses"], rel=1e-5, abs=1e-6)
    assert a["weights"] == pytest.approx(ref["weights"], rel=1e-5, abs=1e-6)
    assert a["losses"][-1] < a["losses"][0]


def test_fsdp_example_trains_on_the_device_mesh():
    run = subprocess.run([sys.executable, str(REPO / "examples" / "train_fsdp.py"), "--steps", "4"],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "FSDP2 on DeviceMesh ('hosts', 'gpus')" in run.stdout, run.stdout
    assert "weights equal to one process: True" in run.stdout, run.stdout


def test_spmd_actor_runs_scripts_and_modules_and_reports_their_failure(procs, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys, json\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "out = {'argv': sys.argv[1:], 'rank': dist.get_rank(), 'name': __name__}\n"
        "open(os.path.join(os.path.dirname(__file__), f'r{dist.get_rank()}.json'), 'w')"
        ".write(json.dumps(out))\n"
        "dist.barrier()\n"   # no rank closes its sockets while another still connects
        "dist.destroy_process_group()\n"
        "if '--fail' in sys.argv: sys.exit(3)\n")
    spmd.setup_torch_elastic_env(procs)
    actors = procs.spawn("spmd", SPMDActorProxy)
    assert actors.main.call([str(script), "--lr", "1"]).get(timeout=120).values() == [True] * 4
    outs = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(4)]
    assert [o["rank"] for o in outs] == [0, 1, 2, 3]
    assert {tuple(o["argv"]) for o in outs} == {("--lr", "1")} and {o["name"] for o in outs} == {"__main__"}
    with pytest.raises(ActorError, match="exited with status 3"):
        actors.main.call([str(script), "--fail"]).get(timeout=120)
    with pytest.raises(ActorError, match="no script or module"):
        actors.main.call(["-m"]).get(timeout=60)
    # a slice was never set up: the error says what to do instead of hanging in init
    fresh = procs.slice(hosts=1).spawn("fresh", SPMDActorProxy)
    with pytest.raises(ActorError, match="setup_torch_elastic_env"):
        fresh.main.call([str(script)]).get(timeout=60)


SPMDActorProxy = spmd.SPMDActor


def test_explicit_master_makes_the_actor_mesh_a_world(procs, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(1); dist.all_reduce(t)\n"
        "assert t.item() == dist.get_world_size() == 2, t\n"
        "dist.destroy_process_group()\n")
    view = procs.slice(gpus=1)
    actors = view.spawn("spmd", spmd.SPMDActor)
    addr, port = actors.slice(hosts=0).get_host_port.call_one().get(timeout=60)
    assert actors.main.call(addr, port, [str(script)]).get(timeout=120).values() == [True, True]


def test_bad_input_names_what_is_wrong(procs):
    with pytest.raises(TypeError, match="ProcMesh or a view"):
        spmd.setup_torch_elastic_env(procs.spawn("m", Member))
    with pytest.raises(ValueError, match="both master_addr and master_port"):
        spmd.setup_torch_elastic_env(procs, master_addr="127.0.0.1")
    with pytest.raises(ValueError, match="use_ipaddr"):
        spmd.setup_torch_elastic_env(procs, use_ipaddr="ipv5")
    members = procs.spawn("members", Member)
    with pytest.raises(ActorError, match=r"view of 2 of the mesh's 4 members.*setup_torch_elastic_env"):
        members.slice(hosts=0).mesh_groups.call().get(timeout=60)
    with pytest.raises(ActorError, match=r"extent \{'dp': 5\} has 5 members but the mesh"):
        members.mesh_names.call({"dp": 5}).get(timeout=60)
    assert members.mesh_names.call({"dp": 2, "tp": 2}).get(timeout=60).values() == [("dp", "tp")] * 4
    stopped = this_host().spawn_procs({"gpus": 1})
    stopped.stop().get(timeout=60)
    with pytest.raises(MeshStoppedError):
        spmd.setup_torch_elastic_env(stopped)


def test_after_a_member_dies_collectives_fail_fast_and_survivors_train_on(procs):
    members = procs.spawn("members", Member)
    assert members.reduce_all.call(30).get(timeout=120).values() == [4.0] * 4
    victim = members.slice(hosts=1, gpus=1).pid.call_one().get(timeout=30)
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises((ActorError, SupervisionError)):
        members.slice(hosts=0).reduce_all.call(5).get(timeout=60)
    assert time.monotonic() - t0 < 5 + 10
    survivors = procs.slice(hosts=0)
    spmd.setup_torch_elastic_env(survivors)
    got = survivors.spawn("again", Member).own_world.call().get(timeout=120).values()
    assert [g["world"] for g in got] == [2, 2] and {g["sum"] for g in got} == {3.0}


def test_no_private_torch_module_is_used():
    """hpcmesh uses torch's public API only: no ``torch._C``, no private torch module."""
    bad = []
    for path in (REPO / "hpcmesh").rglob("*.py"):
        text = path.read_text()
        if "torch._C" in text:
            bad.append(f"{path}: mentions torch._C")
        for node in ast.walk(ast.parse(text)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "torch" and any(p.startswith("_") for p in parts[1:]):
                    bad.append(f"{path}:{node.lineno}: imports {name}")
    assert not bad, "\n".join(bad)
