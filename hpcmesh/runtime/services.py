"""A node's RPC services: the named functions its peers call (``MSG_RPC``).

The actor services (spawn, stop actors), the host agent's (spawn processes, stop,
reserve a port), log levels, introspection: each process registers what it offers by
name, and ``Node.rpc`` on another calls it. A service may be a plain function or a
coroutine function (run as a task on the node's loop); either way its value, or its
exception, goes back to the caller's reply port.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable


class Services(dict):
    """name -> function: what this node serves. A dict, so a module adds its own with
    ``node.services.update({...})``."""

    def run(self, service: str, args: tuple, loop: asyncio.AbstractEventLoop, *,
            answer: Callable[[Any], None], fail: Callable[[BaseException], None],
            here: str) -> None:
        """Run ``service(*args)``; ``answer(value)`` or ``fail(exception)`` once, when done.
        An unknown name fails naming the ones this node (``here``) has."""
        fn = self.get(service)
        if fn is None:
            fail(LookupError(f"node {here} has no service {service!r}; known: "
                             f"{', '.join(sorted(self))}"))
            return
        try:
            result = fn(*args)
        except Exception as e:  # noqa: BLE001 - goes to the caller
            fail(e)
            return
        if not asyncio.iscoroutine(result):
            answer(result)
            return

        def done(t: asyncio.Task) -> None:
            if t.cancelled():
                fail(RuntimeError(f"service {service} was cancelled"))
            elif t.exception() is not None:
                fail(t.exception())
            else:
                answer(t.result())
        loop.create_task(result).add_done_callback(done)
