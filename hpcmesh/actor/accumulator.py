"""``Accumulator``: fold the results of one endpoint over a mesh into one value (Monarch's
``monarch.actor.Accumulator``), e.g. a total over every actor without a ValueMesh."""

from __future__ import annotations

from typing import Any, Callable, Generic, ParamSpec, TypeVar

from ..runtime.client import current_or_client_node
from ..runtime.future import Future
from .actor_mesh import Endpoint, ResultStream

P = ParamSpec("P")
R = TypeVar("R")
A = TypeVar("A")


class Accumulator(Generic[P, R, A]):
    """``Accumulator(mesh.endpoint, identity, combine).accumulate(*args)``: a Future of
    ``combine(...combine(combine(identity, r0), r1)..., rN)`` over every member's result.

    The results come through ``endpoint.stream()``, as in Monarch (an object that stands
    in for an endpoint with a ``stream()`` of its own sees it used, its Futures folded in
    the order it gives them). Those of a mesh's stream are combined in mesh order (rank 0
    first; Monarch: arrival order), so a ``combine`` that is not commutative, or a sum of
    floats, gives the same value every time; the first failure in that order fails it."""

    def __init__(self, endpoint: Endpoint[P, R], identity: A, combine: Callable[[A, R], A]):
        if not callable(getattr(endpoint, "stream", None)):
            raise TypeError(f"Accumulator needs an endpoint of an actor mesh (mesh.method), "
                            f"or an object with a stream() method; got "
                            f"{type(endpoint).__name__}")
        if not callable(combine):
            raise TypeError(f"Accumulator's combine must be callable, got "
                            f"{type(combine).__name__}")
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: P.args, **kwargs: P.kwargs) -> Future[A]:
        """Start the call now (a failure to start it raises here); the Future settles
        once every result is folded in."""
        stream = self._endpoint.stream(*args, **kwargs)
        out: Future[A] = Future()
        poll = None
        if isinstance(stream, ResultStream):
            results = stream.in_mesh_order()
            if len(results) > 1:
                poll = current_or_client_node().poll_for_rest
        else:
            results = list(stream)
        self._fold(results, 0, self._identity, out, poll)
        return out

    def _fold(self, results: list, i: int, value: Any, out: Future,
              poll: Callable[[Future], None] | None = None, woken: bool = False) -> None:
        """Combine ``results[i:]`` into ``value`` as far as they have arrived; wait for
        the first that has not (no thread blocks, nothing recurses per result). ``poll``:
        once woken by a reply, keep polling for the others, as call() does."""
        if woken and poll is not None:
            poll(out)
            poll = None
        while i < len(results):
            f = results[i]
            if not isinstance(f, Future):
                out.set_exception(TypeError(
                    f"Accumulator: stream() gave a {type(f).__name__} at position {i}; "
                    f"it must give Futures (as an endpoint's stream() does)"))
                return
            if not f.done():
                f.add_done_callback(lambda _f, i=i, value=value:
                                    self._fold(results, i, value, out, poll, True))
                return
            if f.exception() is not None:
                out.set_exception(f.exception())
                return
            try:
                value = self._combine(value, f.value())
            except BaseException as e:  # noqa: BLE001 - the Future carries it
                out.set_exception(e)
                return
            i += 1
        out.set_result(value)
