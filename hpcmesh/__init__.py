"""hpcmesh: a Slurm-native launcher and single-controller actor runtime.

Import what you use: ``hpcmesh.actor`` (meshes, actors), ``hpcmesh.job`` (where
hosts come from), ``hpcmesh.collectives`` (torch.distributed along mesh dims).
This package's own import stays light: nothing here imports torch or Slurm glue.
"""

__version__ = "0.1.0"

from .errors import HpcmeshError  # noqa: E402,F401 - the root of hpcmesh's own errors


def __getattr__(name: str):
    if name == "hosts_from_config":
        from .hosts import hosts_from_config
        return hosts_from_config
    raise AttributeError(f"module 'hpcmesh' has no attribute {name!r}")
