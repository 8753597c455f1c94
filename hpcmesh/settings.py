"""``HPCMESH_*`` settings read from the environment: numbers, on/off flags, choices.

A mistyped value should stop the program with a message that names the variable and what
it accepts, not with Python's bare "could not convert string to float" (or, for a flag,
be taken silently as "on"). Every ``HPCMESH_*`` setting is read through one of these.
Pure: imports nothing from hpcmesh, so every layer may use it."""

from __future__ import annotations

import math
import os
from typing import Mapping


def _shown(x: float) -> str:
    """3.1536e+07 reads better as 31536000."""
    x = float(x)
    return str(int(x)) if math.isfinite(x) and x.is_integer() and abs(x) < 1e15 else f"{x:g}"


def env_number(name: str, default: float, *, unit: str = "seconds", minimum: float = 0.0,
               maximum: float = float("inf"), note: str = "", integer: bool = False,
               finite: bool = False, positive: bool = False,
               env: Mapping[str, str] | None = None) -> float:
    """``float(env[name])`` (``os.environ`` by default), or ``default`` when the variable
    is unset or empty. ``ValueError`` naming the variable if it is not a number from
    ``minimum`` to ``maximum`` (a whole one with ``integer``; not ``inf`` with ``finite``,
    for settings where "never" means nothing; not 0 with ``positive``, for settings where
    0 would mean "fail at once"); ``note`` is added to that message (what 0 means, say)."""
    raw = (os.environ if env is None else env).get(name, "")
    if raw.strip() == "":
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if integer and not (math.isfinite(value) and value.is_integer()):
        value = float("nan")                   # 2.5 arenas: refused like a typo
    if finite and math.isinf(value):
        value = float("nan")
    if positive and value == 0:
        value = float("nan")
    if not minimum <= value <= maximum:        # also refuses nan
        if positive:
            bound = "> 0" if maximum == float("inf") else f"> 0 and at most {_shown(maximum)}"
        elif maximum == float("inf"):
            bound = f">= {_shown(minimum)}"
        else:
            bound = f"from {_shown(minimum)} to {_shown(maximum)}"
        if finite and maximum == float("inf"):
            bound += " and finite"             # "never" means nothing for this setting
        extra = f" ({note})" if note else ""
        kind = "a whole number" if integer else "a number"
        raise ValueError(f"{name} must be {kind} of {unit} {bound}{extra}, not {raw!r}")
    return value


_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def env_flag(name: str, default: bool, *, env: Mapping[str, str] | None = None) -> bool:
    """An on/off setting: 1/true/yes/on or 0/false/no/off (any case), ``default`` when
    unset or empty; anything else is a ``ValueError`` naming the variable."""
    raw = (os.environ if env is None else env).get(name, "")
    value = raw.strip().lower()
    if value == "":
        return default
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{name} must be 1 or 0 (or true/false, yes/no, on/off), not {raw!r}")


def env_choice(name: str, default: str, choices: tuple[str, ...], *,
               env: Mapping[str, str] | None = None) -> str:
    """One of ``choices`` (compared without case, returned as spelled there), ``default``
    when unset or empty; anything else is a ``ValueError`` naming the variable."""
    raw = (os.environ if env is None else env).get(name, "")
    if raw.strip() == "":
        return default
    for choice in choices:
        if raw.strip().lower() == choice.lower():
            return choice
    raise ValueError(f"{name} must be one of {', '.join(choices)}, not {raw!r}")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(env: Mapping[str, str] | None = None) -> str:
    """``HPCMESH_LOG_LEVEL``: the logging level of every hpcmesh process (default WARNING)."""
    return env_choice("HPCMESH_LOG_LEVEL", "WARNING", LOG_LEVELS, env=env)


COLLECTIVE_TIMEOUT_VAR = "HPCMESH_COLLECTIVE_TIMEOUT"
#: A collective waits this long by default before it fails instead of hanging.
DEFAULT_COLLECTIVE_TIMEOUT_S = 60.0
#: A year: longer is no timeout at all (and timedelta overflows soon after).
MAX_COLLECTIVE_TIMEOUT_S = 365 * 86400.0


def collective_timeout(env: Mapping[str, str] | None = None) -> float:
    """``HPCMESH_COLLECTIVE_TIMEOUT``: seconds a collective waits before it fails (default
    60). Read by each member when its collectives start, and checked by the controller
    with the other settings (:func:`check_process_settings`), where a typo costs nothing."""
    return env_number(COLLECTIVE_TIMEOUT_VAR, DEFAULT_COLLECTIVE_TIMEOUT_S, positive=True,
                      finite=True, maximum=MAX_COLLECTIVE_TIMEOUT_S, env=env)


def check_process_settings(env: Mapping[str, str] | None = None) -> None:
    """Read, once, every setting the processes a controller starts will read at their
    start, so that a typo fails the user's program with its name instead of every
    process it starts."""
    log_level(env)
    for flag in ("HPCMESH_ZYGOTE", "HPCMESH_UVLOOP", "HPCMESH_MALLOC_TUNE",
                 "HPCMESH_FOLLOW_CALLER", "HPCMESH_TELEMETRY", "HPCMESH_RELAY"):
        env_flag(flag, True, env=env)
    env_number("HPCMESH_LEASE_GRACE", 10, finite=True, env=env)
    env_number("HPCMESH_STOP_GRACE", 5, finite=True, env=env)
    env_number("HPCMESH_TELEMETRY_BUFFER", 1, unit="rows", minimum=1, integer=True, env=env)
    env_number("HPCMESH_RELAY_FOLD_US", 200, unit="microseconds", env=env)    # the agents'
    # read by each member when its collectives start: a typo would fail every one of them
    collective_timeout(env)
    env_flag("HPCMESH_COLLECTIVE_CHECK", False, env=env)
