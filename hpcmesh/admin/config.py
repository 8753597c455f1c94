"""``MeshAdminConfig``: light, so that ``hpcmesh.job`` can name it without loading the HTTP
server (``server.py``) until a job serves the admin view. Its address is checked by
``token_http.parse_addr``, as every token server's is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MeshAdminConfig:
    """How to run the admin server. ``admin_addr``: ``host:port`` to bind (``[v6]:port``
    too); None is ``127.0.0.1:0`` (loopback, any free port). Any other address, such as
    ``"0.0.0.0:0"``, is an explicit choice and still needs the token."""
    admin_addr: str | None = None
