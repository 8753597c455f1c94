"""The one place hpcmesh touches asyncio's private internals (CPython 3.11-3.13).

Two features need what asyncio does not offer in public:
- an idle actor runs an async call inline, as its mailbox task (``actor_host.py``): that
  takes asyncio's record of the running task (``_enter_task``/``_leave_task``, shared with
  its C Task);
- ``breakpoint()`` in an async endpoint keeps the loop turning from inside the paused
  callback (``debugger.py``): that takes the pure-Python loop's ready queue, its
  ``_run_once`` and its selector's reader handles.

Everything private about asyncio is named here, so that a new Python breaks this module
alone (``tests/test_private_access.py`` allows these names here and nowhere else), and each
feature asks first whether the loop has what it needs (``enter_task is None``,
:func:`can_turn_inside`) and does without it otherwise.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from typing import Any, Callable

#: ``enter_task(loop, task)``/``leave_task(loop, task)``: make ``task`` the one
#: ``current_task()`` reports while a callback runs (asyncio's C functions themselves, no
#: wrapper: the inline call path runs them per call); None where this Python has none.
try:
    from asyncio.tasks import _enter_task as enter_task, _leave_task as leave_task
except ImportError:  # pragma: no cover - a future Python: callers do without
    enter_task = leave_task = None


def can_turn_inside(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether :func:`turn_once` and the ready-queue functions work on ``loop``: asyncio's
    own running loop (uvloop's cannot be run from inside itself), on a Python whose task
    record this module reaches."""
    return (isinstance(loop, asyncio.BaseEventLoop) and loop.is_running()
            and hasattr(loop, "_run_once") and hasattr(loop, "_selector")
            and enter_task is not None)


def ready_count(loop: asyncio.BaseEventLoop) -> int:
    """Callbacks ready to run now (the loop's ``_run_once`` runs this many per turn)."""
    return len(loop._ready)


def _nothing() -> None:
    pass


def skip_ready(loop: asyncio.BaseEventLoop, n: int) -> None:
    """Put ``n`` cancelled callbacks in front of the ready queue: a ``_run_once`` that
    counted its callbacks before others ran them pops these (and skips them) instead."""
    skipped = asyncio.Handle(_nothing, (), loop)
    skipped.cancel()
    loop._ready.extendleft(itertools.repeat(skipped, n))


def turn_once(loop: asyncio.BaseEventLoop) -> bool:
    """One turn of the loop, from inside one of its callbacks; False (and no turn) once
    the loop is stopping or closed."""
    if loop._stopping or loop.is_closed():
        return False
    loop._run_once()
    return True


def call_first(loop: asyncio.BaseEventLoop, fn: Callable, args: tuple,
               context: contextvars.Context) -> None:
    """``loop.call_soon(fn, *args, context=context)``, but ahead of every callback ready
    now."""
    loop._ready.appendleft(asyncio.Handle(fn, args, loop, context))


def copy_entered_reader_contexts(loop: asyncio.BaseEventLoop) -> None:
    """A socket's reader callback is one handle, run in one context each time: the one
    running now has its context entered, and entering it again (when that socket has
    more to read, in a turn from inside it) would fail, so it gets a copy."""
    for key in list(loop._selector.get_map().values()):
        for handle in key.data:
            try:
                if handle is not None:
                    handle._context.run(_nothing)
            except RuntimeError:        # entered: it is the one running now
                handle._context = handle._context.copy()


def reader_context(loop: asyncio.BaseEventLoop, sock: Any) -> contextvars.Context:
    """A copy of the context the reader callback of ``sock`` runs in (a fresh one if the
    socket was closed meanwhile)."""
    try:
        reader = loop._selector.get_key(sock.fileno()).data[0]
        return reader._context.copy()
    except (KeyError, ValueError, OSError, AttributeError):     # closed meanwhile
        return contextvars.Context()
