"""``Actor`` and ``@endpoint``: how a class declares what can be called remotely."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from ..runtime.actor_host import ENDPOINT_ATTR, EndpointInfo
from ..runtime.messages import ANSWERED_THROUGH_PORT
from ..shapes import MESH_ATTRIBUTE_NAMES

#: ActorMesh attributes that hpcmesh adds to Monarch's: an endpoint may take one of these
#: names (Monarch programs do, e.g. ``def name(self)``), and on that actor mesh the endpoint
#: takes the attribute's place.
GIVES_WAY_TO_ENDPOINTS = frozenset({"name", "points", "to_table"})

#: Names an endpoint may not take: they are attributes of the ActorMesh it is called through.
RESERVED_ENDPOINT_NAMES = frozenset(
    (MESH_ATTRIBUTE_NAMES | {"stop", "initialized", "name"}) - GIVES_WAY_TO_ENDPOINTS)


def endpoint(fn: Callable | None = None, *, concurrent: bool = False, propagate: Any = None,
             explicit_response_port: bool = False):
    """Mark a method as callable through an ActorMesh.

    ``concurrent=True`` lets several calls of it run at once (async endpoints);
    by default an actor handles one message at a time.

    ``explicit_response_port=True`` (as in Monarch): the method gets a ``Port`` before its
    arguments and answers through it (``port.send(value)``, or ``port.exception(exc)``),
    now or later, from any actor it hands the port to; what it returns is not sent. The
    caller's Future takes the first answer. If the method raises before answering, the
    caller gets the ``ActorError``; an error after the answer is lost. For a
    ``broadcast()`` the port drops what it is sent. The caller's Future fails if the actor
    it called dies, not if another actor it handed the port to does: wait with a timeout.
    """

    def mark(f: Callable) -> Callable:
        if not callable(f):
            raise TypeError(f"@endpoint decorates methods, got {type(f).__name__}")
        is_async = inspect.iscoroutinefunction(f)
        if inspect.isasyncgenfunction(f):
            raise TypeError(f"endpoint {f.__qualname__} is an async generator; return a value, "
                            f"or send items through a Port")
        if explicit_response_port:
            f = _answering_through_port(f, is_async)
        setattr(f, ENDPOINT_ATTR, EndpointInfo(f.__name__, concurrent, is_async, False,
                                               response_port=explicit_response_port))
        return f
    return mark(fn) if fn is not None else mark


def _answering_through_port(f: Callable, is_async: bool) -> Callable:
    """``f(self, port, *args)`` called as the runtime calls a response-port endpoint: with
    the reply PortRef first, and nothing sent back from its return value."""
    from .channel import Port

    if is_async:
        @functools.wraps(f)
        async def run(self, reply, *args, **kwargs):
            await f(self, Port(reply), *args, **kwargs)
            return ANSWERED_THROUGH_PORT
    else:
        @functools.wraps(f)
        def run(self, reply, *args, **kwargs):
            f(self, Port(reply), *args, **kwargs)
            return ANSWERED_THROUGH_PORT
    return run


def check_endpoint_names(cls: type) -> None:
    for name in dir(cls):
        if name in RESERVED_ENDPOINT_NAMES and getattr(getattr(cls, name, None), ENDPOINT_ATTR,
                                                        None) is not None:
            raise TypeError(
                f"endpoint {cls.__name__}.{name} collides with the ActorMesh attribute {name!r}; "
                f"rename it (reserved names: {', '.join(sorted(RESERVED_ENDPOINT_NAMES))})")


class Actor:
    """Base class of actors. Subclass it and decorate methods with ``@endpoint``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        check_endpoint_names(cls)
