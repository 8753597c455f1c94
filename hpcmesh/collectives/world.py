"""The torch.distributed world of this process, and the process groups of a mesh in it.

torch has one default process group per process, and its public API (``new_group``,
``DeviceMesh``, DDP, FSDP2) builds on it. So the members of an actor mesh share a *world*:
a default process group whose ranks are the members' flat ranks. hpcmesh forms it when a
collective or ``device_mesh()`` first needs it, or adopts one the user (or torchrun's
variables from ``hpcmesh.spmd.setup_torch_elastic_env``) made with the same rank and size.

Two choices make a world cheap and let part of a mesh work without the rest:

* gloo connects lazily (``TORCH_GLOO_LAZY_INIT``, set only while hpcmesh creates a group):
  creating the world and its groups moves no data, so only the members of a group ever
  talk, on the group's first collective. NCCL is lazy by default.
* groups are made with ``new_group(ranks, use_local_synchronization=True)``: only their
  members take part, and a group's name comes from its ranks, so members that created
  other groups in between still agree on it. Each set of ranks gets one group per world.

A process is in at most one world at a time. Forming another (a second mesh in the same
process, a new ``setup_torch_elastic_env``) destroys the one hpcmesh formed before; a
world someone else formed that does not match is an error that says how to free it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator

import torch
import torch.distributed as dist

from ..runtime.torch_store import tcp_store
from ..runtime.torchrun_env import WORLD_ID_VAR
from .errors import CollectiveError

LAZY_GLOO_VAR = "TORCH_GLOO_LAZY_INIT"


@dataclass
class World:
    """The default process group as hpcmesh knows it."""

    key: str                    # which mesh (or elastic world) formed it ("" when adopted)
    rank: int
    size: int
    formed_here: bool           # hpcmesh called init_process_group (so may destroy it)
    any_mesh: bool = False      # serves every mesh numbered as it is (adopted, elastic)
    groups: dict[tuple[int, ...], Any] = field(default_factory=dict)
    generation: int = 0

    def group(self, ranks: tuple[int, ...], timeout: timedelta) -> Any:
        """The process group of ``ranks`` (sorted, world ranks); made once per world."""
        if len(ranks) == self.size:
            return dist.group.WORLD
        pg = self.groups.get(ranks)
        if pg is None:
            with lazy_gloo():
                pg = dist.new_group(list(ranks), timeout=timeout, use_local_synchronization=True)
            self.groups[ranks] = pg
        return pg


_lock = threading.RLock()
_current: World | None = None
_generations = 0
_formed_count: dict[str, int] = {}   # how often each key's world was formed in this process


@contextlib.contextmanager
def lazy_gloo() -> Iterator[None]:
    """gloo groups created inside connect on first use, not at creation."""
    old = os.environ.get(LAZY_GLOO_VAR)
    os.environ[LAZY_GLOO_VAR] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(LAZY_GLOO_VAR, None)
        else:
            os.environ[LAZY_GLOO_VAR] = old


def default_backend() -> str:
    """gloo for CPU tensors, and NCCL for CUDA tensors where this torch has it."""
    if dist.is_nccl_available() and torch.cuda.is_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def current() -> World | None:
    return _current


def elastic_world(rank: int, size: int, timeout: timedelta):
    """If ``setup_torch_elastic_env`` made this process member ``rank`` of a world of ``size``:
    (its key, how to reach its store); else None."""
    env = os.environ
    if WORLD_ID_VAR not in env:
        return None
    try:
        if (int(env["RANK"]), int(env["WORLD_SIZE"])) != (rank, size):
            return None
        addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    except (KeyError, ValueError):
        return None

    def store(generation: int) -> Any:
        # the first time keyed as init_process_group(init_method="env://") keys it, so
        # members that form the world either way meet; a world formed again after a
        # destroy must not read the earlier one's keys
        prefix = "default_pg" if generation == 1 else f"hpcmesh.world/{generation}"
        return dist.PrefixStore(prefix, tcp_store(addr, port, master=False, world_size=size,
                                                  timeout=timeout))
    return f"elastic:{env[WORLD_ID_VAR]}", store


def world_for(key: str, rank: int, size: int, store_factory, timeout: timedelta, *,
              any_mesh: bool = False) -> World:
    """This process's world as member ``rank`` of ``size`` for mesh ``key``: the current one
    if it fits, else a new one over ``store_factory(n)`` (a torch Store; ``n`` counts the
    worlds formed for ``key`` in this process, the same in every member)."""
    global _current, _generations
    with _lock:
        w = _current
        if w is not None and not dist.is_initialized():
            w = _current = None         # the user destroyed it
        if w is not None and w.rank == rank and w.size == size and (w.any_mesh or w.key == key):
            return w
        if dist.is_initialized():
            if w is None and dist.get_rank() == rank and dist.get_world_size() == size:
                _generations += 1       # someone else's world with our numbering: use it
                _current = World("", rank, size, formed_here=False, any_mesh=True,
                                 generation=_generations)
                return _current
            if w is None or not w.formed_here:
                raise CollectiveError(
                    f"torch's default process group (rank {dist.get_rank()} of "
                    f"{dist.get_world_size()}) was not formed for this mesh (member {rank} of "
                    f"{size}) and hpcmesh did not create it; call "
                    "torch.distributed.destroy_process_group() first, or form the world for "
                    "this mesh with hpcmesh.spmd.setup_torch_elastic_env")
            destroy()
        n = _formed_count[key] = _formed_count.get(key, 0) + 1
        try:
            with lazy_gloo():
                dist.init_process_group(default_backend(), store=store_factory(n), rank=rank,
                                        world_size=size, timeout=timeout)
        except Exception as e:
            raise CollectiveError(
                f"could not form the torch.distributed world of mesh {key!r} as member {rank} "
                f"of {size}: {e}") from e
        _generations += 1
        _current = World(key, rank, size, formed_here=True, any_mesh=any_mesh,
                         generation=_generations)
        return _current


def destroy() -> None:
    """Destroy the world hpcmesh formed in this process (an adopted one is left alone)."""
    global _current
    with _lock:
        w, _current = _current, None
        if w is not None and w.formed_here and dist.is_initialized():
            dist.destroy_process_group()


def forget() -> None:
    """Stop using the current world without destroying it (its owner will)."""
    global _current
    with _lock:
        _current = None
