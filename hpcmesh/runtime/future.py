"""A Future usable both with ``await`` (any event loop) and ``.get()`` (any thread).

Results are set on the runtime's event-loop thread. A synchronous waiter
blocks on a pre-acquired lock that the setter releases (cheaper than a
Condition or a thread handoff); an awaiting coroutine on another loop is woken
with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")
U = TypeVar("U")
_PENDING, _DONE = 0, 1
_loop_thread_ids: dict[int, int] = {}   # id(loop) -> thread id running it (set by the runtime)
_runtime_threads: set[int] = set()      # threads running an hpcmesh event loop
_cb_lock = threading.Lock()               # guards callback lists against setter/adder races


def register_loop_thread(loop: asyncio.AbstractEventLoop) -> None:
    """Call on the thread that runs an hpcmesh node's loop (a blocking get() there deadlocks)."""
    tid = threading.get_ident()
    _loop_thread_ids[id(loop)] = tid
    _runtime_threads.add(tid)


def unregister_loop_thread(loop: asyncio.AbstractEventLoop) -> None:
    tid = _loop_thread_ids.pop(id(loop), None)
    _runtime_threads.discard(tid)


_wait_hook: Callable[[], None] | None = None   # see set_wait_hook


def _lock_timeout(timeout: float | None) -> float:
    """``Future.get``'s timeout as ``Lock.acquire`` takes it: None and ``inf`` wait for
    ever (-1; acquire itself refuses ``inf`` with an OverflowError), 0 does not wait; a
    negative or non-number timeout is a mistake (acquire would read -1 as "for ever")."""
    if timeout is None:
        return -1
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout != timeout:
        raise TypeError(f"Future.get(timeout={timeout!r}): timeout takes seconds (a number "
                        f">= 0, math.inf) or None to wait for ever")
    if timeout < 0:
        raise ValueError(f"Future.get(timeout={timeout!r}): timeout takes seconds >= 0, or "
                         f"None to wait for ever")
    return -1 if timeout == float("inf") or timeout > threading.TIMEOUT_MAX else timeout


def set_wait_hook(hook: Callable[[], None] | None) -> None:
    """``hook()`` is called by a thread about to block on a Future that another thread
    will settle (the runtime uses it to place its thread: see placement.py)."""
    global _wait_hook
    _wait_hook = hook


if hasattr(os, "register_at_fork"):      # a forked child has no runtime thread to place
    os.register_at_fork(after_in_child=lambda: set_wait_hook(None))


def on_runtime_thread() -> bool:
    """True on a thread running an hpcmesh event loop (where blocking would deadlock)."""
    return threading.get_ident() in _runtime_threads


