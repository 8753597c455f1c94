"""The controller side of an MPI launch: a ProcMesh over the ranks, either in the script
rank 0 runs (``mpi_proc_mesh``) or in a client that attaches through the address file
(``attach_to_mpi``). Imports no mpi4py: it works in any client."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Sequence

from ..actor.host_mesh import HostMesh, HostRef
from ..actor.proc_mesh import ProcMesh
from ..private_files import open_file
from ..runtime.client import ClientRuntime, ProcRecord, install_client_runtime
from ..runtime.errors import SupervisionError
from ..runtime.node import Node, NodeRef
from ..shapes import Extent, Point, point_label
from .layout import ADDRESS_FILE_FORMAT, MPILayout, RankEntry


@dataclass(eq=False)
class MPIProcRecord(ProcRecord):
    world_rank: int = -1


async def connect_all(node: Node, entries: Sequence[RankEntry], secret: bytes | None,
                       timeout: float) -> None:
    async def one(e: RankEntry) -> None:
        if node.peer_connected(e.node_id):
            return
        errors = []
        for addr in e.addresses:
            try:
                await node.connect(addr, expect=e.node_id, timeout=timeout, secret=secret)
                return
            except Exception as exc:  # noqa: BLE001 - try the next address
                errors.append(f"{addr}: {exc or type(exc).__name__}")
        raise ConnectionError(f"cannot reach MPI rank {e.world_rank} on {e.host} (pid {e.pid}): "
                              f"{'; '.join(errors) or 'no addresses'}")
    await asyncio.gather(*(one(e) for e in entries))


def build_mesh(rt: ClientRuntime, layout: MPILayout, agent: NodeRef, name: str) -> ProcMesh:
    extent = Extent(layout.extent)
    uid = uuid.uuid4().hex[:6]
    records: list[MPIProcRecord] = []
    for i, e in enumerate(layout.by_flat_rank()):
        point = Point(i, extent)
        rec = MPIProcRecord(f"{name}-{uid}-r{e.world_rank}", name, point, agent, point_label(point),
                            world_rank=e.world_rank)
        rec.node = e.ref
        rec.pid = e.pid
        rec.host = e.host
        rec.ready.set_result(rec.node)
        records.append(rec)
    by_node = {r.node.node_id: r for r in records}

    def on_closed(node, peer_id, exc) -> None:
        rec = by_node.get(peer_id)
        if all(r.stopping or r.failure is not None for r in records):
            try:     # the whole mesh is over: stop watching
                node.on_peer_closed.remove(on_closed)
            except ValueError:
                pass
        if rec is None or node.closed or rec.stopping or rec.failure is not None \
                or node.peer_connected(peer_id):
            return
        err = SupervisionError(
            f"MPI rank {rec.world_rank} (process {rec.label} of mesh {name!r}) on host "
            f"{rec.host} (pid {rec.pid}) lost its connection: {exc or 'closed'}",
            name, rec.point, rec.host, rec.pid, "connection lost")
        rec.failure = err
        node.fail_peer(peer_id, err)
        print(f"hpcmesh: supervision: {err}", file=sys.stderr, flush=True)
    rt.node.on_peer_closed.append(on_closed)
    host_refs = [HostRef(agent, h) for h in layout.hosts]
    hosts = HostMesh.from_hosts(host_refs, f"{name}_hosts")
    return ProcMesh.from_records(name, records, extent, hosts)


def world_ranks(mesh: ProcMesh) -> list[int]:
    """The MPI world rank of each member of an MPI ProcMesh (or a view of one), in order."""
    return [getattr(r, "world_rank", None) for r in mesh.records]


def _read_address_file(path: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    last = "it does not exist"
    while True:
        try:
            # it holds the job's secret: only a 0600 file of ours, in folders nobody else
            # can write, is believed (another user's could point us at their worker)
            with open_file(path, what="the MPI address file", secret=True) as f:
                data = json.load(f)
            if data.get("format") != ADDRESS_FILE_FORMAT:
                raise ValueError(f"{path} is not an hpcmesh MPI address file "
                                 f"(format {data.get('format')!r})")
            return data
        except FileNotFoundError:
            last = "it does not exist"
        except json.JSONDecodeError as e:
            last = f"it is not complete JSON ({e})"
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no MPI address file at {path} within {timeout:g} s ({last}); "
                               f"is `mpiexec ... python -m hpcmesh.mpi --address-file {path}` "
                               f"running?")
        time.sleep(0.05)


def _layout_from_file(data: dict) -> tuple[MPILayout, NodeRef]:
    procs = sorted(data["procs"], key=lambda p: p["rank"])
    entries = sorted((RankEntry(p["world_rank"], p["host"], p["node_id"], tuple(p["addresses"]),
                                p["pid"], p["local_rank"], p["local_size"], p["leader"])
                      for p in procs), key=lambda e: e.world_rank)
    layout = MPILayout(dict(data["extent"]), tuple(p["world_rank"] for p in procs),
                       tuple(entries), tuple(data["hosts"]))
    agent = NodeRef(data["agent"]["node_id"], tuple(data["agent"]["addresses"]))
    return layout, agent


def attach_to_mpi(path: str, *, timeout: float = 60.0, name: str = "mpi") -> ProcMesh:
    """Attach to an MPI job started with ``python -m hpcmesh.mpi --address-file PATH``.

    Waits up to ``timeout`` for the file, connects to every rank (which starts their
    lease) and returns a ProcMesh over them. If this process has no client runtime yet,
    one is created with the job's secret; otherwise the existing one connects with the
    job's secret for these connections."""
    data = _read_address_file(os.fspath(path), timeout)
    secret = bytes.fromhex(data["secret"])
    layout, agent = _layout_from_file(data)
    rt = install_client_runtime(secret)
    override = None if rt.secret == secret else secret
    per_try = min(timeout, 10.0)
    try:
        rt.node.run_sync(connect_all(rt.node, layout.entries, override, per_try),
                         per_try * 2 + 5)
    except (ConnectionError, OSError) as e:
        age = time.time() - float(data.get("created") or time.time())
        raise ConnectionError(f"{e} (the address file {path} was written {age:.0f} s ago; "
                              f"is that MPI job still running?)") from None
    return build_mesh(rt, layout, agent, name)


@dataclass
class Launch:
    """What ``python -m hpcmesh.mpi --script`` set up on rank 0 for the script it runs:
    the layout, rank 0's agent, the job's secret, and the mesh once built."""
    layout: MPILayout
    agent: NodeRef
    secret: bytes
    mesh: ProcMesh | None = None


_launch: Launch | None = None


def begin_launch(layout: MPILayout, agent: NodeRef, secret: bytes) -> Launch:
    """Rank 0 of a ``--script`` launch, before it runs the script: what
    :func:`mpi_proc_mesh` hands the script from then on."""
    global _launch
    _launch = Launch(layout, agent, secret)
    return _launch


def mpi_proc_mesh(name: str = "mpi") -> ProcMesh:
    """In a script run by ``python -m hpcmesh.mpi --script``: the ProcMesh over all ranks."""
    if _launch is None:
        raise RuntimeError(
            "mpi_proc_mesh() works only in a script started as `mpiexec -n N python -m "
            "hpcmesh.mpi --script SCRIPT` (it runs on rank 0); from a separate client use "
            "hpcmesh.mpi.attach_to_mpi(address_file)")
    if _launch.mesh is None:
        _launch.mesh = build_mesh(install_client_runtime(_launch.secret), _launch.layout,
                                   _launch.agent, name)
    return _launch.mesh
