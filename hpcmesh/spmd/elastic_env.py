"""``setup_torch_elastic_env``: make any view of a ProcMesh a torch.distributed world of its own.

What torchrun does for the processes it starts, done from the controller for processes that
already run: member 0 serves a ``TCPStore`` on a port it keeps (torchrun's agent store: no
window in which another socket can take the port), and every member gets torchrun's
variables for its place in the view (RANK in view order, LOCAL_WORLD_SIZE and GROUP_RANK from
the hosts the view's members are on). ``init_process_group()`` with no arguments then forms
exactly that world; so does ``hpcmesh.collectives.device_mesh()``.

Again and again on the same processes: each call is a new world. A default process group
left from an earlier one is destroyed first, and the earlier store is dropped.

LOCAL_RANK keeps naming the process's own GPU (the slot it was started in on its host), so
``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` stays right in a slice that leaves
some of a host's processes out; for the whole mesh, a rename, split or flatten it is exactly
torchrun's local rank.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Generator
from typing import Any

from ..actor.endpoint import Actor, endpoint
from ..actor.proc_mesh import ProcMesh
from ..runtime.context import current_rank
from ..runtime.future import Future
from ..runtime.torch_store import tcp_store
from ..runtime.torchrun_env import (TORCHRUN_VARS, WORLD_EXTENT_VAR, WORLD_ID_VAR, places,
                                    torchrun_env)

log = logging.getLogger("hpcmesh.spmd")

#: The LOCAL_RANK a process was started with (the one that selects its GPU), kept across worlds.
DEVICE_LOCAL_RANK_VAR = "HPCMESH_DEVICE_LOCAL_RANK"

#: ``addr:port`` of the store setup_torch_elastic_env made for the world (MASTER_* of its
#: first run).
FIRST_STORE_VAR = "HPCMESH_TORCH_WORLD_STORE"
#: What ``enter`` sets beyond torchrun's own variables.
ELASTIC_VARS = ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                "TORCHELASTIC_MAX_RESTARTS", WORLD_ID_VAR, FIRST_STORE_VAR, WORLD_EXTENT_VAR)

_served: dict[str, Any] = {}      # world id (/run) -> a TCPStore this process serves for it
_runs: dict[str, int] = {}        # world id -> SPMDActor.main runs in it so far


def reachable_address(use_ipaddr: Any) -> str:
    """The address other hosts reach this process at: the one its host agent advertises
    (hpcmesh's interface choice, IPoIB first), or the host name's address of a family."""
    family = address_family(use_ipaddr)
    if family is None:
        return os.environ.get("HPCMESH_ADVERTISE_HOST") or socket.gethostname()
    infos = socket.getaddrinfo(socket.gethostname(), None, family, socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"host {socket.gethostname()} has no {use_ipaddr} address")
    return infos[0][4][0]


def address_family(use_ipaddr: Any) -> int | None:
    """None, or the socket family ``use_ipaddr`` names (Monarch's AddrType, or its name)."""
    if use_ipaddr is None:
        return None
    name = str(getattr(use_ipaddr, "name", use_ipaddr)).lower()
    families = {"ipv4": socket.AF_INET, "ipv6": socket.AF_INET6}
    if name not in families:
        raise ValueError(f"use_ipaddr={use_ipaddr!r}: use None (the host agent's address), "
                         f"'ipv4' or 'ipv6'")
    return families[name]


def leave_world() -> None:
    """Destroy this process's default process group, whoever formed it (a new world
    follows), and forget hpcmesh's groups in it."""
    import sys
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is None:
        return                                  # torch not loaded: no world to leave
    from ..collectives import world as world_mod
    world_mod.forget()
    if dist.is_available() and dist.is_initialized():
        log.info("destroying the default process group of an earlier world")
        dist.destroy_process_group()


def fresh_rendezvous() -> None:
    """Before a second ``init_process_group()`` in the same elastic world: move MASTER_PORT to
    a new store, as torchrun does for every restart (env:// reads unprefixed keys, so a second
    world over the first store would meet the first one's stale addresses). Every member
    calls it the same number of times; rank 0 serves the new store and posts its port in the
    world's first store, which member 0 serves for as long as the world lasts."""
    world_id = os.environ[WORLD_ID_VAR]
    addr, port = os.environ[FIRST_STORE_VAR].rsplit(":", 1)
    _runs[world_id] = run = _runs.get(world_id, 0) + 1
    if run == 1:
        return                                  # the first run uses the store set up for it
    first = tcp_store(addr, port, master=False)
    key = f"hpcmesh.spmd/run{run}/master_port"
    if os.environ.get("RANK") == "0":
        store = tcp_store(os.environ["MASTER_ADDR"], 0, master=True)
        _served[f"{world_id}/run{run}"] = store
        first.set(key, str(store.port))
    os.environ["MASTER_PORT"] = first.get(key).decode()


class ElasticEnvActor(Actor):
    """Placed on every member of the view for the setup only."""

    @endpoint
    def serve_store(self, world_id: str, use_ipaddr: Any) -> tuple[str, int]:
        addr = reachable_address(use_ipaddr)
        store = tcp_store(addr, 0, master=True)
        _served[world_id] = store
        return addr, store.port

    @endpoint
    def enter(self, world_id: str, master: tuple[str, int], member_places: list,
              extent: list) -> None:
        leave_world()
        for old in [k for k in _served if not k.startswith(world_id)]:
            del _served[old]                    # closes the earlier world's stores
        place = member_places[current_rank().rank]
        device_local = os.environ.setdefault(DEVICE_LOCAL_RANK_VAR,
                                             os.environ.get("LOCAL_RANK", str(place.local_rank)))
        for var in TORCHRUN_VARS:
            os.environ.pop(var, None)
        os.environ.update(torchrun_env(place, master))
        os.environ.update({
            "LOCAL_RANK": device_local,
            "TORCHELASTIC_USE_AGENT_STORE": "True",     # rank 0 connects, member 0 serves
            "TORCHELASTIC_RUN_ID": world_id,
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            WORLD_ID_VAR: world_id,
            FIRST_STORE_VAR: f"{master[0]}:{master[1]}",
            WORLD_EXTENT_VAR: ",".join(f"{k}={v}" for k, v in extent),
        })


def _setup_steps(proc_mesh: Any, master_addr: str | None, master_port: int | None,
                 use_ipaddr: Any) -> Generator[Future, Any, None]:
    """The setup as steps, each a Future; driven by a blocking or an async caller."""
    if not isinstance(proc_mesh, ProcMesh):
        raise TypeError(f"setup_torch_elastic_env needs a ProcMesh or a view of one (slice, "
                        f"rename, split, flatten), got {type(proc_mesh).__name__}")
    if (master_addr is None) != (master_port is None):
        raise ValueError("pass both master_addr and master_port, or neither (member 0 then "
                         "serves the rendezvous store on a port it keeps)")
    address_family(use_ipaddr)
    world_id = uuid.uuid4().hex[:12]
    member_places = places(proc_mesh.host_ids)
    extent = list(proc_mesh.extent.items())
    helpers = proc_mesh.spawn("_torch_elastic_env", ElasticEnvActor)
    try:
        if master_addr is None:
            first = helpers.slice(**dict.fromkeys(proc_mesh.extent.keys(), 0))
            master_addr, master_port = yield first.serve_store.call_one(world_id, use_ipaddr)
        yield helpers.enter.call(world_id, (str(master_addr), int(master_port)), member_places,
                                 extent)
    finally:
        helpers.stop("torch elastic env set up")


def setup_torch_elastic_env(proc_mesh: Any, master_addr: str | None = None,
                            master_port: int | None = None, use_ipaddr: Any = None) -> None:
    """Write torchrun's variables into every process of ``proc_mesh`` (a ProcMesh or a view
    of one), making it a world of its own; blocks until every member has them."""
    steps = _setup_steps(proc_mesh, master_addr, master_port, use_ipaddr)
    try:
        f = next(steps)
        while True:
            f = steps.send(f.get())
    except StopIteration:
        return
    finally:
        steps.close()        # a failed step: the helpers are stopped all the same


async def setup_torch_elastic_env_async(proc_mesh: Any, master_addr: str | None = None,
                                        master_port: int | None = None,
                                        use_ipaddr: Any = None) -> None:
    """``setup_torch_elastic_env`` for async code."""
    steps = _setup_steps(proc_mesh, master_addr, master_port, use_ipaddr)
    try:
        f = next(steps)
        while True:
            f = steps.send(await f)
    except StopIteration:
        return
    finally:
        steps.close()
