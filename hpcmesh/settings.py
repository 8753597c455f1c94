"""Numeric ``HPCMESH_*`` settings read from the environment.

A mistyped value should stop the program with a message that names the variable and what
it accepts, not with Python's bare "could not convert string to float". Pure: imports
nothing from hpcmesh, so every layer may use it."""

from __future__ import annotations

import math
import os
from typing import Mapping


def env_number(name: str, default: float, *, unit: str = "seconds", minimum: float = 0.0,
               maximum: float = float("inf"), note: str = "", integer: bool = False,
               env: Mapping[str, str] | None = None) -> float:
    """``float(env[name])`` (``os.environ`` by default), or ``default`` when the variable
    is unset or empty. ``ValueError`` naming the variable if it is not a number from
    ``minimum`` to ``maximum`` (a whole one with ``integer``); ``note`` is added to that
    message (what 0 means, say)."""
    raw = (os.environ if env is None else env).get(name, "")
    if raw.strip() == "":
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if integer and not (math.isfinite(value) and value.is_integer()):
        value = float("nan")                   # 2.5 arenas: refused like a typo
    if not minimum <= value <= maximum:        # also refuses nan
        bound = f">= {minimum:g}" if maximum == float("inf") else \
            f"from {minimum:g} to {maximum:g}"
        extra = f" ({note})" if note else ""
        kind = "a whole number" if integer else "a number"
        raise ValueError(f"{name} must be {kind} of {unit} {bound}{extra}, not {raw!r}")
    return value
