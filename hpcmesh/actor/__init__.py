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
from .actor_mesh import ActorMesh
from .host_mesh import HostMesh, attach_to_workers, this_host
from .proc_mesh import ProcMesh, this_proc
from .value_mesh import ValueMesh
from ..runtime.worker import run_worker_loop_forever

__all__ = [
    "Actor", "endpoint", "this_host", "attach_to_workers", "run_worker_loop_forever",
    "HostMesh", "ProcMesh", "ActorMesh", "ValueMesh", "Future", "Channel", "Port",
    "PortReceiver", "context", "current_rank", "current_size", "Context", "ActorError",
    "SupervisionError", "BootstrapCommand", "default_bootstrap_cmd", "Extent", "Point",
    "Accumulator", "current_actor_name", "this_proc",
]


def __getattr__(name: str):
    # hosts_from_config belongs to the job layer above this one; Monarch programs import it
    # from here too, so the facade hands it out lazily instead of importing upward at load.
    if name == "hosts_from_config":
        from ..hosts import hosts_from_config
        return hosts_from_config
    raise AttributeError(f"module 'hpcmesh.actor' has no attribute {name!r}")
