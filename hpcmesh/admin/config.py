"""``MeshAdminConfig`` and its address check: light, so that ``hpcmesh.job`` can name them
without loading the HTTP server (``server.py``) until a job serves the admin view."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ADDR = "127.0.0.1:0"


@dataclass
class MeshAdminConfig:
    """How to run the admin server. ``admin_addr``: ``host:port`` to bind (``[v6]:port``
    too); None is ``127.0.0.1:0`` (loopback, any free port). Any other address, such as
    ``"0.0.0.0:0"``, is an explicit choice and still needs the token."""
    admin_addr: str | None = None


def parse_addr(addr: str | None) -> tuple[str, int]:
    """``host:port`` -> (host, port); errors say what is allowed."""
    text = DEFAULT_ADDR if addr is None else addr
    if not isinstance(text, str):
        raise TypeError(f"admin_addr must be a 'host:port' string or None, got "
                        f"{type(addr).__name__}")
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"admin_addr must look like 'host:port' (port 0-65535, 0 for any "
                         f"free port; '[::1]:0' for IPv6), got {addr!r}")
    return host, int(port)
