"""A ProcMesh whose "processes" are nodes in this process, on the memory backend.

For tests whose subject is dispatch, ordering or replies: the controller, its ProcMesh and
ActorMesh, every call path and every frame are the real ones; each member is a ``Node`` on
a loop thread of its own listening on ``memory://`` (as an actor process's node runs on
its own loop), with the actor services, so sync endpoints run on their actor's thread
and async ones on that loop. What is not real: no fork, no exit, no pid of its own, and
module state is shared with the test (a test of process isolation needs real processes).
Spawning 4 takes milliseconds, not an interpreter start each. Each value of a ``hosts``
dimension gets a host agent node of its own, which relays casts (``runtime/relay.py``) as
a real host agent does.
"""

from __future__ import annotations

import uuid

from hpcmesh.actor.proc_mesh import ProcMesh
from hpcmesh.runtime.actor_services import ActorServices
from hpcmesh.runtime.client import ProcRecord, client_runtime
from hpcmesh.runtime.node import Node
from hpcmesh.runtime.cast_relay import CastRelay
from hpcmesh.shapes import Extent, Point, point_label


def memory_proc_mesh(extent: dict, name: str | None = None) -> ProcMesh:
    """``extent`` (e.g. ``{"hosts": 2, "gpus": 2}``) of in-process members; ``stop()`` ends
    their nodes."""
    rt = client_runtime()
    name = name or f"mem{uuid.uuid4().hex[:6]}"
    ext = Extent(dict(extent))
    nodes: dict[str, Node] = {}

    def stop_procs(names: list, grace: float) -> dict:
        for n in names:
            node = nodes.pop(n, None)
            if node is not None:
                node.shutdown_thread()
        return {n: 0 for n in names}

    hosts = dict(ext).get("hosts", 1)
    agents = []
    for h in range(hosts):
        agent = Node.start_in_thread(rt.node.secret, role="agent", name=f"{name}-agent{h}",
                                     listen=[f"memory://{name}-agent{h}"])
        CastRelay(agent)        # before its first hello: it says it relays

        async def stop_procs_off_the_loop(names: list, grace: float, agent=agent) -> dict:
            # a node's thread is joined: not on the agent's own loop
            return await agent.loop.run_in_executor(None, stop_procs, names, grace)
        agent.services["stop_procs"] = stop_procs_off_the_loop
        agents.append(agent)
        # connected, as the controller is to the agents it asked for processes
        rt.node.run_sync(rt.node.connect(agent.addresses[0], expect=agent.node_id))
    records = []
    for i in range(ext.nelem):
        agent = agents[i * hosts // ext.nelem]
        proc = f"{name}-{i}"
        node = nodes[proc] = Node.start_in_thread(
            rt.node.secret, role="proc", name=proc, listen=[f"memory://{proc}"],
            info={"proc_name": proc})
        services = ActorServices.attach(node)
        node.services["ping"] = lambda: 0       # as an actor process's (proc.py)

        async def stop(services=services, node=node) -> int:
            await services.stop_actors(list(node.actors))
            return 0
        node.services["stop"] = stop
        point = Point(i, ext)
        rec = ProcRecord(name=proc, mesh_name=name, point=point, agent=agent.ref,
                         label=point_label(point), node=node.ref, host="memory")
        rec.ready.set_result(node.ref)
        rt.procs[proc] = rec
        records.append(rec)
    mesh = ProcMesh.from_records(name, records, ext, None)
    mesh_stop = mesh.stop

    def stop_all(grace=None):
        done = mesh_stop(grace)
        done.add_done_callback(lambda _f: [a.shutdown_thread() for a in agents])
        return done
    mesh.stop = stop_all
    mesh.agent_nodes = agents       # a test may end one (its host then counts as lost)
    return mesh