class Future(Generic[T]):
    """``Future[T]``: a T later. ``Generic`` costs nothing per Future (it adds no
    ``__init__`` or ``__new__``); it lets programs write ``Future[int]`` in code."""
    __slots__ = ("_state", "_value", "_exc", "_callbacks", "__weakref__")

    def __init__(self):
        self._state = _PENDING
        self._value: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable] | None = None

    # -- producer side ----------------------------------------------------------
    # The state is written before the callbacks are read, and a callback is added before
    # the state is read again (``add_done_callback``): whichever side comes second fires,
    # and ``_fire`` takes the list under the lock, so each callback runs exactly once
    # without a lock on the (common) path of a result nobody waits for yet.
    def set_result(self, value: Any) -> None:
        if self._state:
            return
        self._value = value
        self._state = _DONE
        if self._callbacks is not None:
            self._fire()

    def set_exception(self, exc: BaseException) -> None:
        # Settled as set_result settles it (None for a value): the order above in one place.
        if not self._state:
            self._exc = exc
            self.set_result(None)

    def _fire(self) -> None:
        with _cb_lock:
            cbs, self._callbacks = self._callbacks, None
        if cbs:
            for cb in cbs:
                cb(self)

    def add_done_callback(self, cb: Callable[["Future"], None]) -> None:
        with _cb_lock:
            if not self._state:
                if self._callbacks is None:
                    self._callbacks = [cb]
                else:
                    self._callbacks.append(cb)
                added = True
            else:
                added = False
        if not added:
            cb(self)
        elif self._state:       # settled meanwhile, maybe without seeing our callback
            self._fire()

    # -- consumer side ----------------------------------------------------------
    def done(self) -> bool:
        return bool(self._state)

    def waited_on(self) -> bool:
        """True if a callback is registered and not run yet: an ``await``, a ``get()``, or
        a chained Future waits for this one."""
        return self._callbacks is not None

    def exception(self) -> BaseException | None:
        return self._exc

    def value(self) -> T:
        """The result of a Future that has settled without an error, read without waiting
        (in a done-callback, say). A pending or failed Future is a mistake here."""
        if not self._state or self._exc is not None:
            raise RuntimeError("Future.value() needs a Future that has a result: "
                               + ("it failed; check exception() first" if self._state
                                  else "it is still pending; use get() to wait for it"))
        return self._value

    def result(self, timeout: float | None = None) -> T:
        return self.get(timeout)

    def get(self, timeout: float | None = None) -> T:
        """Block until the value is there; raise the remote error if it failed."""
        if not self._state:
            if threading.get_ident() in _runtime_threads:
                raise RuntimeError(
                    "Future.get() called on the hpcmesh event-loop thread would deadlock; "
                    "use `await future` inside async endpoints (or make the endpoint a "
                    "plain `def`: sync endpoints run on their own thread and may block)")
            if _wait_hook is not None:
                _wait_hook()
            wait = _lock_timeout(timeout)
            lock = threading.Lock()
            lock.acquire()
            self.add_done_callback(lambda _f: lock.release())
            if not lock.acquire(timeout=wait):
                raise TimeoutError(f"no result within {timeout} s")
        if self._exc is not None:
            raise self._exc
        return self._value

    def __await__(self):
        if not self._state:
            loop = asyncio.get_running_loop()
            if _wait_hook is not None and _loop_thread_ids.get(id(loop)) is None:
                _wait_hook()
            yield from self._asyncio_future(loop).__await__()
        if self._exc is not None:
            raise self._exc
        return self._value

    def as_asyncio(self) -> "asyncio.Future[T]":
        """An ``asyncio.Future`` of the running loop that settles as this one does
        (Monarch's ``Future.as_asyncio``); for ``asyncio.wait``, ``shield`` and the like,
        which take asyncio futures. Raises RuntimeError off a running loop."""
        return self._asyncio_future(asyncio.get_running_loop())

    def _asyncio_future(self, loop: asyncio.AbstractEventLoop) -> "asyncio.Future[T]":
        """An asyncio Future of ``loop`` settled from this one (directly when this one
        settles on the loop's own thread)."""
        afut = loop.create_future()
        owner_tid = _loop_thread_ids.get(id(loop))

        def wake(f: "Future") -> None:
            if threading.get_ident() == owner_tid:
                _transfer(f, afut)
            else:
                loop.call_soon_threadsafe(_transfer, f, afut)
        self.add_done_callback(wake)
        return afut

    def then(self, fn: Callable[[T], U]) -> "Future[U]":
        """A Future of fn(value), failing if this one fails."""
        out = Future()

        def chain(f: Future) -> None:
            if f._exc is not None:
                out.set_exception(f._exc)
                return
            try:
                out.set_result(fn(f._value))
            except BaseException as e:  # noqa: BLE001
                out.set_exception(e)
        self.add_done_callback(chain)
        return out

    def __repr__(self) -> str:
        state = "pending" if not self._state else ("error" if self._exc else "done")
        return f"<hpcmesh.Future {state}>"


def _transfer(src: Future, dst: asyncio.Future) -> None:
    if dst.done():
        return
    if src._exc is not None:
        dst.set_exception(src._exc)
    else:
        dst.set_result(src._value)


def forward(src: "Future", dst: "Future") -> None:
    """When ``src`` settles, settle ``dst`` the same way."""
    src.add_done_callback(lambda f: dst.set_exception(f._exc) if f._exc is not None
                          else dst.set_result(f._value))


def completed(value: Any) -> Future:
    f = Future()
    f.set_result(value)
    return f


def failed(exc: BaseException) -> Future:
    f = Future()
    f.set_exception(exc)
    return f


def gather(futures: list[Future], finish: Callable[[list], Any] | None = None,
           on_first: Callable[[Future], None] | None = None) -> Future:
    """A Future of the list of results (or of ``finish(results)``); fails with the first
    failure (``FanIn``, each of ``futures`` followed).

    ``on_first(out)`` runs once, on the thread that sets it, when the first of several
    results arrives (the runtime polls for the rest then: see ``Node.poll_for_rest``)."""
    fan = FanIn(len(futures), finish, on_first)
    for i, f in enumerate(futures):
        fan.follow(i, f)
    return fan.out


