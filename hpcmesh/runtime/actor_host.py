"""Runs one actor on a worker process: mailbox, ordering, sync/async endpoints, errors.

Messages from one sender arrive in order on one connection and an actor runs
one message at a time, so the mailbox only has to queue while an endpoint is
suspended or running in the actor's thread. Async endpoints run inside the
actor's mailbox task on the process's event loop; sync endpoints run on the
actor's own thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import queue
import threading
from collections import deque
from concurrent.futures import Executor
from concurrent.futures import Future as ConcurrentFuture
from time import time_ns as _time_ns
from typing import Any

# asyncio's own bookkeeping of the running task: lets a call run inline as the mailbox
# task (None on a Python without it: every call then goes through the task)
from .asyncio_internals import enter_task, leave_task
from .context import ActorInstance, Context, current_context_var
from .errors import (USER_EXCEPTION, ActorError, MeshFailure, MeshStoppedError, SupervisionError,
                     actor_failed, call_failed, class_path, describe_actor, failure_class_of)
from ..shapes import Extent, Point
from ..transport import serialization
from .messages import (EVENT_ACTOR_FAULT, BatchShare, ReplyNotSent, call_msg, decode_args,
                       deliver_msg, describe_exception, failure, format_exception)
from .node import Node, PortRef
from .observe import telemetry_recorder as _tel

log = logging.getLogger("hpcmesh.actor")

ENDPOINT_ATTR = "_hpcmesh_endpoint"
#: ``as_endpoint(mesh.method)`` calls a plain method under one of these prefixes (an
#: endpoint's name has no ``:``), so that only such a call reaches a method that is not an
#: endpoint, and its host knows whether the method takes a response port.
AS_ENDPOINT = "as_endpoint:"
AS_ENDPOINT_PORT = "as_endpoint(explicit_response_port):"
#: ``wrap(fn, is_async)``: ``fn(self, port, *args)`` made callable as a response-port
#: endpoint is (with the reply PortRef first). Set by hpcmesh.actor.endpoint, which has Port.
response_port_wrapper: Any = None
#: Called with the ActorInstance of every actor of this process that fails (``fail_actor``),
#: on the event loop: the client runtime of the process ends what that actor spawned.
on_actor_failed: list = []
#: Awaited with the ActorInstance of every actor of this process that is stopped, after its
#: ``__cleanup__``: the client runtime of the process stops what that actor spawned.
on_actor_stopped: list = []
#: A mailbox with a backlog gives the event loop a turn after this many messages.
_YIELD_EVERY = 128


class EndpointInfo:
    """Attached to functions by ``@endpoint``. ``response_port``: the function takes the
    caller's reply port (a PortRef, None for a broadcast) before its arguments and answers
    through it (Monarch's ``explicit_response_port``)."""
    __slots__ = ("name", "concurrent", "is_async", "is_asyncgen", "response_port")

    def __init__(self, name: str, concurrent: bool, is_async: bool, is_asyncgen: bool = False,
                 response_port: bool = False):
        self.name = name
        self.concurrent = concurrent
        self.is_async = is_async
        self.is_asyncgen = is_asyncgen
        self.response_port = response_port


class ActorThread(Executor):
    """The one thread an actor's sync endpoints (and its constructor) run on.

    A daemon thread, unlike ThreadPoolExecutor's, which the interpreter joins at exit: an
    actor living in the controller's process (``this_proc()``) whose endpoint blocks must
    not keep the controller from exiting. (An actor process ends with ``os._exit``.)"""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, fn, /, *args, **kwargs) -> ConcurrentFuture:
        if self._closed:
            raise RuntimeError("the actor's thread has been shut down")
        fut: ConcurrentFuture = ConcurrentFuture()
        self._jobs.put((fut, fn, args, kwargs))
        return fut

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn, args, kwargs = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits
                fut.set_exception(e)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._closed = True
        if cancel_futures:
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
        self._jobs.put(None)


