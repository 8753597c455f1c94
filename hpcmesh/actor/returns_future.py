"""``@returns_future`` (Monarch's): an ``async def`` that returns a Future, so one function
serves sync callers (``.get()``) and async ones (``await``)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from typing import Any, Callable, Coroutine, ParamSpec, TypeVar

from ..runtime.future import Future, on_runtime_thread

P = ParamSpec("P")
T = TypeVar("T")


class _BodyFuture(Future):
    """A Future whose body (a coroutine) starts when it is first waited on: ``await``
    runs it on the awaiting loop, ``get()`` on a loop of its own (on a helper thread where
    this thread runs a loop already), as Monarch does; it runs at most once."""
    __slots__ = ("_body", "_lock")

    def __init__(self, coro: Coroutine, ctx: contextvars.Context):
        super().__init__()
        self._body: tuple | None = (coro, ctx)
        self._lock = threading.Lock()

    def _take(self) -> tuple | None:
        with self._lock:
            body, self._body = self._body, None
        return body

    async def _run(self, coro: Coroutine) -> None:
        try:
            self.set_result(await coro)
        except BaseException as e:  # noqa: BLE001 - the Future carries it
            self.set_exception(e)

    def _start_on_own_loop(self) -> threading.Thread | None:
        """Run the body to its end on a new loop: on this thread if it runs none (None),
        else on a helper thread (returned, running)."""
        body = self._take()
        if body is None:
            return None
        coro, ctx = body
        if _loop_on_this_thread():
            t = threading.Thread(target=ctx.run, args=(asyncio.run, self._run(coro)),
                                 name="returns_future", daemon=True)
            t.start()
            return t
        ctx.run(asyncio.run, self._run(coro))
        return None

    def get(self, timeout: float | None = None) -> Any:
        if not self.done():
            self._start_on_own_loop()
        return super().get(timeout)

    def __await__(self):
        body = self._take()
        if body is not None:
            coro, ctx = body
            ctx.run(asyncio.get_running_loop().create_task, self._run(coro))
        return super().__await__()

    def add_done_callback(self, cb: Callable[[Future], None]) -> None:
        # chained (then(), gather()): nobody drives it, so it runs on a helper thread
        if self._body is not None and not self.done():
            body = self._take()
            if body is not None:
                coro, ctx = body
                threading.Thread(target=ctx.run, args=(asyncio.run, self._run(coro)),
                                 name="returns_future", daemon=True).start()
        super().add_done_callback(cb)

    def __del__(self) -> None:
        if self._body is not None:      # never waited on: its code never runs
            self._body[0].close()


def _loop_on_this_thread() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return on_runtime_thread()


def returns_future(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Future[T]]:
    """Make an ``async def`` return a Future: calling it starts nothing; the first
    ``await`` runs the body on the awaiting loop, the first ``get()`` on a loop of its own.
    The body sees the caller's context variables (``context()`` among them)."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"returns_future needs an async def, got "
                        f"{getattr(fn, '__qualname__', type(fn).__name__)}")

    @functools.wraps(fn)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return _BodyFuture(fn(*args, **kwargs), contextvars.copy_context())
    return wrapped
