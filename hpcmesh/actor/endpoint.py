"""``Actor`` and ``@endpoint``: how a class declares what can be called remotely."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ..runtime.actor_host import ENDPOINT_ATTR, EndpointInfo
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
    """
    if explicit_response_port:
        raise NotImplementedError("explicit_response_port endpoints are not supported yet; "
                                  "pass a Port from Channel.open() as an argument instead")

    def mark(f: Callable) -> Callable:
        if not callable(f):
            raise TypeError(f"@endpoint decorates methods, got {type(f).__name__}")
        is_async = inspect.iscoroutinefunction(f)
        setattr(f, ENDPOINT_ATTR, EndpointInfo(f.__name__, concurrent, is_async,
                                               inspect.isasyncgenfunction(f)))
        if inspect.isasyncgenfunction(f):
            raise TypeError(f"endpoint {f.__qualname__} is an async generator; return a value, "
                            f"or send items through a Port")
        return f
    return mark(fn) if fn is not None else mark


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