def payload_bytes(payload: Any, buffers: list) -> int:
    """About how many bytes a call took on the wire (telemetry only): a call from a batch
    frame, its share of the frame (``BatchShare``); else its pickled payload and buffers,
    or for an ``(args, kwargs)`` of builtin values that came unpickled in a frame of its
    own, their lengths (strings, bytes) and 8 a number."""
    if type(buffers) is BatchShare:
        return buffers.msg_bytes
    if type(payload) is tuple:
        args, kwargs = payload
        n = 0
        for x in args:
            t = type(x)
            n += (len(x) if t is bytes or t is str else 8 if t is int or t is float else
                  max(serialization.frozen_size(x), 0))
        if kwargs:
            for k, v in kwargs.items():
                n += len(k) + max(serialization.frozen_size(v), 0)
        return n
    n = len(payload)
    for b in buffers:
        n += memoryview(b).nbytes
    return n


def endpoint_names(cls) -> list[str]:
    return sorted(n for n in dir(cls) if getattr(getattr(cls, n, None), ENDPOINT_ATTR, None))


def shown_name(endpoint: str) -> str:
    """The method's own name, as messages show it: without an ``as_endpoint`` prefix."""
    return endpoint.rpartition(":")[2]


def plain_method(cls: type, name: str) -> tuple | None:
    """``(fn, EndpointInfo)`` for an ``as_endpoint`` call ``name`` of a plain method of
    ``cls``; None if ``name`` is not one."""
    prefix, sep, attr = name.rpartition(":")
    prefix += sep
    if prefix not in (AS_ENDPOINT, AS_ENDPOINT_PORT) or attr.startswith("__"):
        return None
    fn = getattr(cls, attr, None)
    if not inspect.isfunction(fn):
        return None
    is_async = inspect.iscoroutinefunction(fn)
    port = prefix == AS_ENDPOINT_PORT
    if port:
        fn = response_port_wrapper(fn, is_async)
    return fn, EndpointInfo(attr, False, is_async, False, response_port=port)


