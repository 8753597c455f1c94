"""``Actor`` and ``@endpoint``: how a class declares what can be called remotely."""

from __future__ import annotations

import functools
import inspect
import logging
import warnings
import weakref
from typing import (TYPE_CHECKING, Any, Awaitable, Callable, Concatenate, Literal, ParamSpec,
                    Protocol, TypeVar, overload)

from ..errors import HpcmeshError
from ..runtime import actor_host
from ..runtime.actor_host import AS_ENDPOINT, AS_ENDPOINT_PORT, ENDPOINT_ATTR, EndpointInfo
from ..runtime.messages import ANSWERED_THROUGH_PORT
from ..shapes import MESH_ATTRIBUTE_NAMES, MeshTrait
from .actor_mesh import Endpoint, NotAnEndpoint, endpoint_of_plain_method
from .channel import Port

P = ParamSpec("P")
R = TypeVar("R")

#: ActorMesh attributes that hpcmesh adds to Monarch's: an endpoint may take one of these
#: names (Monarch programs do, e.g. ``def name(self)``), and on that actor mesh the endpoint
#: takes the attribute's place.
GIVES_WAY_TO_ENDPOINTS = frozenset({"name", "points", "to_table"})

#: Names an endpoint may not take: they are attributes of the ActorMesh it is called through.
RESERVED_ENDPOINT_NAMES = frozenset(
    (MESH_ATTRIBUTE_NAMES | {"stop", "initialized", "name"}) - GIVES_WAY_TO_ENDPOINTS)


class EndpointMethod(Protocol[P, R]):
    """What ``@endpoint`` makes of a method ``(self, *P) -> R``, as type checkers see it:
    read through an actor mesh, an ``Endpoint[P, R]``. Typing only: at run time the method
    stays the plain function (marked), which the runtime calls directly."""

    def __get__(self, instance: Any, owner: Any) -> Endpoint[P, R]: ...


class EndpointDecorator(Protocol):
    """``@endpoint(...)`` with options, as type checkers see it (typing only)."""

    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], Awaitable[R]]
                 ) -> EndpointMethod[P, R]: ...

    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], R]) -> EndpointMethod[P, R]: ...


class PortEndpointDecorator(Protocol):
    """``@endpoint(explicit_response_port=True)``: ``(self, port: Port[R], *P)`` answers R."""

    @overload
    def __call__(self, fn: Callable[Concatenate[Any, Port[R], P], Awaitable[None]]
                 ) -> EndpointMethod[P, R]: ...

    @overload
    def __call__(self, fn: Callable[Concatenate[Any, Port[R], P], None]
                 ) -> EndpointMethod[P, R]: ...


@overload
def endpoint(fn: Callable[Concatenate[Any, P], Awaitable[R]], *, concurrent: bool = False,
             propagate: Any = None, explicit_response_port: Literal[False] = False
             ) -> EndpointMethod[P, R]: ...


@overload
def endpoint(fn: Callable[Concatenate[Any, P], R], *, concurrent: bool = False,
             propagate: Any = None, explicit_response_port: Literal[False] = False
             ) -> EndpointMethod[P, R]: ...


@overload
def endpoint(fn: None = None, *, concurrent: bool = False, propagate: Any = None,
             explicit_response_port: Literal[False] = False) -> EndpointDecorator: ...


@overload
def endpoint(fn: None = None, *, concurrent: bool = False, propagate: Any = None,
             explicit_response_port: Literal[True]) -> PortEndpointDecorator: ...


