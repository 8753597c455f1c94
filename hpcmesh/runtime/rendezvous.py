"""Member 0 of an actor mesh serves the mesh's meeting point as soon as it is spawned.

The controller hands every member of a mesh the same ``Rendezvous`` (an address and port on
member 0's host, and a key prefix). Groups along some dimensions meet in a torch
``TCPStore`` there. Member 0 must serve that store even if it never takes part in a group
itself (``mesh.slice(hosts=1)`` leaves it out), so its process starts serving right after
the actor's ``__init__``, before any call can arrive: the runtime does it, and
``hpcmesh.collectives`` (a layer above) adopts the store. Only processes that have loaded
``torch.distributed`` by then serve one; others have no use for it, and the runtime never
imports torch itself.
"""

from __future__ import annotations

import logging
import sys

from .context import ActorInstance

log = logging.getLogger("hpcmesh.proc")


def needs_store(instance: ActorInstance) -> bool:
    return instance.rendezvous is not None and instance.rank.rank == 0 and \
        getattr(sys.modules.get("torch"), "distributed", None) is not None


def serve_store(instance: ActorInstance) -> None:
    """Start member 0's TCPStore; a failure is logged, and collectives report it when used."""
    from .torch_store import tcp_store   # here: every actor process imports this module

    rdv = instance.rendezvous
    try:
        instance.rendezvous_store = tcp_store(rdv.addr, rdv.port, master=True,
                                              world_size=instance.rank.extent.nelem)
    except Exception as e:  # noqa: BLE001 - the spawn goes on; collectives fail clearly later
        log.warning("could not serve the collective store of %s at %s:%s: %s",
                    instance.mesh_name, rdv.addr, rdv.port, e)
