"""``Accumulator``: fold the results of one endpoint over a mesh into one value (Monarch's
``monarch.actor.Accumulator``), e.g. a total over every actor without a ValueMesh."""

from __future__ import annotations

from typing import Callable, Generic, ParamSpec, TypeVar

from ..runtime.future import Future
from .actor_mesh import Endpoint

P = ParamSpec("P")
R = TypeVar("R")
A = TypeVar("A")


class Accumulator(Generic[P, R, A]):
    """``Accumulator(mesh.endpoint, identity, combine).accumulate(*args)``: a Future of
    ``combine(...combine(combine(identity, r0), r1)..., rN)`` over every member's result.

    Results are combined in mesh order (rank 0 first), so a ``combine`` that is not
    commutative still gives the same value every time; the first failure fails it."""

    def __init__(self, endpoint: Endpoint[P, R], identity: A, combine: Callable[[A, R], A]):
        if not callable(getattr(endpoint, "call", None)):
            raise TypeError(f"Accumulator needs an endpoint of an actor mesh (mesh.method), "
                            f"got {type(endpoint).__name__}")
        if not callable(combine):
            raise TypeError(f"Accumulator's combine must be callable, got "
                            f"{type(combine).__name__}")
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: P.args, **kwargs: P.kwargs) -> Future[A]:
        identity, combine = self._identity, self._combine

        def fold(results) -> A:
            value = identity
            for r in results.values():
                value = combine(value, r)
            return value
        return self._endpoint.call(*args, **kwargs).then(fold)