def endpoint(fn: Callable | None = None, *, concurrent: bool = False, propagate: Any = None,
             explicit_response_port: bool = False) -> Any:
    """Mark a method as callable through an ActorMesh.

    ``concurrent=True`` lets several calls of it run at once (async endpoints);
    by default an actor handles one message at a time.

    ``explicit_response_port=True`` (as in Monarch): the method gets a ``Port`` before its
    arguments and answers through it (``port.send(value)``, or ``port.exception(exc)``),
    now or later, from any actor it hands the port to; what it returns is not sent. The
    caller's Future takes the first answer. An error escaping the method fails the actor,
    as in Monarch (its owner's ``__supervise__`` is told; the caller, if not answered yet,
    gets the ``SupervisionError``): send errors with ``port.exception(e)``. For a
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


def concurrent_endpoint(fn: Callable | None = None, *, propagate: Any = None,
                        explicit_response_port: bool = False) -> Any:
    """Monarch's ``@concurrent_endpoint``: an async endpoint whose calls run at once,
    each as a task of its own, instead of one after another (``@endpoint(concurrent=True)``).
    Calls start in the order they were sent."""

    def mark(f: Callable) -> Any:
        # Monarch's words first (programs match on them), then which method
        if getattr(f, ENDPOINT_ATTR, None) is not None:
            raise ValueError(f"concurrent_endpoint does not wrap @endpoint; pass endpoint "
                             f"options to @concurrent_endpoint ({_qualname(f)} is an "
                             f"@endpoint already: drop that decorator)")
        if not inspect.iscoroutinefunction(f):
            raise ValueError(f"concurrent_endpoint can only wrap async endpoints "
                             f"({_qualname(f)} is a plain def: its calls could not run at "
                             f"once on one thread)")
        return endpoint(f, concurrent=True, propagate=propagate,
                        explicit_response_port=explicit_response_port)
    return mark(fn) if fn is not None else mark


def _qualname(f: Any) -> str:
    return getattr(f, "__qualname__", None) or type(f).__name__


class MonarchDifferenceWarning(HpcmeshError, UserWarning):
    """hpcmesh runs something Monarch 0.7 refuses (a class mixing sync and async
    endpoints): fine here, an error there. Silence it with
    ``warnings.filterwarnings("ignore", category=MonarchDifferenceWarning)``."""


_warned_mixed: "weakref.WeakSet[type]" = weakref.WeakSet()


def monarch_refusal(cls: type) -> str | None:
    """Why Monarch 0.7 would refuse ``cls`` at spawn (its ValueError's first words), or
    None: its endpoints mix ``def`` and ``async def``, or a hook (``__cleanup__``,
    ``__supervise__``) is not of its endpoints' kind."""
    sync, coro = [], []
    for name in dir(cls):
        info = getattr(getattr(cls, name, None), ENDPOINT_ATTR, None)
        if info is not None:
            (coro if info.is_async else sync).append(name)
    if sync and coro:
        return f"{cls} mixes both async and sync endpoints (sync: {sync} async: {coro})"
    hooks = {h: inspect.iscoroutinefunction(getattr(cls, h))
             for h in ("__cleanup__", "__supervise__") if callable(getattr(cls, h, None))}
    for hook, is_async in hooks.items():
        if sync and is_async:
            return f"{cls} has sync endpoints, but an async {hook} (sync: {sync})"
    if coro and hooks.get("__cleanup__") is False:
        return f"{cls} has async endpoints, but a synchronous __cleanup__ (async: {coro})"
    return None


def warn_if_mixed(cls: type, stacklevel: int = 3) -> None:
    """Once per class: a class Monarch refuses at spawn with a ValueError (sync and async
    endpoints mixed, or a hook of the other kind) spawns here. It is allowed on purpose:
    hpcmesh runs sync endpoints and hooks on the actor's own thread and async ones on its
    event loop, one message at a time, so none stalls the loop (in Monarch a sync one
    would run on the loop, and one that waits would deadlock it). The warning is for code
    that must also run under Monarch."""
    if cls in _warned_mixed:
        return
    why = monarch_refusal(cls)
    if why is None:
        return
    _warned_mixed.add(cls)
    warnings.warn(
        f"{why}. hpcmesh runs sync endpoints and hooks on the actor's own thread, one "
        f"message at a time with the async ones, so this is safe here; Monarch refuses such "
        f"a class at spawn with a ValueError: make them all def or all async def for code "
        f"that must run under Monarch too", MonarchDifferenceWarning, stacklevel=stacklevel)


def _answering_through_port(f: Callable, is_async: bool) -> Callable:
    """``f(self, port, *args)`` called as the runtime calls a response-port endpoint: with
    the reply PortRef first, and nothing sent back from its return value."""
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


actor_host.response_port_wrapper = _answering_through_port   # for as_endpoint(...)


def as_endpoint(not_an_endpoint: Any, *, propagate: Any = None,
                explicit_response_port: bool = False) -> Endpoint[..., Any]:
    """Call a plain method of a spawned actor (one without ``@endpoint``) as if it were an
    endpoint, as Monarch's ``as_endpoint``: ``as_endpoint(mesh.method).call(...)``. The
    options are ``@endpoint``'s: ``explicit_response_port=True`` gives the method a
    ``Port`` before its arguments to answer through. An ``async def`` method runs on the
    actor's event loop, a plain ``def`` on its thread, as an endpoint would."""
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError(
            f"as_endpoint() takes a plain method read through an actor mesh "
            f"(as_endpoint(mesh.method)), got {type(not_an_endpoint).__name__}"
            + ("; it is an endpoint already: call it directly"
               if isinstance(not_an_endpoint, Endpoint) else ""))
    return endpoint_of_plain_method(
        not_an_endpoint, AS_ENDPOINT_PORT if explicit_response_port else AS_ENDPOINT)


def check_endpoint_names(cls: type) -> None:
    for name in dir(cls):
        if name in RESERVED_ENDPOINT_NAMES and getattr(getattr(cls, name, None), ENDPOINT_ATTR,
                                                        None) is not None:
            raise TypeError(
                f"endpoint {cls.__name__}.{name} collides with the ActorMesh attribute {name!r}; "
                f"rename it (reserved names: {', '.join(sorted(RESERVED_ENDPOINT_NAMES))})")


# A checker sees an actor class as a mesh (slice, extent, stop...): spawn() is typed to
# return the actor class, as Monarch's is, so that ``mesh.method`` is an Endpoint[P, R].
# At run time Actor is a plain class: its instances get no mesh attributes.
_ActorBase = MeshTrait if TYPE_CHECKING else object


class Actor(_ActorBase):
    """Base class of actors. Subclass it and decorate methods with ``@endpoint``."""

    if TYPE_CHECKING:
        def stop(self, reason: str = ...) -> Any: ...

        @property
        def initialized(self) -> Any: ...

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        check_endpoint_names(cls)

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """A logger named after the actor's class, at DEBUG (as Monarch's ``Actor.logger``):
        what it logs goes where the process's logging goes (the controller, when its
        output is forwarded)."""
        logger = logging.getLogger(type(self).__name__)
        logger.setLevel(logging.DEBUG)
        return logger
