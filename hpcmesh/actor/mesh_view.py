"""What every mesh of processes or actors is: a view (a ``Shape``) over state shared by every
slice of one mesh; slicing makes a new view of the same state, so a message sent to a slice
reaches exactly those members. And the small Future helpers the mesh modules share.
"""

from __future__ import annotations

from typing import Callable

from ..runtime.context import current_context_var
from ..runtime.future import Future, failed, forward
from ..shapes import MeshTrait, Shape


class MeshView(MeshTrait):
    """A view (shape) over state shared by every slice of one mesh."""

    def __init__(self, state, shape: Shape):
        self._state = state
        self._shape = shape

    def _new_with_shape(self, shape: Shape):
        return type(self)(self._state, shape)

    @property
    def name(self) -> str:
        return self._state.name

    @property
    def initialized(self) -> Future:
        """Resolves (to this mesh) once every member is up."""
        return self._state.ready.then(lambda _: self)


def spawning_actor():
    """The actor spawning a mesh (it supervises what it spawns), or None on the client."""
    ctx = current_context_var.get()
    return ctx.actor_instance if ctx is not None else None


def chain(ready: Future, fn: Callable[[], Future]) -> Future:
    """A Future of ``fn()``'s Future, started once ``ready`` succeeds."""
    return chain_any(ready, lambda f: failed(f.exception()) if f.exception() is not None
                      else fn())


def chain_any(first: Future, fn: Callable[[Future], Future]) -> Future:
    """Like chain, but ``fn`` also runs (and sees the failure) when ``first`` fails."""
    out = Future()

    def go(f: Future) -> None:
        try:
            inner = fn(f)
        except BaseException as e:  # noqa: BLE001
            out.set_exception(e)
            return
        forward(inner, out)
    first.add_done_callback(go)
    return out


async def as_asyncio(f: Future):
    return await f
