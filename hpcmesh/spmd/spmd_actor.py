"""``SPMDActor``: run an unchanged torchrun script (or ``-m module``) in every actor of a mesh.

The script sees what torchrun would give it: torchrun's variables, ``sys.argv``, and
``__name__ == "__main__"``. They come from ``setup_torch_elastic_env`` on the same processes,
from the spawn-time variables of the whole ProcMesh, or from a master address passed here.
"""

from __future__ import annotations

import math
import os
import runpy
import sys
from typing import Any

from ..actor.endpoint import Actor, endpoint
from ..runtime.context import current_rank
from ..runtime.torchrun_env import WORLD_ID_VAR, MemberPlace, torchrun_env
from .elastic_env import ELASTIC_VARS, fresh_rendezvous, leave_world, reachable_address


def _last_dim_place(point: Any) -> MemberPlace:
    """Monarch's numbering when no host layout is known: the last dim is the host's GPUs."""
    sizes = list(point.extent.values())
    per_host = sizes[-1] if sizes else 1
    world = math.prod(sizes) if sizes else 1
    return MemberPlace(point.rank, world, point.rank % per_host, per_host,
                       point.rank // per_host, world // per_host)


class SPMDActor(Actor):
    """Sets torchrun's variables and runs a training script, as Monarch's ``SPMDActor``.

    ``SPMDActor()`` runs in the world the processes are in already
    (``setup_torch_elastic_env`` on this mesh, or the spawn-time world of a whole ProcMesh);
    ``SPMDActor(master_addr, master_port)`` or ``main(master_addr, master_port, args)`` makes
    the actor mesh a world of its own around that master."""

    def __init__(self, master_addr: str | None = None, master_port: int | None = None) -> None:
        self.master = (master_addr, master_port) if master_addr is not None else None

    @endpoint
    def get_host_port(self, use_ipaddr: Any = None) -> tuple[str, int]:
        """An address of this host and a port free now (Monarch's endpoint)."""
        import socket
        with socket.socket() as s:
            s.bind(("", 0))
            return reachable_address(use_ipaddr), s.getsockname()[1]

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        self._setup_env((master_addr, master_port))

    def _setup_env(self, master: tuple[str, int]) -> None:
        leave_world()
        for var in ELASTIC_VARS:        # not an elastic world: RANK 0 serves this one's store
            os.environ.pop(var, None)
        os.environ.update(torchrun_env(_last_dim_place(current_rank()), master))

    def _check_world(self) -> None:
        point = current_rank()
        want = (str(point.rank), str(point.extent.nelem))
        have = (os.environ.get("RANK"), os.environ.get("WORLD_SIZE"))
        if have != want or "MASTER_ADDR" not in os.environ:
            raise RuntimeError(
                f"this process has torchrun variables RANK={have[0]} WORLD_SIZE={have[1]}, but "
                f"is member {want[0]} of {want[1]} of the mesh main() was called on; call "
                "hpcmesh.spmd.setup_torch_elastic_env(<that proc mesh>) first, or pass "
                "master_addr and master_port")

    @endpoint
    def main(self, *args: Any) -> bool:
        """``main(script_args)`` or ``main(master_addr, master_port, script_args)``;
        ``script_args`` is ``[script, arg, ...]`` or ``["-m", module, arg, ...]``.
        True when the script returns (or exits with status 0)."""
        if len(args) == 3:
            master_addr, master_port, script_args = args
            self._setup_env((master_addr, master_port))
        elif len(args) == 1:
            script_args = args[0]
            if self.master is not None:
                self._setup_env(self.master)
            else:
                self._check_world()
                if WORLD_ID_VAR in os.environ:
                    fresh_rendezvous()
        else:
            raise TypeError("main() takes (script_args) or (master_addr, master_port, "
                            f"script_args); got {len(args)} arguments")
        script_args = [str(a) for a in script_args]
        if not script_args or (script_args[0] == "-m" and len(script_args) < 2):
            raise ValueError(f"no script or module to run in {script_args!r}: pass "
                             "[script.py, args...] or ['-m', module, args...]")
        saved_argv = sys.argv
        try:
            if script_args[0] == "-m":
                sys.argv = [script_args[1], *script_args[2:]]
                runpy.run_module(script_args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(script_args)
                runpy.run_path(script_args[0], run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                raise RuntimeError(f"{' '.join(script_args)} exited with status {e.code}") from None
        finally:
            sys.argv = saved_argv
        return True
