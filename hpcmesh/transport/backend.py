"""What a node needs of the network, and nothing else: listen on an address, dial one.

The address's scheme picks the backend (the httpcore lesson: the protocol above never
knows which): ``tcp://`` and ``unix://`` go to real sockets (``connection.Listener`` and
``connection.dial``), ``memory://`` to the in-process twin (``memory.py``), whose streams
carry the same frames through the same ``Connection``. Either way a dial returns
``(stream, leftover, tls_session)`` and a listener calls ``on_accept(stream, peer_name,
leftover, tls_session)`` once the peer is authenticated; ``Connection(loop, stream, ...)``
takes either stream.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from . import connection, memory
from .addresses import Address, parse_address, parse_bind_address


def listen(loop: asyncio.AbstractEventLoop, address: str, secret: bytes, on_accept: Callable,
           tls_ctx: Callable[[], object] = lambda: None
           ) -> connection.Listener | memory.MemoryListener:
    """A listener on ``address`` (``DIAL@BIND``: on BIND); its ``address`` is what it bound
    (a ``tcp://host:0`` request comes back with the port picked) and ``close()`` ends it."""
    bind = parse_bind_address(address)
    if bind.scheme == "memory":
        return memory.MemoryListener(loop, bind, secret, on_accept)
    return connection.Listener(loop, address, secret, on_accept, tls_ctx)


async def dial(loop: asyncio.AbstractEventLoop, address: str | Address, secret: bytes,
               timeout: float = connection.HANDSHAKE_TIMEOUT, tls_ctx=None):
    """Connect to ``address`` and authenticate with ``secret``: (stream, bytes read past
    the handshake, TLS session or None)."""
    addr = parse_address(address) if isinstance(address, str) else address
    if addr.scheme == "memory":
        return await memory.dial(addr, secret)
    return await connection.dial(loop, addr, secret, timeout, tls_ctx)
