"""Faults nobody handled reach ``unhandled_fault_hook`` on the controller, as in Monarch."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Callable

from .errors import MeshFailure


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """Called on the controller with each MeshFailure that no owner's ``__supervise__``
    handled. Replace it as ``hpcmesh.actor.unhandled_fault_hook = my_hook``: returning
    drops the fault; raising (this default raises SystemExit(1)) makes it fatal, as in
    Monarch: the failure is printed and the main thread gets a KeyboardInterrupt (only
    the main thread can run ``finally`` blocks and atexit cleanup), so the client exits
    killed by SIGINT. It runs on a thread of its own, one failure at a time."""
    sys.exit(1)


def _this_default() -> Callable[[MeshFailure], None]:
    return unhandled_fault_hook


_hook_reader: Callable[[], Callable[[MeshFailure], None]] = _this_default


def set_fault_hook_reader(reader: Callable[[], Callable[[MeshFailure], None]]) -> None:
    """Where :func:`run_unhandled_fault_hook` finds the hook the program installed: the
    public face (``hpcmesh.actor``, a layer above this one, whose attribute a program
    replaces) registers a reader of that attribute when it is imported, as it is read at
    each failure (it may be replaced at any time)."""
    global _hook_reader
    _hook_reader = reader


def run_unhandled_fault_hook(failure: MeshFailure) -> None:
    """The hook the program installed (looked up now: it may have been replaced), run."""
    hook = _hook_reader()
    try:
        hook(failure)
    except BaseException as e:  # noqa: BLE001 - SystemExit included: the fault is fatal
        why = "" if isinstance(e, SystemExit) else \
            f"\n(unhandled_fault_hook raised {type(e).__name__}: {e})"
        sys.stderr.write(f"Unhandled hpcmesh error on the controller:\n{failure.report()}"
                         f"{why}\n")
        sys.stderr.flush()
        main = threading.main_thread()
        if main.is_alive() and main is not threading.current_thread():
            signal.pthread_kill(main.ident, signal.SIGINT)