class FanIn:
    """``n`` results into one Future (``out``) of their list, or of ``finish(list)``;
    it fails with the first failure. A result comes from a Future it follows, or is put
    straight into its slot (``put``/``fail_slot``, or a reply port resolving ``slot(i)``:
    a call() through the host agents makes no Future per member). Each slot's state is
    kept here (``done``: a byte a slot); ``FanInSlot`` objects are views of it, made only
    where something asks for them (the straggler watch, on a call that is late). Results
    may arrive on several threads at once: the count of those still missing is taken with
    ``next()`` on a shared counter, which is atomic."""
    __slots__ = ("out", "results", "n", "arrived", "finish", "on_first", "done", "excs",
                 "callbacks")

    def __init__(self, n: int, finish: Callable[[list], Any] | None = None,
                 on_first: Callable[[Future], None] | None = None):
        self.out = Future()
        self.n = n
        self.results: list = [None] * n
        self.arrived = itertools.count(1)
        self.finish = finish
        self.on_first = on_first
        self.done = bytearray(n)            # per slot: 0 waiting, 1 a result, 2 failed
        self.excs: dict[int, BaseException] = {}            # the failed slots' errors
        self.callbacks: dict[int, list] | None = None       # a slot's watchers
        if n == 0:
            self._settle()

    def put(self, i: int, value: Any) -> None:
        """Slot ``i``'s result (a second one for the same slot is dropped)."""
        if self.done[i]:
            return
        self.done[i] = 1
        if self.callbacks is not None:
            self._fire(i)
        out = self.out
        if out._state:
            return
        self.results[i] = value
        k = next(self.arrived)
        if k == 1 and self.on_first is not None and self.n > 1:
            self.on_first(out)
        if k == self.n:
            self._settle()

    def put_range(self, first: int, k: int, value: Any = None, values: list | None = None
                  ) -> None:
        """Slots ``first`` .. ``first + k - 1`` get ``values`` (one each) or all ``value``:
        a host share's answers (``host_share.HostShare``) in a few C-level steps instead of
        a ``put`` per slot. Where any of them has a result already or a watcher, one by
        one."""
        if k <= 0:
            return
        done = self.done
        end = first + k
        if self.callbacks is not None or done[first:end] != bytes(k):
            for j in range(k):
                self.put(first + j, value if values is None else values[j])
            return
        done[first:end] = b"\x01" * k
        out = self.out
        if out._state:
            return
        self.results[first:end] = [value] * k if values is None else values
        # each count taken is atomic; ours are not contiguous where another thread puts
        # too, but the last one (the n-th) is the largest of those that took it
        arrived = self.arrived
        one = next(arrived)
        last = max(itertools.islice(arrived, k - 1)) if k > 1 else one
        if one == 1 and self.on_first is not None and self.n > 1:
            self.on_first(out)
        if last == self.n:
            self._settle()

    def fail_slot(self, i: int, exc: BaseException) -> None:
        """Slot ``i`` failed with ``exc``: so does ``out`` (unless settled already)."""
        if self.done[i]:
            return
        self.done[i] = 2
        self.excs[i] = exc
        if self.callbacks is not None:
            self._fire(i)
        self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        self.out.set_exception(exc)

    def _settle(self) -> None:
        if self.finish is None:
            self.out.set_result(self.results)
            return
        try:
            self.out.set_result(self.finish(self.results))
        except BaseException as e:  # noqa: BLE001
            self.out.set_exception(e)

    def follow(self, i: int, f: Future) -> None:
        """Slot ``i`` gets ``f``'s result."""
        def done(f: Future) -> None:
            if f._exc is not None:
                self.fail_slot(i, f._exc)
            else:
                self.put(i, f._value)
        f.add_done_callback(done)

    def slot(self, i: int) -> "FanInSlot":
        """Slot ``i`` as a Future's two setters and watchers' reads (a view)."""
        return FanInSlot(self, i)

    def all_slots(self) -> "SlotViews":
        """Every slot, in order, as views made when read (``len``, index, iterate)."""
        return SlotViews(self)

    def watch_slot(self, i: int, cb: Callable[["FanInSlot"], None]) -> None:
        """``cb(slot i)`` once slot ``i`` is settled (now, if it is)."""
        with _cb_lock:
            added = not self.done[i]
            if added:
                if self.callbacks is None:
                    self.callbacks = {}
                self.callbacks.setdefault(i, []).append(cb)
        if not added:
            cb(FanInSlot(self, i))
        elif self.done[i]:      # settled meanwhile, maybe without seeing our callback
            self._fire(i)

    def _fire(self, i: int) -> None:
        with _cb_lock:
            cbs = self.callbacks.pop(i, None) if self.callbacks else None
        for cb in cbs or ():
            cb(FanInSlot(self, i))


class SlotViews:
    """A FanIn's slots as a read-only sequence of ``FanInSlot`` views."""
    __slots__ = ("fan",)

    def __init__(self, fan: FanIn):
        self.fan = fan

    def __len__(self) -> int:
        return self.fan.n

    def __getitem__(self, i: int) -> "FanInSlot":
        if not -self.fan.n <= i < self.fan.n:
            raise IndexError(i)
        return FanInSlot(self.fan, i % self.fan.n)

    def __iter__(self):
        fan = self.fan
        return (FanInSlot(fan, i) for i in range(fan.n))


class FanInSlot:
    """Slot ``i`` of a ``FanIn`` (a view: its state is the FanIn's): what a reply port
    resolves (a Future's two setters), and what a watcher of the members reads (``done``,
    ``exception``, ``add_done_callback``: the straggler watch), without a Future of its
    own."""
    __slots__ = ("fan", "i")

    def __init__(self, fan: FanIn, i: int):
        self.fan = fan
        self.i = i

    def set_result(self, value: Any) -> None:
        self.fan.put(self.i, value)

    def set_exception(self, exc: BaseException) -> None:
        self.fan.fail_slot(self.i, exc)

    def done(self) -> bool:
        return self.fan.done[self.i] != 0

    def exception(self) -> BaseException | None:
        return self.fan.excs.get(self.i)

    def add_done_callback(self, cb: Callable[["FanInSlot"], None]) -> None:
        """As ``Future.add_done_callback``."""
        self.fan.watch_slot(self.i, cb)

