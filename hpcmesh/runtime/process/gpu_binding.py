"""Which GPUs a process sees and what its LOCAL_RANK is: pure, no I/O.

torchrun's convention ("host" binding, the default): every process of a host sees all of
the host's GPUs and ``LOCAL_RANK`` (its slot among the host's processes) selects its own,
so ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` and ``init_device_mesh("cuda",
...)`` work. "process" binding pins each process to its one GPU instead
(``CUDA_VISIBLE_DEVICES=<it>``); its only device is then ``cuda:0``, so ``LOCAL_RANK`` is 0
there and the slot is in ``HPCMESH_LOCAL_SLOT`` (set in both bindings).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ...errors import excerpt
from ...settings import env_choice

#: The bindings, the default first.
BINDINGS = ("host", "process")
#: Where the controller's choice comes from when ``spawn_procs`` is not told.
BINDING_VAR = "HPCMESH_GPU_BINDING"
#: A process's slot among its host's processes, whatever LOCAL_RANK says.
SLOT_VAR = "HPCMESH_LOCAL_SLOT"
#: The largest GPU index, and count, of a node: Slurm keeps per-node counts in 16 bits
#: (65534 and 65535 mean "not set" and "unlimited"; ``slurm.parsing.MAX_PER_NODE``).
MAX_GPU_INDEX = 65533
_INDEX = re.compile(r"[0-9]{1,5}")


def gpu_indexes(name: str, raw: str) -> list[str]:
    """The GPUs an index list names (``0,1,2,3``: SLURM_STEP_GPUS / SLURM_JOB_GPUS, what
    Slurm gave the step or job on this node), as CUDA_VISIBLE_DEVICES entries. Anything
    else is a ValueError ``NAME=value: expected ...``: the entries go to every process's
    environment."""
    items = [i.strip() for i in raw.strip().split(",", MAX_GPU_INDEX + 1)]
    if len(items) > MAX_GPU_INDEX + 1 or not all(
            _INDEX.fullmatch(i) and int(i) <= MAX_GPU_INDEX for i in items):
        raise ValueError(f"{name}={excerpt(raw)}: expected GPU indexes from 0 to "
                         f"{MAX_GPU_INDEX}, comma-separated, like '0,1,2,3'")
    return items


def choose_binding(gpu_binding: str | None = None,
                   env: Mapping[str, str] | None = None) -> str:
    """``gpu_binding`` if given, else ``$HPCMESH_GPU_BINDING``, else "host"; a bad value is
    a ValueError naming the argument or the variable and the allowed values."""
    if gpu_binding is None:
        return env_choice(BINDING_VAR, BINDINGS[0], BINDINGS, env=env)
    if gpu_binding not in BINDINGS:
        raise ValueError(f"gpu_binding must be one of {', '.join(BINDINGS)}, "
                         f"not {gpu_binding!r}")
    return gpu_binding


def can_pin(per_host: int, host_gpus: Sequence[str]) -> bool:
    """Whether "process" binding gives each of ``per_host`` processes a GPU of its own."""
    return per_host <= len(host_gpus)


def gpu_env(binding: str, slot: int, per_host: int, host_gpus: Sequence[str]) -> dict[str, str]:
    """The variables for the process in ``slot`` of ``per_host`` on a host whose GPUs are
    ``host_gpus`` (CUDA_VISIBLE_DEVICES entries, in order): CUDA_VISIBLE_DEVICES (left out
    when the host has no GPU list: the process inherits), LOCAL_RANK, HPCMESH_LOCAL_SLOT.

    "process" binding on a host with fewer GPUs than processes keeps the host's list and
    LOCAL_RANK = slot, as "host" binding does (there is no GPU of its own to pin to)."""
    if binding not in BINDINGS:
        raise ValueError(f"GPU binding must be one of {', '.join(BINDINGS)}, not {binding!r}")
    if not 0 <= slot < per_host:
        raise ValueError(f"local slot {slot} out of range for {per_host} process(es) per host")
    env = {SLOT_VAR: str(slot), "LOCAL_RANK": str(slot)}
    if binding == "process" and can_pin(per_host, host_gpus):
        env["CUDA_VISIBLE_DEVICES"] = host_gpus[slot]
        env["LOCAL_RANK"] = "0"
    elif host_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(host_gpus)
    return env
