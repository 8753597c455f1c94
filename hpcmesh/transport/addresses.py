"""Address URLs (``tcp://host:port``, ``unix:///path``) and the per-job secret."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..private_files import create_file, open_file
from .handshake import SECRET_BYTES


@dataclass(frozen=True, slots=True)
class Address:
    scheme: str          # "tcp", "unix", or "memory" (in this process: transport/memory.py)
    host: str = ""
    port: int = 0
    path: str = ""
    fd: int | None = None   # tcp://host:fdN: serve on the inherited listening socket N

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        if self.scheme == "memory":
            return f"memory://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port if self.fd is None else f'fd{self.fd}'}"


FORMS = ("tcp://host:port, unix:///path, ipc:///path (Monarch's name for a unix socket), "
         "tcp://host:fdN (serve on inherited socket N), DIAL@BIND (advertise DIAL, bind BIND), "
         "and Monarch's proc-id prefix: service@tcp://host:port")


def split_alias(url: str) -> tuple[str, str]:
    """(the address peers dial, the address to bind) of ``url``. Monarch's forms: a bare
    URL is both; ``DIAL@BIND`` binds BIND and advertises DIAL (``tcp://node7:4444@
    tcp://0.0.0.0:4444``); a leading proc id (``service@`` or ``service<id>@``) is dropped."""
    if not isinstance(url, str):
        raise TypeError(f"address must be a string like 'tcp://host:port', got {type(url).__name__}")
    first = url.find("://")
    at = url.find("@")
    if 0 <= at < first:                          # "service<id>@tcp://..."
        url = url[at + 1:]
        first = url.find("://")
    second = url.find("://", first + 3) if first >= 0 else -1
    if second >= 0:
        at = url.rfind("@", 0, second)
        if at < 0:
            raise ValueError(f"bad address {url!r}: two URLs must be joined by '@' "
                             f"(DIAL@BIND); forms: {FORMS}")
        return url[:at], url[at + 1:]
    return url, url


def parse_address(url: str) -> Address:
    """Parse an address URL (for ``DIAL@BIND``: the one peers dial); the error names the URL
    and the accepted forms."""
    return _parse_one(split_alias(url)[0])


def parse_bind_address(url: str) -> Address:
    """The address a listener for ``url`` binds (for ``DIAL@BIND``: BIND)."""
    return _parse_one(split_alias(url)[1])


def _parse_one(url: str) -> Address:
    parts = urlsplit(url)
    if parts.scheme in ("unix", "ipc"):
        path = (parts.netloc + parts.path) if parts.netloc else parts.path
        if not path:
            raise ValueError(f"bad address {url!r}: unix addresses look like unix:///path/to/socket")
        return Address("unix", path=path)
    if parts.scheme == "tcp":
        if parts.netloc.startswith("*:"):            # Monarch's wildcard: every interface
            return _parse_one(f"tcp://0.0.0.0{parts.netloc[1:]}")
        fd_port = parts.netloc.rpartition(":")[2]
        if fd_port.startswith("fd") and fd_port[2:].isdigit() and parts.hostname:
            return Address("tcp", host=parts.hostname, port=0, fd=int(fd_port[2:]))
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None or not 0 <= port < 65536:
            raise ValueError(f"bad address {url!r}: tcp addresses look like tcp://host:port "
                             f"with a port in 1..65535 (0 when listening: pick a free port); "
                             f"forms: {FORMS}")
        return Address("tcp", host=parts.hostname, port=port)
    if parts.scheme == "memory":
        if not parts.netloc or parts.path:
            raise ValueError(f"bad address {url!r}: memory addresses look like memory://name "
                             f"(a listener in this process; for tests)")
        return Address("memory", path=parts.netloc)
    raise ValueError(f"bad address {url!r}: the scheme must be tcp://, unix:// or ipc://; "
                     f"forms: {FORMS}")


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def write_secret(path: str, secret: bytes, *, top: str | None = None) -> str:
    """Write the secret to a new file ``path`` (0600, ``O_CREAT|O_EXCL|O_NOFOLLOW``) in a
    0700 folder of this user's, checked from ``top`` (default: that folder) and made if
    missing. Whoever has the secret can run code in the job, so a symlink another user put
    at ``path``, or a folder they can write on the way, is refused (UntrustedPathError)."""
    fd = create_file(path, top=top, what="the job secret", replace=True, secret=True)
    with os.fdopen(fd, "wb") as f:
        f.write(secret.hex().encode())
    return path


def read_secret(path: str) -> bytes:
    """The secret in ``path``: a file of this user's that nobody else can read or write, in
    a folder nobody else can write. Another user's would let them into the job (they
    know the key it would accept), so it is refused (UntrustedPathError)."""
    with open_file(path, what="the job secret", secret=True) as f:
        text = f.read().strip()
    try:
        secret = bytes.fromhex(text.decode())
    except ValueError as e:
        raise ValueError(f"secret file {path} does not hold a hex secret") from e
    if len(secret) < 16:
        raise ValueError(f"secret file {path} holds a secret shorter than 16 bytes")
    return secret


def secret_from_env(env=os.environ) -> bytes | None:
    """Workers get the secret as HPCMESH_SECRET (hex) or HPCMESH_SECRET_FILE (path)."""
    if env.get("HPCMESH_SECRET"):
        return bytes.fromhex(env["HPCMESH_SECRET"])
    if env.get("HPCMESH_SECRET_FILE"):
        return read_secret(env["HPCMESH_SECRET_FILE"])
    return None
