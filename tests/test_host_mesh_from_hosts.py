"""``HostMesh.from_hosts``, the one constructor of a 1-D host mesh, and the job layer's
``AgentHostMesh`` / ``SlurmHostMesh`` built with it: pure, no process started."""

import pickle

import pytest

from hpcmesh.actor.host_mesh import HostMesh, HostRef
from hpcmesh.job import SlurmHostMesh, slurm_bootstrap
from hpcmesh.job.agent_mesh import AgentHostMesh, agent_bootstrap
from hpcmesh.runtime.messages import NodeRef


def refs(*names):
    return [HostRef(NodeRef(f"agent-{n}", (f"tcp://{n}:1",)), n) for n in names]


def test_one_hosts_dimension_in_the_order_given():
    mesh = HostMesh.from_hosts(refs("a", "b", "c"), "workers")
    assert type(mesh) is HostMesh and mesh.name == "workers"
    assert dict(mesh.extent) == {"hosts": 3}
    assert mesh.hostnames == ["a", "b", "c"]
    assert mesh.slice(hosts=1).hostnames == ["b"]


def test_no_hosts_or_something_else_is_a_clear_error():
    with pytest.raises(ValueError, match="host mesh 'm' needs at least one host; got none"):
        HostMesh.from_hosts([], "m")
    with pytest.raises(TypeError, match="made of HostRefs .* got str 'a'"):
        HostMesh.from_hosts(["a"], "m")


def test_a_subclass_gets_its_keywords_and_keeps_them_in_views():
    job = object()
    mesh = AgentHostMesh.from_hosts(refs("a", "b"), "local", default_per_host={"procs": 2},
                                    job=job)
    view = mesh.slice(hosts=0)
    assert type(view) is AgentHostMesh and view.job is job
    assert view.default_per_host == {"procs": 2}
    assert not isinstance(mesh, SlurmHostMesh)          # a local or static mesh is no Slurm one
    assert pickle.loads(pickle.dumps(mesh)).job is None  # the job stays with the client
    assert repr(mesh) == "AgentHostMesh({'hosts': 2}, hosts=['a', 'b'])"


def test_slurm_host_mesh_is_the_slurm_kind_of_agent_host_mesh():
    mesh = SlurmHostMesh.from_hosts(refs("n1"), "trainers", job="the job")
    assert isinstance(mesh, AgentHostMesh) and mesh.job == "the job"
    assert type(mesh.slice(hosts=0)) is SlurmHostMesh
    assert repr(mesh) == "SlurmHostMesh({'hosts': 1}, hosts=['n1'])"
    assert slurm_bootstrap is agent_bootstrap            # hpcmesh.job's public name stays
