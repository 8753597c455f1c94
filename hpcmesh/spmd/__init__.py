"""torchrun-style SPMD training on hpcmesh meshes (Monarch's ``monarch.spmd``).

* ``setup_torch_elastic_env(procs)`` / ``setup_torch_elastic_env_async(procs)``: make a
  ProcMesh, or any view of one, a torch.distributed world: torchrun's variables in every
  process, so ``init_process_group()`` works unchanged.
* ``SPMDActor``: runs an existing torchrun script in each actor (``main([script, args])``).
* ``device_mesh()``: inside an actor, the ``DeviceMesh`` of its mesh, dims as names.
"""

from typing import Any

from .elastic_env import setup_torch_elastic_env, setup_torch_elastic_env_async
from .spmd_actor import SPMDActor

__all__ = ["SPMDActor", "device_mesh", "setup_torch_elastic_env",
           "setup_torch_elastic_env_async"]


def device_mesh(extent: Any = None, *, device_type: str | None = None):
    """``hpcmesh.collectives.device_mesh`` (imported here on use: the controller, which only
    sets worlds up, never loads torch)."""
    from .. import collectives
    return collectives.device_mesh(extent, device_type=device_type)
