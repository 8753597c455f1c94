"""Reduce ops by name, and the fingerprint members compare before a collective.

Before each collective (when checking is on), members all-gather a small fingerprint (op,
dtype, shape, root) so that a mismatch raises on every member instead of aborting the
process inside gloo. ``validate_reduce`` refuses locally what a backend would refuse only
after the group is engaged.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

_R = dist.ReduceOp
OP_NAMES = {
    "sum": _R.SUM,
    "product": _R.PRODUCT,
    "prod": _R.PRODUCT,
    "min": _R.MIN,
    "max": _R.MAX,
    "avg": _R.AVG,
    "mean": _R.AVG,
    "band": _R.BAND,
    "bor": _R.BOR,
    "bxor": _R.BXOR,
}
CANONICAL_OPS = {  # RedOpType -> canonical name
    _R.SUM: "sum",
    _R.PRODUCT: "product",
    _R.MIN: "min",
    _R.MAX: "max",
    _R.AVG: "avg",
    _R.BAND: "band",
    _R.BOR: "bor",
    _R.BXOR: "bxor",
}


def resolve_op(op: Any) -> tuple[str, Any]:
    """Return (canonical name or 'custom', value to hand to torch)."""
    if isinstance(op, str):
        key = op.strip().lower()
        if key not in OP_NAMES:
            raise ValueError(f"unknown reduce op {op!r}; use one of {sorted(OP_NAMES)} or a torch.distributed.ReduceOp")
        red = OP_NAMES[key]
        return CANONICAL_OPS[red], red
    if isinstance(op, _R.RedOpType):
        return CANONICAL_OPS.get(op, "custom"), op
    if isinstance(op, _R):
        # ReduceOp instances compare equal to RedOpType only from this side.
        for red, name in CANONICAL_OPS.items():
            if op == red:
                return name, red
        return "custom", op  # e.g. PREMUL_SUM with a factor
    raise TypeError(f"reduce op must be a name or torch.distributed.ReduceOp, got {op!r}")


_MAX_SHAPE = 8
_DTYPES = {zlib.crc32(str(d).encode()) & 0x7FFFFFFF: d for d in vars(torch).values() if isinstance(d, torch.dtype)}
_OPS = ("all_reduce", "reduce", "all_gather", "reduce_scatter", "broadcast", "barrier")
_OP_CODES: dict[int, str] = {}
for _o in _OPS:
    for _n in list(CANONICAL_OPS.values()) + ["custom", ""]:
        _OP_CODES[zlib.crc32(f"{_o}:{_n}".encode()) & 0x7FFFFFFF] = f"{_o}({_n})" if _n else _o


def fingerprint(opname: str, redop: str, root: int, tensor: torch.Tensor | None) -> list[int]:
    code = zlib.crc32(f"{opname}:{redop}".encode()) & 0x7FFFFFFF
    if tensor is None:
        return [code, root, 0, -1, 0, 0, 0] + [-1] * _MAX_SHAPE
    shape = list(tensor.shape)
    dtype_code = zlib.crc32(str(tensor.dtype).encode()) & 0x7FFFFFFF
    shape_hash = zlib.crc32(repr(shape).encode()) & 0x7FFFFFFF
    padded = (shape + [-1] * _MAX_SHAPE)[:_MAX_SHAPE]
    return [code, root, dtype_code, tensor.dim(), tensor.numel(), shape_hash, 1] + padded


def describe_fingerprint(row: Sequence[int]) -> str:
    code, root, dtype_code, ndim, numel, _h, has_tensor = row[:7]
    op = _OP_CODES.get(code, f"op#{code}")
    if not has_tensor:
        return op
    shape = [s for s in row[7 : 7 + min(ndim, _MAX_SHAPE)]]
    if ndim > _MAX_SHAPE:
        shape.append("...")
    dtype = str(_DTYPES.get(dtype_code, f"dtype#{dtype_code}")).replace("torch.", "")
    text = f"{op} {dtype}{shape} ({numel} elements)"
    if op.startswith(("reduce(", "broadcast")):
        text += f" root={root}"
    return text


_BITWISE = ("band", "bor", "bxor")


def validate_reduce(opname: str, name: str, t: torch.Tensor, kind: str) -> None:
    """Refuse locally what the backend would refuse only after the group is
    engaged (a refusal inside work.wait() leaves the group marked unusable)."""
    if name == "custom" and kind == "gloo":
        raise ValueError(f"{opname}: gloo supports only sum/product/min/max/avg/band/bor/bxor, not {name} ops")
    if t.is_complex() and name not in ("sum", "avg"):
        raise ValueError(f"{opname}: op={name!r} is not defined for complex tensors ({t.dtype}); use sum or avg")
    if name in _BITWISE and (t.is_floating_point() or t.is_complex()):
        raise ValueError(f"{opname}: op={name!r} needs an integer or bool tensor, got {t.dtype}")
    if name == "avg" and t.dtype == torch.bool:
        raise ValueError(f"{opname}: op='avg' is not defined for bool tensors")
