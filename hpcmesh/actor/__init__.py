"""The actor API, matching ``monarch.actor`` for what it covers.

    from hpcmesh.actor import Actor, endpoint, this_host
"""

from ..runtime.bootstrap import BootstrapCommand, default_bootstrap_cmd
from ..runtime.context import Context, context, current_actor_name, current_rank, current_size
from ..runtime.errors import ActorError, SupervisionError
from ..runtime.future import Future
from ..shapes import Extent, Point
from .accumulator import Accumulator
from .channel import Channel, Port, PortReceiver
from .endpoint import Actor, endpoint
from .mesh import (ActorMesh, HostMesh, ProcMesh, ValueMesh, attach_to_workers, this_host,
                   this_proc)
from ..runtime.worker import run_worker_loop_forever

__all__ = [
    "Actor", "endpoint", "this_host", "attach_to_workers", "run_worker_loop_forever",
    "HostMesh", "ProcMesh", "ActorMesh", "ValueMesh", "Future", "Channel", "Port",
    "PortReceiver", "context", "current_rank", "current_size", "Context", "ActorError",
    "SupervisionError", "BootstrapCommand", "default_bootstrap_cmd", "Extent", "Point",
    "Accumulator", "current_actor_name", "this_proc",
]