class ActorHost:
    """One actor instance on this process.

    Non-concurrent calls go through one mailbox drained by a single runner task:
    a backlog of pipelined calls costs no task per message, replies written in one
    loop pass leave in one batch, and endpoints still run inside a real Task
    (``asyncio.timeout``, ``TaskGroup`` and ``current_task()`` work). Sync
    endpoints run on the actor's own thread while the runner awaits them.
    """

    def __init__(self, node: Node, instance: ActorInstance, obj: Any, supervisor: PortRef | None):
        self.node = node
        self.instance = instance
        self.obj = obj
        self.cls = type(obj)
        self.supervisor = supervisor
        self._queue: deque = deque()
        self._runner: asyncio.Task | None = None   # the mailbox task (parked when idle)
        self._waker: asyncio.Future | None = None  # what the parked mailbox task awaits
        self._busy = False          # the mailbox task is running a call (others must queue)
        self._handoff: tuple | None = None         # an inline call that suspended
        #: the telemetry rows of the mailbox's queued calls, until they are packed
        self._telemetry_rows: _tel.MailboxRows | None = None
        #: a debugger holds the actor (an async call paused at a breakpoint on the loop's
        #: thread, which keeps turning): calls queue, the mailbox stays parked
        self._held = False
        self._busy_before_hold = False
        self._executor: ActorThread | None = None
        self._tasks: set = set()
        self._methods: dict[str, tuple] = {}
        self._extents: dict[tuple, Extent] = {}
        self._contexts: dict[tuple, Context] = {}
        self.stopped = False
        # stopped without a word to the calls in flight (its process was told to end by a
        # signal): their callers learn why from the process's end, which supervision reads
        self.stopped_quietly = False
        self.fault: SupervisionError | None = None   # the actor failed: see fail_actor()
        # this actor in the telemetry tables (``actors.id``): its mesh and rank there
        self.telemetry_id = f"{instance.actor_id}.{getattr(instance.rank, 'rank', 0)}"

    # -- lookup ----------------------------------------------------------------------
    def _method(self, name: str):
        m = self._methods.get(name)
        if m is None:
            fn = getattr(self.cls, name, None)
            info = getattr(fn, ENDPOINT_ATTR, None)
            if info is not None:
                m = (fn, info)
            elif (m := plain_method(self.cls, name)) is None:
                if name.startswith(AS_ENDPOINT.partition(":")[0]):
                    raise AttributeError(f"{self.cls.__name__} has no method "
                                         f"{shown_name(name)!r} to call with as_endpoint()")
                raise AttributeError(
                    f"{name!r} is not an endpoint of {self.cls.__name__}; endpoints: "
                    f"{', '.join(endpoint_names(self.cls)) or '(none)'}. "
                    f"Decorate the method with @endpoint.")
            self._methods[name] = m
        return m

    async def between_calls(self) -> None:
        """Wait until the sync endpoint running on the actor's thread, if any, has returned
        (it answers first): a failure below this actor that it does not handle fails it
        between its messages, not inside one, as in Monarch. Async endpoints, which share
        the loop, are interleaved with instead: one suspended when it comes fails."""
        if self._executor is not None:
            try:
                await asyncio.wrap_future(self._executor.submit(lambda: None))
            except RuntimeError:        # stopped meanwhile: its thread is shut down
                pass

    def executor(self) -> "ActorThread":
        if self._executor is None:
            self._executor = ActorThread(f"actor-{self.cls.__name__}")
        return self._executor

    def _message_context(self, rank: int, extent_items: tuple | None) -> Context:
        """What ``context()`` returns while handling a message sent to ``rank`` of a mesh
        view with ``extent_items``. Contexts are immutable and a mesh has few: build each
        once."""
        key = (rank, extent_items)
        ctx = self._contexts.get(key)
        if ctx is None:
            if extent_items is None:
                point = self.instance.rank
            else:
                ext = self._extents.get(extent_items)
                if ext is None:
                    ext = self._extents[extent_items] = Extent(dict(extent_items))
                point = Point(rank, ext)
            if len(self._contexts) > 4096:
                self._contexts.clear()
            ctx = self._contexts[key] = Context(self.instance, point)
        return ctx

    # -- dispatch --------------------------------------------------------------------
    def handle_call(self, msg: tuple, origin: str | None, buffers: list) -> None:
        """``msg`` is (CALL, actor_id, endpoint, payload, reply_port, rank, extent_items)."""
        m = self._methods.get(msg[2])
        if m is None:
            try:
                m = self._method(msg[2])
            except AttributeError as e:
                self._fail(msg[2], origin, msg[4], e)
                return
        if self.fault is not None:
            self._refuse(msg[2], origin, msg[4])
            return
        if self.stopped:
            self._fail(msg[2], origin, msg[4],
                       MeshStoppedError(f"actor {self.instance.mesh_name} has been stopped",
                                        self.instance.mesh_name))
            return
        fn, info = m
        if info.response_port:
            try:
                msg, buffers = self._with_response_port(msg, origin, buffers), []
            except BaseException as e:  # noqa: BLE001 - undecodable arguments
                self._fail(msg[2], origin, msg[4], e)
                return
        if info.concurrent:
            task = self.node.loop.create_task(self._execute(msg, origin, buffers, fn, info))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if not self._busy and info.is_async and not self.node.in_batch and enter_task:
            self._run_inline(msg, origin, buffers, fn)
            return
        self._queue.append((msg, origin, buffers, m))
        if not self._busy:
            self._busy = True
            self._wake_mailbox()

    def _with_response_port(self, msg: tuple, origin: str | None, buffers: list) -> tuple:
        """The call with the caller's reply port (a PortRef) put before its arguments."""
        _, actor_id, endpoint, payload, reply, rank, extent_items = msg
        args, kwargs = decode_args(payload, buffers)
        port = None
        if reply is not None and origin is not None:
            port = PortRef(self.node.ref_of(origin), reply)
        return call_msg(actor_id, endpoint, ((port, *args), kwargs), reply, rank, extent_items)

    def _mailbox_task(self) -> asyncio.Task:
        if self._runner is None:
            self._runner = self.node.loop.create_task(self._run_mailbox())
        return self._runner

    def _wake_mailbox(self) -> None:
        waker = self._waker
        if waker is None:
            self._mailbox_task()    # starts busy: drains the queue before it parks
        elif not waker.done():
            waker.set_result(None)

    # -- held by a debugger ------------------------------------------------------------
    def hold(self) -> bool:
        """One of this actor's async calls is paused on the loop's thread, which keeps
        turning (``breakpoint()``: see debugger.py): until :meth:`release`, the actor
        counts as busy, so later calls queue instead of running inline inside the pause
        (where the paused call could lose its place), and its mailbox stays parked even if
        woken. False if it is held already (a pause nested in another: the outer one
        releases it)."""
        if self._held:
            return False
        self._busy_before_hold = self._busy
        self._busy = self._held = True
        return True

    def release(self) -> None:
        """The paused call goes on: the actor as it was before :meth:`hold`, and what
        queued meanwhile handed to its mailbox, which takes it when the loop next turns
        outside a pause."""
        self._held = False
        self._busy = self._busy_before_hold
        if self._queue:     # (woken inside a later pause, it parked again: woken again here)
            self._busy = True
            self._wake_mailbox()

    def _run_inline(self, msg: tuple, origin: str | None, buffers: list, fn) -> None:
        """The actor is idle: start the endpoint right here, inside the mailbox task's
        identity (``current_task()``, ``asyncio.timeout`` and ``TaskGroup`` see that
        task) and in a context of its own. Most endpoints finish without suspending, so
        the reply leaves with no task switch and no extra turn of the loop; one that
        suspends is handed to the mailbox task, which finishes it."""
        loop = self.node.loop
        task = self._mailbox_task()
        try:
            enter_task(loop, task)
        except RuntimeError:        # called from inside another task: queue it instead
            self._queue.append((msg, origin, buffers, (fn, self._methods[msg[2]][1])))
            self._busy = True
            self._wake_mailbox()
            return
        try:
            contextvars.copy_context().run(self._start, msg, origin, buffers, fn)
        finally:
            leave_task(loop, task)

    def _start(self, msg: tuple, origin: str | None, buffers: list, fn) -> None:
        _, _, endpoint, payload, reply, rank, extent_items = msg
        ctx = self._contexts.get((rank, extent_items))
        current_context_var.set(ctx if ctx is not None else self._message_context(rank, extent_items))
        tel = _tel.RECORDER
        seen = (_time_ns(), payload_bytes(payload, buffers)) if tel is not None else None
        try:
            args, kwargs = decode_args(payload, buffers)
            coro = fn(self.obj, *args, **kwargs)
            try:
                waiting_on = coro.send(None)
            except StopIteration as done:
                value = done.value
            else:       # recorded when it finishes (_finish)
                self._handoff = (contextvars.copy_context(), coro, waiting_on, endpoint, origin,
                                 reply, seen)
                self._busy = True
                self._wake_mailbox()
                return
        except BaseException as e:  # noqa: BLE001 - SystemExit too: the actor's, not the process's
            self._ended(endpoint, origin, reply, seen, e, self._raised)
        else:
            self._ended(endpoint, origin, reply, seen, value)

    async def _run_mailbox(self) -> None:
        """The actor's mailbox task: parked while the actor is idle; finishes an endpoint
        that suspended while run inline, then drains the calls that queued meanwhile, in
        order. Async endpoints run right here (no task or coroutine per message: this is
        the pipelined hot path); sync ones go through ``_execute`` to the actor's thread."""
        loop = self.node.loop
        try:
            while not self.stopped:
                cancelled = False
                if not self._busy or self._held:
                    self._waker = loop.create_future()
                    try:
                        await self._waker
                    except asyncio.CancelledError:
                        if self.stopped:
                            return
                        # Meant for the endpoint handed over below (an asyncio.timeout
                        # that fired before this task took it over): pass it on.
                        cancelled = True
                    self._waker = None
                    if self._held:          # (debugger.py: a pause; woken when it ends)
                        continue
                handoff, self._handoff = self._handoff, None
                if handoff is not None:
                    await self._finish(handoff, cancelled)
                await self._drain()
                self._busy = False
        finally:
            self._runner = None
            self._waker = None

    async def _finish(self, handoff: tuple, cancelled: bool) -> None:
        ctx, coro, waiting_on, endpoint, origin, reply, seen = handoff
        try:
            value = await _Resume(ctx, coro, waiting_on, cancelled)
        except BaseException as e:  # noqa: BLE001 - _failed re-raises what it must
            self._ended(endpoint, origin, reply, seen, e, self._failed)
        else:
            self._ended(endpoint, origin, reply, seen, value)

    async def _drain(self) -> None:
        queue = self._queue
        obj = self.obj
        contexts = self._contexts
        reply_to = self.node.reply_to
        tel = _tel.RECORDER
        # the run of calls this call goes on with (telemetry: MailboxRows); none yet
        r_buffers = r_endpoint = r_origin = None
        rows = self._telemetry_rows
        if rows is not None and rows.recorder is not tel:   # switched off, or replaced:
            self._telemetry_rows = None                     # its rows to their recorder
            rows.recorder.forget(rows)
        if tel is not None:     # the telemetry rows' parts, looked up once for the batch
            rows = self._telemetry_rows
            if rows is None:
                rows = self._telemetry_rows = tel.mailbox()
            ends_append, ends = rows.ends.append, rows.ends
            tid = self.telemetry_id
        n = 0
        while queue:
            n += 1
            if n % _YIELD_EVERY == 0:
                # Let the loop send the replies so far and read more calls: a long
                # backlog must not hold every reply back until it is all done.
                if tel is not None and len(ends) >= _tel.MAILBOX_FLUSH_ROWS:
                    rows.flush()    # (into the bounded log: a long backlog stays bounded)
                await asyncio.sleep(0)
                r_buffers = None
            msg, origin, buffers, (fn, info) = queue.popleft()
            if self.fault is not None:
                self._refuse(msg[2], origin, msg[4])
                r_buffers = None
                continue
            if self.stopped:
                self._fail(msg[2], origin, msg[4], MeshStoppedError(
                    f"actor {self.instance.mesh_name} has been stopped", self.instance.mesh_name))
                r_buffers = None
                continue
            if not info.is_async:
                await self._execute(msg, origin, buffers, fn, info)
                r_buffers = None
                continue
            _, _, endpoint, payload, reply, rank, extent_items = msg
            if tel is not None and (buffers is not r_buffers or endpoint is not r_endpoint
                                    or origin is not r_origin):
                # A new run. The calls of one batch frame share their BatchShare and their
                # endpoint and origin strings (one object each): most calls skip this.
                r_endpoint, r_origin = endpoint, origin
                if type(buffers) is BatchShare:
                    r_buffers, nbytes = buffers, buffers.msg_bytes
                else:
                    r_buffers, nbytes = None, payload_bytes(payload, buffers)
                rows.run(_time_ns(), nbytes, (tid, endpoint, origin))
            ctx = contexts.get((rank, extent_items))
            token = current_context_var.set(ctx if ctx is not None else
                                 self._message_context(rank, extent_items))
            ok = False
            try:
                # twin of decode_args(): written out, the pipelined hot path
                # (tests/test_twins.py holds them equal)
                args, kwargs = (payload if type(payload) is tuple
                                else serialization.loads(payload, buffers))
                value = await fn(obj, *args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - _failed re-raises what it must
                self._failed(e, endpoint, origin, reply)
            else:
                ok = True
                if reply is not None:
                    try:
                        reply_to(origin, reply, value)
                    except ReplyNotSent as e:   # (inline: the pipelined hot path)
                        self._unsent(endpoint, origin, reply, e)
            finally:
                current_context_var.reset(token)
                if tel is not None:     # the telemetry row: its end (MailboxRows)
                    if not ok:
                        rows.fail_next()
                    ends_append(_time_ns())
        if tel is not None and len(ends) >= _tel.MAILBOX_FLUSH_ROWS:
            rows.flush()    # (bounded however the backlogs come: also when nobody drains)

    async def _execute(self, msg: tuple, origin: str | None, buffers: list, fn,
                       info: EndpointInfo) -> None:
        """One call as its own coroutine: concurrent endpoints and sync endpoints."""
        _, _, endpoint, payload, reply, rank, extent_items = msg
        token = current_context_var.set(self._message_context(rank, extent_items))
        tel = _tel.RECORDER
        seen = (_time_ns(), payload_bytes(payload, buffers)) if tel is not None else None
        try:
            args, kwargs = decode_args(payload, buffers)
            if info.is_async:
                value = await fn(self.obj, *args, **kwargs)
            else:
                cctx = contextvars.copy_context()
                value = await asyncio.wrap_future(
                    self.executor().submit(cctx.run, fn, self.obj, *args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - _failed re-raises what it must
            self._ended(endpoint, origin, reply, seen, e, self._failed)
        else:
            self._ended(endpoint, origin, reply, seen, value)
        finally:
            current_context_var.reset(token)

    def _ended(self, endpoint: str, origin: str | None, reply: int | None,
               seen: tuple | None, outcome: Any, failed=None) -> None:
        """An endpoint ended (the one home of its ending, but for the pipelined hot path in
        ``_drain``): it returned ``outcome``, which goes to the caller, or, given ``failed``
        (``_raised`` or ``_failed``), it raised ``outcome``, which ``failed`` handles. Either
        way the call is noted in the telemetry (``seen``: when it started, its size)."""
        try:
            if failed is not None:
                failed(outcome, endpoint, origin, reply)
            elif reply is not None:
                self._reply(endpoint, origin, reply, outcome)
        finally:
            if seen is not None:
                self._note(seen, endpoint, origin, failed is None)

    def _note(self, seen: tuple, endpoint: str, origin: str | None, ok: bool) -> None:
        """One handled call into the telemetry's ``messages`` table (``seen``: when it
        started, how many bytes its arguments were)."""
        rec = _tel.RECORDER
        if rec is not None:
            start_ns, nbytes = seen
            rec.received(start_ns, self.telemetry_id, endpoint, origin, _time_ns(), ok, nbytes)

    def _failed(self, exc: BaseException, endpoint: str, origin: str | None,
                reply: int | None) -> None:
        """An endpoint raised (or was cancelled): tell the caller; a cancellation that
        is not this actor stopping or failing goes on up to the task."""
        if isinstance(exc, asyncio.CancelledError):
            if self.fault is not None:      # cancelled by fail_actor()
                self._refuse(endpoint, origin, reply)
                return
            if self.stopped_quietly:
                return
            self._fail(endpoint, origin, reply, RuntimeError(
                f"actor {self.instance.mesh_name} was stopped before {shown_name(endpoint)} "
                f"finished"))
            if not self.stopped:
                raise exc
            return
        self._raised(exc, endpoint, origin, reply)

    def _raised(self, exc: BaseException, endpoint: str, origin: str | None,
                reply: int | None) -> None:
        """An endpoint raised. Called with a reply port, an Exception fails that call (an
        ActorError) and the actor goes on. Otherwise nobody could be told, so the actor
        fails, as in Monarch: a broadcast, an endpoint that answers through its response
        port, a BaseException (SystemExit, KeyboardInterrupt)."""
        info = self._methods[endpoint][1]      # looked up before the endpoint ran
        if reply is not None and isinstance(exc, Exception) and not info.response_port:
            self._fail(endpoint, origin, reply, exc)
            return
        how = ("it was called with broadcast(), so no caller could get the error; call() "
               "or call_one() returns it instead" if reply is None else
               "it answers through its response port, so the error had no caller to go to; "
               "catch it and send it with port.exception(e)" if info.response_port else
               f"{type(exc).__name__} is a BaseException, not an Exception")
        self.fail_actor(self.raised_in(exc, endpoint, how), failure_class=failure_class_of(exc))
        self._refuse(endpoint, origin, reply)

    def raised_in(self, exc: BaseException, endpoint: str, how: str = "") -> str:
        """Why this actor failed: ``exc`` escaped ``endpoint`` (``how``: why that is fatal)."""
        return (f"{type(exc).__qualname__}: {describe_exception(exc, with_type=False)} raised "
                f"in {self.cls.__name__}.{shown_name(endpoint)}{f' ({how})' if how else ''}\n\n"
                f"Remote traceback:\n{format_exception(exc).rstrip()}")

    def abort(self, reason: str | None) -> None:
        """``context().actor_instance.abort(reason)``, from this actor's endpoint (or
        constructor): the actor fails, as in Monarch, once the aborting code gives the
        event loop a turn. So an async endpoint that aborts still answers if it returns
        without waiting, and fails with the SupervisionError if it awaits; a sync one (on
        the actor's thread) answers when it returns, as the mailbox's call is spared (a
        concurrent sync call that aborts is failed)."""
        why = f"actor explicitly aborted due to: {reason or '(no reason provided)'}"
        loop = self.node.loop
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            loop.call_soon(self.fail_actor, why)
        else:
            loop.call_soon_threadsafe(self.fail_actor, why, True)

    def fail_actor(self, reason: str, spare_mailbox: bool = False,
                   failure_class: str = USER_EXCEPTION) -> None:
        """This actor has failed (in Monarch: it is dead): calls waiting for it, queued or
        running (but the one running in the current task, or the mailbox's with
        ``spare_mailbox``), and every later call fail with a SupervisionError naming it and
        ``reason``; its owner's ``__supervise__`` gets a MeshFailure. What it spawned is
        stopped (``on_actor_failed``: Monarch's "and all its descendants have failed"); its
        process and the other actors there go on. ``failure_class``: why, as a class
        (SPEC §12): its own code raised or aborted, unless the exception says otherwise, or
        the class of a failure below it that it did not handle."""
        if self.fault is not None:
            return
        inst = self.instance
        self.fault = actor_failed(describe_actor(class_path(self.cls), inst.mesh_name, inst.rank),
                                  reason, inst.mesh_name, inst.rank, failure_class)
        if (rec := _tel.RECORDER) is not None:
            rec.status(self.telemetry_id, "failed", reason, failure_class)
        log.info("%s", self.fault)       # its owner hears of it, and reports it if unhandled
        for end_descendants in on_actor_failed:
            try:
                end_descendants(inst)
            except Exception:  # noqa: BLE001 - the failure itself must still be reported
                log.exception("could not stop what %s spawned", inst.mesh_name)
        while self._queue:
            msg, origin, _, _ = self._queue.popleft()
            self._refuse(msg[2], origin, msg[4])
        here = asyncio.current_task(self.node.loop)   # (the call that failed it, if any)
        running = [t for t in self._tasks if t is not here]
        handoff, self._handoff = self._handoff, None
        if handoff is not None and not spare_mailbox:
            # a call that suspended while run inline, not yet taken over by the mailbox
            # task (which may not have started: it is not cancelled): it ends here
            ctx, coro, _, endpoint, origin, reply, _ = handoff
            try:
                ctx.run(coro.close)
            except BaseException:  # noqa: BLE001 - it would not end: dropped all the same
                log.warning("%s.%s did not end when its actor failed", self.cls.__name__,
                            shown_name(endpoint))
            self._refuse(endpoint, origin, reply)
        elif handoff is not None:
            self._handoff = handoff
        elif (self._busy and self._runner is not None and self._runner is not here
                and not spare_mailbox):
            running.append(self._runner)    # a call in progress: its caller is told now
        for t in running:
            t.cancel()
        if self.supervisor is None:
            return
        try:
            self.node.send(self.supervisor.node, deliver_msg(
                self.supervisor.port_id,
                (EVENT_ACTOR_FAULT, inst.actor_id, MeshFailure(inst.mesh_name, self.fault,
                                                               inst.rank))))
        except Exception:  # noqa: BLE001 - its owner is gone too
            log.warning("could not report to the owner of %s: %s", inst.mesh_name, self.fault)

    def _refuse(self, endpoint: str, origin: str | None, reply: int | None) -> None:
        """A call to this failed actor fails, naming it."""
        if reply is not None:
            self.node.reply_to(origin, reply, failure(call_failed(shown_name(endpoint),
                                                                  self.fault)))

    # -- replies ---------------------------------------------------------------------
    def _reply(self, endpoint: str, origin: str | None, reply: int, value: Any) -> None:
        """Send an endpoint's result; one that cannot be sent fails that call instead."""
        try:
            self.node.reply_to(origin, reply, value)
        except ReplyNotSent as e:
            self._unsent(endpoint, origin, reply, e)

    def _unsent(self, endpoint: str, origin: str | None, reply: int, exc: ReplyNotSent
                ) -> None:
        """The endpoint returned, but its result cannot travel: the caller gets the
        serialization error (not an ActorError: the endpoint itself did not raise), naming
        the endpoint and the actor."""
        where = (f"{self.cls.__name__}.{shown_name(endpoint)} of {self.instance.mesh_name}"
                 f"[{self.instance.rank.rank}]")
        self.node.reply_to(origin, reply, failure(ReplyNotSent(f"{where}: {exc}")))

    def _fail(self, endpoint: str, origin: str | None, reply: int | None,
              exc: BaseException) -> None:
        err = exc if isinstance(exc, ActorError) and exc.point is not None else ActorError(
            type(exc).__qualname__, describe_exception(exc, with_type=False),
            format_exception(exc), self.instance.rank, self.cls.__name__, shown_name(endpoint),
            failure_class_of(exc), self.instance.mesh_name)
        if reply is not None:
            self.node.reply_to(origin, reply, failure(err))
            return
        log.error("a broadcast to %s.%s could not run: %s", self.cls.__name__, endpoint, err)

    # -- lifecycle -------------------------------------------------------------------
    async def stop(self, quietly: bool = False) -> None:
        """Cancel the actor's calls in progress, then run its ``__cleanup__`` (if any), as
        Monarch orders them (what a cancelled call's ``finally`` does comes before the
        cleanup), and release its thread. ``quietly``: the calls in flight get no answer
        (see ``stopped_quietly``)."""
        try:
            self.stopped = True
            self.stopped_quietly = quietly
            if (rec := _tel.RECORDER) is not None and self.fault is None:
                rec.status(self.telemetry_id, "stopped", "stopped by its owner")
            tasks = list(self._tasks) + ([self._runner] if self._runner is not None else [])
            for t in tasks:
                t.cancel()
            if tasks:   # let them see the cancellation (a pending task must not be dropped)
                await asyncio.wait(tasks, timeout=1.0)
            cleanup = getattr(self.obj, "__cleanup__", None)
            if cleanup is not None:
                token = current_context_var.set(Context(self.instance, self.instance.rank))
                try:
                    sig = inspect.signature(cleanup)
                    res = cleanup(None) if len(sig.parameters) >= 1 else cleanup()
                    if inspect.isawaitable(res):
                        await res
                except Exception:  # noqa: BLE001
                    log.exception("__cleanup__ of %s failed", self.cls.__name__)
                finally:
                    current_context_var.reset(token)
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
            for stop_descendants in list(on_actor_stopped):
                try:
                    await stop_descendants(self.instance)
                except Exception:  # noqa: BLE001 - this actor is stopped all the same
                    log.exception("could not stop what %s spawned", self.instance.mesh_name)
        finally:    # (however the cleanup ends): its calls' rows to the log, once
            rows, self._telemetry_rows = self._telemetry_rows, None
            if rows is not None:
                rows.recorder.forget(rows)


class _Resume:
    """Awaiting this continues a coroutine that was started by hand (``coro.send``) and
    suspended on ``waiting_on``: what ``await coro`` would have done from the start, each
    step in the coroutine's own context ``ctx``. ``cancelled``: a cancellation arrived
    before the awaiting task took over."""
    __slots__ = ("ctx", "coro", "waiting_on", "cancelled")

    def __init__(self, ctx: contextvars.Context, coro, waiting_on, cancelled: bool = False):
        self.ctx = ctx
        self.coro = coro
        self.waiting_on = waiting_on
        self.cancelled = cancelled

    def __await__(self):
        run, coro, waiting_on = self.ctx.run, self.coro, self.waiting_on
        thrown: BaseException | None = asyncio.CancelledError() if self.cancelled else None
        while True:
            try:
                if thrown is not None:
                    waiting_on = run(coro.throw, thrown)
                    thrown = None
            except StopIteration as done:
                return done.value
            try:
                sent = yield waiting_on
            except BaseException as e:  # noqa: BLE001 - thrown into the task: pass it on
                thrown = e
                continue
            try:
                waiting_on = run(coro.send, sent)
            except StopIteration as done:
                return done.value
