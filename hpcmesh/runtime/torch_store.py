"""The one place hpcmesh makes a torch ``TCPStore`` (collectives, spmd and member 0's store).

Every store is a meeting point where a member waits for the others, so how long it waits is
the collective timeout, ``HPCMESH_COLLECTIVE_TIMEOUT`` (or a caller's own), not a constant per
site. torch is imported here only when a store is made: the runtime itself never loads it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ..settings import collective_timeout


def tcp_store(host: str, port: int, *, master: bool, world_size: int | None = None,
              timeout: timedelta | None = None) -> Any:
    """Serve (``master``) or connect to the store at ``host:port`` (port 0 with ``master``:
    any free one, read back as ``store.port``). The master never waits for its members to
    connect: they come when they first use it. ``timeout`` defaults to the collective
    timeout and bounds every wait on the store, the connection included."""
    import torch.distributed as dist

    if timeout is None:
        timeout = timedelta(seconds=collective_timeout())
    return dist.TCPStore(str(host), int(port), world_size, is_master=master,
                         timeout=timeout, wait_for_workers=False)
