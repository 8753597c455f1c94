"""The actor API, matching ``monarch.actor`` for what it covers.

    from hpcmesh.actor import Actor, endpoint, this_host
"""

from ..runtime.process.bootstrap import BootstrapCommand, default_bootstrap_cmd
from ..runtime.context import Context, context, current_actor_name, current_rank, current_size
from ..runtime.errors import ActorError, MeshFailure, SupervisionError
from ..runtime.future import Future
from ..shapes import Extent, Point
from .accumulator import Accumulator
from .channel import Channel, Port, PortReceiver
from .endpoint import Actor, as_endpoint, concurrent_endpoint, endpoint
from .actor_mesh import ActorMesh, Endpoint, send
from .controllers import get_or_spawn_controller
from .host_mesh import HostMesh, attach_to_workers, shutdown_context, this_host
from .proc_mesh import ProcMesh, this_proc
from .returns_future import returns_future
from .value_mesh import ValueMesh
from . import concurrent, config
from ..runtime.process.worker import run_worker_loop_forever, run_worker_loop_until_shutdown
# a module attribute a program replaces (hpcmesh.actor.unhandled_fault_hook = f), as in Monarch:
# the runtime reads it from here, at each failure, through the reader registered below
from ..runtime import supervision as _supervision
from ..runtime.supervision import unhandled_fault_hook

__all__ = [
    "Actor", "endpoint", "this_host", "attach_to_workers", "run_worker_loop_forever",
    "HostMesh", "ProcMesh", "ActorMesh", "ValueMesh", "Future", "Channel", "Port",
    "PortReceiver", "context", "current_rank", "current_size", "Context", "ActorError",
    "SupervisionError", "BootstrapCommand", "default_bootstrap_cmd", "Extent", "Point",
    "Accumulator", "current_actor_name", "this_proc", "MeshFailure", "unhandled_fault_hook",
    "Endpoint", "concurrent_endpoint", "concurrent", "send", "get_or_spawn_controller",
    "shutdown_context", "returns_future", "run_worker_loop_until_shutdown", "as_endpoint",
    "config",
]


def _installed_fault_hook():
    return unhandled_fault_hook


_supervision.set_fault_hook_reader(_installed_fault_hook)


def __getattr__(name: str):
    # hosts_from_config belongs to the job layer above this one; Monarch programs import it
    # from here too, so the facade hands it out lazily instead of importing upward at load.
    if name == "hosts_from_config":
        from ..hosts import hosts_from_config
        return hosts_from_config
    if name == "debug_controller":     # Monarch's name; hpcmesh.admin is above this layer
        from ..admin.debug import debug_controller
        return debug_controller
    raise AttributeError(f"module 'hpcmesh.actor' has no attribute {name!r}")
