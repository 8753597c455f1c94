"""Simulated hosts: many host agents and actor processes packed into a few OS processes.

For shapes this machine cannot hold as real processes (1,024 hosts x 8), so that the
controller's cost can be measured as hosts grow. What is real: the controller (its node,
client runtime, ProcMesh, ActorMesh, every call path), the connections (one Unix socket per
simulated process and per simulated agent, dialed back to the controller as real ones do,
with the handshake), every frame and every message. What is simulated: a "process" is a
``Node`` with the actor services, and a "host agent" a ``Node`` answering ``stop_procs``;
hundreds of them share one event loop in one OS process (``--sim-processes`` of those), so
no fork, no interpreter start, no lease, no log pipes, no exit reports. Each simulated
agent relays casts (``runtime/relay.py``) to its processes over the memory backend (in the
simulating process) rather than Unix sockets, and listens as a real one does, so that the
head of a tree of relays forwards to it (memory backend within a simulating process, a
Unix socket across two; neighbouring hosts share a simulating process, so a tree's
branches mostly stay within one). A simulated process's
work (decoding a call, running a no-op async endpoint, replying) costs what a real one's
does, but they take turns on the simulating processes' cores: wall times past a few
hundred members measure those cores as much as the controller. The controller's own CPU
time per call (what ``bench_scale.py`` reports) is what this mode is for.

    from simulated_hosts import simulated_proc_mesh
    procs, stop = simulated_proc_mesh(hosts=1024, per_host=8, sim_processes=2)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import uuid

from hpcmesh.actor.proc_mesh import ProcMesh
from hpcmesh.runtime.client import ProcRecord, client_runtime
from hpcmesh.runtime.messages import NodeRef
from hpcmesh.shapes import Extent, Point


# -- the simulating process ------------------------------------------------------------
async def _serve(attach: list[str], hosts: list[int], per_host: int, prefix: str) -> None:
    from hpcmesh.runtime.actor_services import ActorServices
    from hpcmesh.runtime.node import Node
    from hpcmesh.runtime.cast_relay import CastRelay
    from hpcmesh.transport.addresses import secret_from_env

    secret = secret_from_env()
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    procs_of: dict[int, list[Node]] = {}

    def proc_node(h: int, g: int) -> Node:
        name = f"{prefix}-{h}-{g}"
        node = Node(secret, loop, role="proc", name=name,
                    info={"proc_name": name, "simulated": True})
        node.listen([f"memory://{name}"])       # its agent relays casts to it here
        ActorServices.attach(node)
        node.services["ping"] = lambda: 0

        async def stop() -> int:
            await node.actor_services.stop_actors(list(node.actors))
            loop.call_later(0.05, node.close)          # once this answer has left
            return os.getpid()
        node.services["stop"] = stop
        node.services["reserve_rendezvous_port"] = lambda host: 0   # no store here
        return node

    def agent_node(h: int) -> Node:
        name = f"{prefix}-agent-{h}"
        node = Node(secret, loop, role="agent", name=name, info={"simulated": True})
        # where a tree's head forwards to it from (another simulating process: Unix)
        node.listen([f"memory://{name}", node.unix_address()])
        CastRelay(node)         # fans calls out to its processes, folds their answers

        def stop_procs(names: list, grace: float) -> dict:
            codes = {}
            for p in procs_of[h]:
                if p.name in names:
                    p.close()
                    codes[p.name] = 0
            if all(p.closed for p in procs_of[h]):
                loop.call_later(0.05, node.close)      # once this answer has left
                if all(p.closed for ps in procs_of.values() for p in ps):
                    loop.call_later(0.1, done.set)
            return codes
        node.services["stop_procs"] = stop_procs
        return node

    agents = {h: agent_node(h) for h in hosts}
    crowd = list(agents.values())
    for i in range(0, len(crowd), 256):     # under the listener's cap of handshakes
        await asyncio.gather(*(a.connect_first(attach, timeout=120) for a in crowd[i:i + 256]))
    print(json.dumps({"agents": {h: a.node_id for h, a in agents.items()}}), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)      # the records are made: go
    for h in hosts:
        procs_of[h] = [proc_node(h, g) for g in range(per_host)]
    nodes = [p for ps in procs_of.values() for p in ps]
    for i in range(0, len(nodes), 256):          # a crowd, but not past the listener's cap
        await asyncio.gather(*(p.connect_first(attach, timeout=120) for p in nodes[i:i + 256]))
    print(json.dumps({"connected": len(nodes)}), flush=True)
    await done.wait()


# -- the controller's side -------------------------------------------------------------
def simulated_proc_mesh(hosts: int, per_host: int, sim_processes: int = 1,
                        name: str | None = None):
    """A ProcMesh ``{"hosts": hosts, "gpus": per_host}`` of simulated processes, and a
    function that stops the simulating processes (after ``ProcMesh.stop()``)."""
    rt = client_runtime()
    name = name or f"sim{uuid.uuid4().hex[:6]}"
    attach = [a for a in rt.node.addresses if a.startswith("unix://")]
    env = dict(os.environ, HPCMESH_SECRET=rt.node.secret.hex(),
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(
                   os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]))
    # neighbours together: the agents of one branch of a tree of relays (runtime/relay.py)
    # in one simulating process, which they share with their processes anyway
    chunks = [list(range(hosts))[k * hosts // sim_processes:(k + 1) * hosts // sim_processes]
              for k in range(sim_processes)]
    sims, agents = [], {}
    for chunk in chunks:
        if not chunk:
            continue
        p = subprocess.Popen([sys.executable, "-P", os.path.abspath(__file__), "serve",
                              "--attach", ",".join(attach), "--hosts",
                              ",".join(map(str, chunk)), "--per-host", str(per_host),
                              "--prefix", name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=env, text=True)
        sims.append(p)
    for p in sims:
        agents.update({int(h): i for h, i in json.loads(p.stdout.readline())["agents"].items()})
    extent = Extent({"hosts": hosts, "gpus": per_host})
    records = []
    for h in range(hosts):
        agent = NodeRef(agents[h], ())
        for g in range(per_host):
            rec = ProcRecord(name=f"{name}-{h}-{g}", mesh_name=name,
                             point=Point(h * per_host + g, extent), agent=agent,
                             label=f"hosts={h},gpus={g}", host=f"sim{h}")
            rt.procs[rec.name] = rec
            records.append(rec)
    for p in sims:
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in sims:
        json.loads(p.stdout.readline())          # {"connected": n}
    mesh = ProcMesh.from_records(name, records, extent, None)

    def stop_simulation(timeout: float = 60) -> None:
        for p in sims:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return mesh, stop_simulation


def main() -> None:
    ap = argparse.ArgumentParser(description="a simulating process (started by "
                                             "simulated_proc_mesh)")
    ap.add_argument("what", choices=["serve"])
    ap.add_argument("--attach", required=True)
    ap.add_argument("--hosts", required=True)
    ap.add_argument("--per-host", type=int, required=True)
    ap.add_argument("--prefix", required=True)
    a = ap.parse_args()
    from hpcmesh.runtime.loop import new_event_loop
    loop = new_event_loop()
    loop.run_until_complete(_serve(a.attach.split(","), [int(h) for h in a.hosts.split(",")],
                                   a.per_host, a.prefix))


if __name__ == "__main__":
    main()
