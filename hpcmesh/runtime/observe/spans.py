"""Spans: named, timed, nested sections of code in the job's telemetry (``spans``).

``span("load_batch", step=3)`` times what it wraps: ``with``, ``async with``, or as a
decorator of a sync or async function (``@span()`` names it after the function). It works
anywhere: the controller, an actor's endpoints (sync or async), plain functions and
threads. A span is recorded once it ends, by this process's telemetry recorder; an
exception that ends it makes its status "error" and goes on up.

- ``span_id``: ``"<pid>-<8 hex digits drawn once per process>-<n>"``, e.g.
  ``"4711-9f3a01bc-12"``: the random part keeps two processes with one pid on two hosts
  (or one after the other) apart, so an id is unique in the job. A forked child draws anew.
- ``parent_span_id``: the span open in this asyncio task or thread when it started (a
  ``ContextVar``: a task started inside a span is its child; a new thread starts at the
  top).
- ``actor_id``, ``endpoint``: the actor (``context()``) and the endpoint the span ran in.
  The endpoint is found once per outermost span of a call, by looking up the stack for the
  function of one of the actor class's endpoints (nested spans take their parent's).

With telemetry off (``telemetry_recorder.RECORDER is None``) a span does nothing but that
check: ``with span(...)`` costs the object and a global load, a decorated function one
call more. Not on any hot path of the runtime: the runtime's own spans are its coarse
operations (spawning processes and actors, stopping them), which the controller opens with
``start_span`` and ends when their Future settles.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
import json
import logging
import os
import sys
import time
import weakref
from typing import Any, Callable, TypeVar

from . import telemetry_recorder as _tel
from ..context import current_context_var

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("hpcmesh.telemetry")

#: The span open in this task or thread: the parent of the next one.
_current: contextvars.ContextVar["OpenSpan | None"] = contextvars.ContextVar(
    "hpcmesh_span", default=None)

#: How far up the stack the endpoint a span runs in is looked for.
_MAX_DEPTH = 64

_prefix: str | None = None
_counter = itertools.count(1)


def _new_id() -> str:
    global _prefix
    p = _prefix
    if p is None:
        p = _prefix = f"{os.getpid()}-{os.urandom(4).hex()}"
    return f"{p}-{next(_counter)}"


def _after_fork() -> None:
    global _prefix, _counter
    _prefix = None
    _counter = itertools.count(1)
    _current.set(None)          # the parent's spans are not this process's


os.register_at_fork(after_in_child=_after_fork)


class OpenSpan:
    """A span that started and has not ended: ``end()`` records it. What ``start_span``
    returns, and what ``span`` keeps while it is entered; a ``with`` of it ends it with
    the exception that leaves the block (what a decorated function's call does)."""
    __slots__ = ("span_id", "parent", "name", "attributes", "start_us", "t0", "instance",
                 "actor_id", "endpoint", "entered", "outer", "ended")

    def __enter__(self) -> "OpenSpan":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.end(exc)
        return False

    def end(self, exc: BaseException | None = None) -> None:
        """Record it (ok, or error with ``exc``); dropped if telemetry is off by now. Never
        raises: telemetry must not change what the code it measures does."""
        try:
            self._end(exc)
        except Exception:  # noqa: BLE001 - a value that cannot even be described
            log.debug("span %s not recorded", self.name, exc_info=True)

    def _end(self, exc: BaseException | None) -> None:
        self.ended = True
        if self.entered:
            _current.set(self.parent)   # not a Token's reset: an endpoint that suspended
            #                             resumes in a copy of the context it started in
        rec = _tel.RECORDER
        if rec is None:
            return
        duration_us = (time.perf_counter_ns() - self.t0) // 1000
        parent = self.parent
        rec.span(self.start_us, self.span_id, parent.span_id if parent is not None else None,
                 self.name, duration_us, "ok" if exc is None else "error",
                 None if exc is None else _describe(exc), self.actor_id, self.endpoint,
                 _to_json(self.attributes))

    def end_after(self, future: Any) -> None:
        """End when ``future`` (a runtime Future) settles, as it settles."""
        future.add_done_callback(lambda f: self.end(f.exception()))    # (end never raises)


def _begin(name: str, attributes: dict, frame: Any, code: Any, entered: bool) -> OpenSpan:
    """A span starting now (telemetry is on); ``frame``, ``code``: where to look for the
    endpoint it runs in (``code``: the decorated function's)."""
    s = OpenSpan()
    ctx = current_context_var.get()
    inst = ctx.actor_instance if ctx is not None else None
    # The open span of this task or thread, of this actor (or both of none). asyncio copies
    # a context into what it schedules (a mailbox task, a connection's reader, a local
    # hand-over), so an ended span, or one of the caller's, can be found here: not parents.
    parent = _current.get()
    while parent is not None and (parent.ended or parent.instance is not inst):
        parent = parent.parent
    s.parent = parent
    s.span_id = _new_id()
    s.name = name
    s.attributes = attributes
    s.entered = entered
    s.ended = False
    s.outer = None
    s.instance = inst
    if ctx is None:
        s.actor_id = s.endpoint = None
    else:
        if parent is not None:
            s.actor_id, s.endpoint = parent.actor_id, parent.endpoint
        else:
            s.actor_id = f"{inst.actor_id}.{getattr(inst.rank, 'rank', 0)}" \
                if inst.actor_id else None
            s.endpoint = _endpoint_of(inst, frame, code)
    if entered:
        _current.set(s)
    s.start_us = time.time_ns() // 1000
    s.t0 = time.perf_counter_ns()
    return s


#: actor class -> {code object of an endpoint's function: the endpoint's name} (weak: a
#: class sent by value is a new class object at each spawn)
_endpoint_codes: "weakref.WeakKeyDictionary[type, dict]" = weakref.WeakKeyDictionary()


def _codes_of(cls: type) -> dict:
    from ..actor_host import ENDPOINT_ATTR     # loaded already in a process with actors
    codes: dict = {}
    for n in dir(cls):
        fn = getattr(cls, n, None)
        if getattr(fn, ENDPOINT_ATTR, None) is None:
            continue
        for _ in range(16):                   # the user's function, under decorators
            inner = getattr(fn, "__wrapped__", None)
            if inner is None:
                break
            fn = inner
        code = getattr(fn, "__code__", None)
        if code is not None:
            # one code for two endpoints (a decorator without __wrapped__): neither
            codes[code] = n if codes.get(code, n) == n else None
    return codes


def _endpoint_of(inst: Any, frame: Any, code: Any) -> str | None:
    obj = inst.actor
    if obj is None:
        return None
    cls = type(obj)
    codes = _endpoint_codes.get(cls)
    if codes is None:
        codes = _endpoint_codes[cls] = _codes_of(cls)
    if not codes:
        return None
    if code is not None and (name := codes.get(code)) is not None:
        return name
    for _ in range(_MAX_DEPTH):
        if frame is None:
            break
        name = codes.get(frame.f_code)
        if name is not None:
            return name
        frame = frame.f_back
    return None


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - its __str__ raises: its type still says something
        text = "(its message could not be read)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # noqa: BLE001
        return f"<{type(value).__name__} (its repr raised)>"


_encode = json.JSONEncoder(default=_safe_repr).encode   # (json.dumps(default=) makes one a call)


def _to_json(attributes: dict) -> str:
    if not attributes:
        return "{}"
    try:
        return _encode(attributes)
    except (ValueError, TypeError, RecursionError):     # a circular or too deep value
        return _encode({str(k): _safe_repr(v) for k, v in attributes.items()})


class Span:
    """What ``span(...)`` returns: a context manager (sync and async) and a decorator.
    One object is one ``with`` at a time (nested re-entry, as in recursion, is fine;
    ``span(...)`` in each ``with`` statement makes a new one); as a decorator each call is
    a span of its own."""
    __slots__ = ("name", "attributes", "_open", "_ended_id")

    def __init__(self, name: str | None, attributes: dict):
        self.name = name
        self.attributes = attributes
        self._open: OpenSpan | None = None
        self._ended_id: str | None = None

    @property
    def span_id(self) -> str | None:
        """The id of the span (while it is entered, then of the last one that ended);
        None with telemetry off."""
        o = self._open
        return o.span_id if o is not None else self._ended_id

    def _enter(self, frame: Any) -> "Span":
        name = self.name
        if name is None:        # ``with span():`` names it after the function it is in
            name = frame.f_code.co_qualname
        o = _begin(name, self.attributes, frame, None, True)
        o.outer = self._open
        self._open = o
        return self

    def _exit(self, exc: BaseException | None) -> None:
        o = self._open
        if o is not None:
            self._open = o.outer
            self._ended_id = o.span_id
            o.end(exc)

    def __enter__(self) -> "Span":
        if _tel.RECORDER is None:
            return self
        return self._enter(sys._getframe(1))

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._open is not None:
            self._exit(exc)
        return False

    async def __aenter__(self) -> "Span":
        if _tel.RECORDER is None:
            return self
        return self._enter(sys._getframe(1))

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        if self._open is not None:
            self._exit(exc)
        return False

    def __call__(self, fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"span(...) decorates a function; got {type(fn).__name__}")
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(f"span(...) does not decorate generators ({fn.__qualname__}): "
                            f"use `with span(...)` inside it")
        name = self.name or getattr(fn, "__qualname__", None) or repr(fn)
        attributes = self.attributes
        code = getattr(fn, "__code__", None)
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_spanned(*args, **kwargs):
                if _tel.RECORDER is None:
                    return await fn(*args, **kwargs)
                with _begin(name, attributes, sys._getframe(1), code, True):
                    return await fn(*args, **kwargs)
            return async_spanned    # type: ignore[return-value]

        @functools.wraps(fn)
        def spanned(*args, **kwargs):
            if _tel.RECORDER is None:
                return fn(*args, **kwargs)
            with _begin(name, attributes, sys._getframe(1), code, True):
                return fn(*args, **kwargs)
        return spanned      # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"span({self.name!r}, {self.attributes!r})"


def span(name: str | Callable | None = None, /, **attributes: Any) -> Any:
    """A span named ``name`` with ``attributes`` (recorded as JSON; a value JSON cannot
    hold as its ``repr``): ``with span("load", step=3):``, ``async with span(...)``,
    ``@span("name")``, ``@span()`` or ``@span`` (named after the function's qualified
    name; ``with span():`` after the function it is in)."""
    if name is None or isinstance(name, str):
        return Span(name, attributes)
    if callable(name) and not attributes:     # @span, without parentheses
        return Span(None, attributes)(name)
    raise TypeError(f"span() takes a name (a str) and keyword attributes; got "
                    f"{type(name).__name__}")


def start_span(name: str, **attributes: Any) -> OpenSpan | None:
    """A span of something that ends later (``OpenSpan.end``, ``end_after(future)``); not
    the parent of what follows it here. None with telemetry off: callers check
    ``telemetry_recorder.RECORDER`` first, so that its attributes are not even built."""
    if _tel.RECORDER is None:
        return None
    return _begin(name, attributes, sys._getframe(1), None, False)


def current_span_id() -> str | None:
    """The id of the span open in this task or thread, if any."""
    s = _current.get()
    return s.span_id if s is not None else None
