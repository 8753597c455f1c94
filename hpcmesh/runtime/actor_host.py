"""Runs one actor on a worker process: mailbox, ordering, sync/async endpoints, errors.

Messages from one sender arrive in order on one connection and an actor runs
one message at a time, so the mailbox only has to queue while an endpoint is
suspended or running in the actor's thread. Async endpoints run as tasks on
the process's event loop (the reply is sent from inside the task); sync
endpoints run on the actor's own thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .context import ActorInstance, Context, _current
from .errors import ActorError
from .node import MSG_DELIVER, Node, PortRef, format_exception

log = logging.getLogger("hpcmesh.actor")

ENDPOINT_ATTR = "_hpcmesh_endpoint"


class EndpointInfo:
    """Attached to functions by ``@endpoint``."""
    __slots__ = ("name", "concurrent", "is_async", "is_asyncgen")

    def __init__(self, name: str, concurrent: bool, is_async: bool, is_asyncgen: bool = False):
        self.name = name
        self.concurrent = concurrent
        self.is_async = is_async
        self.is_asyncgen = is_asyncgen


def endpoint_names(cls) -> list[str]:
    return sorted(n for n in dir(cls) if getattr(getattr(cls, n, None), ENDPOINT_ATTR, None))


class ActorHost:
    """One actor instance on this process."""

    def __init__(self, node: Node, instance: ActorInstance, obj: Any, supervisor: PortRef | None):
        self.node = node
        self.instance = instance
        self.obj = obj
        self.cls = type(obj)
        self.supervisor = supervisor
        self._busy = False
        self._queue: deque = deque()
        self._executor: ThreadPoolExecutor | None = None
        self._tasks: set = set()
        self._methods: dict[str, tuple] = {}
        self.stopped = False

    # -- lookup ----------------------------------------------------------------------
    def _method(self, name: str):
        m = self._methods.get(name)
        if m is None:
            fn = getattr(self.cls, name, None)
            info = getattr(fn, ENDPOINT_ATTR, None)
            if info is None:
                raise AttributeError(
                    f"{name!r} is not an endpoint of {self.cls.__name__}; endpoints: "
                    f"{', '.join(endpoint_names(self.cls)) or '(none)'}. "
                    f"Decorate the method with @endpoint.")
            m = self._methods[name] = (fn, info)
        return m

    def executor(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"actor-{self.cls.__name__}")
        return self._executor

    # -- dispatch --------------------------------------------------------------------
    def handle_call(self, msg: tuple) -> None:
        if self.stopped:
            self._fail(msg, RuntimeError(f"actor {self.instance.mesh_name} has been stopped"))
            return
        try:
            fn, info = self._method(msg[2])
        except AttributeError as e:
            self._fail(msg, e)
            return
        if info.concurrent:
            self._start(msg, fn, info, track_busy=False)
            return
        if self._busy:
            self._queue.append(msg)
            return
        self._start(msg, fn, info, track_busy=True)

    def _drain(self) -> None:
        while self._queue and not self._busy:
            msg = self._queue.popleft()
            if self.stopped:
                self._fail(msg, RuntimeError(f"actor {self.instance.mesh_name} has been stopped"))
                continue
            try:
                fn, info = self._method(msg[2])
            except AttributeError as e:
                self._fail(msg, e)
                continue
            self._start(msg, fn, info, track_busy=True)

    def _start(self, msg: tuple, fn, info: EndpointInfo, track_busy: bool) -> None:
        ctx = Context(self.instance, msg[6] if msg[6] is not None else self.instance.rank)
        token = _current.set(ctx)
        try:
            if info.is_async:
                self._run_async(msg, fn, track_busy)
            else:
                self._run_sync(msg, fn, track_busy)
        finally:
            _current.reset(token)

    def _run_async(self, msg: tuple, fn, track_busy: bool) -> None:
        try:
            coro = fn(self.obj, *msg[3], **msg[4])
        except BaseException as e:  # noqa: BLE001
            self._fail(msg, e)
            return
        if track_busy:
            self._busy = True
        # A real Task (not an eager first step on the dispatch path): endpoints may use
        # asyncio.timeout(), TaskGroup and current_task(), which need one.
        task = self.node.loop.create_task(self._invoke(msg, coro, track_busy))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _invoke(self, msg: tuple, coro, track_busy: bool) -> None:
        # The reply is sent from inside the task (not a done callback): one loop pass less.
        try:
            value = await coro
        except asyncio.CancelledError:
            self._fail(msg, asyncio.CancelledError("endpoint was cancelled"))
            raise
        except BaseException as e:  # noqa: BLE001
            self._fail(msg, e)
        else:
            self._ok(msg, value)
        finally:
            if track_busy:
                self._busy = False
                self._drain()

    def _run_sync(self, msg: tuple, fn, track_busy: bool) -> None:
        if track_busy:
            self._busy = True
        cctx = contextvars.copy_context()
        cf = self.executor().submit(cctx.run, fn, self.obj, *msg[3], **msg[4])
        loop = self.node.loop

        def done(f) -> None:
            loop.call_soon_threadsafe(self._sync_done, f, msg, track_busy)
        cf.add_done_callback(done)

    def _sync_done(self, f, msg: tuple, track_busy: bool) -> None:
        if f.cancelled():      # the actor was stopped before this call got to run
            exc = RuntimeError(f"actor {self.instance.mesh_name} was stopped before the call ran")
        else:
            exc = f.exception()
        if exc is not None:
            self._fail(msg, exc)
        else:
            self._ok(msg, f.result())
        if track_busy:
            self._busy = False
            self._drain()

    # -- replies ---------------------------------------------------------------------
    def _ok(self, msg: tuple, value: Any) -> None:
        reply = msg[5]
        if reply is not None:
            self.node.reply(reply, value)

    def _fail(self, msg: tuple, exc: BaseException) -> None:
        err = exc if isinstance(exc, ActorError) and exc.point is not None else ActorError(
            type(exc).__qualname__, str(exc), format_exception(exc), self.instance.rank,
            self.cls.__name__, msg[2])
        reply = msg[5]
        if reply is not None:
            self.node._reply_error(reply, err)
            return
        log.error("endpoint %s.%s failed (broadcast, nobody awaiting): %s",
                  self.cls.__name__, msg[2], err)
        if self.supervisor is not None:
            try:
                self.node.send(self.supervisor.node, (MSG_DELIVER, self.supervisor.port_id,
                                                      ("endpoint_failed", self.instance.actor_id, err)))
            except Exception:  # noqa: BLE001
                log.debug("could not report to supervisor", exc_info=True)

    # -- lifecycle -------------------------------------------------------------------
    async def stop(self) -> None:
        """Run the actor's ``__cleanup__`` (if any) and release its thread."""
        self.stopped = True
        cleanup = getattr(self.obj, "__cleanup__", None)
        if cleanup is not None:
            token = _current.set(Context(self.instance, self.instance.rank))
            try:
                sig = inspect.signature(cleanup)
                res = cleanup(None) if len(sig.parameters) >= 1 else cleanup()
                if inspect.isawaitable(res):
                    await res
            except Exception:  # noqa: BLE001
                log.exception("__cleanup__ of %s failed", self.cls.__name__)
            finally:
                _current.reset(token)
        for t in list(self._tasks):
            t.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
