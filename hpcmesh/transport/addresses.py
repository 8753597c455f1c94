"""Address URLs (``tcp://host:port``, ``unix:///path``) and the per-job secret."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from .handshake import SECRET_BYTES


@dataclass(frozen=True, slots=True)
class Address:
    scheme: str          # "tcp" or "unix"
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


def parse_address(url: str) -> Address:
    """Parse an address URL; the error names the URL and the accepted forms."""
    if not isinstance(url, str):
        raise TypeError(f"address must be a string like 'tcp://host:port', got {type(url).__name__}")
    parts = urlsplit(url)
    if parts.scheme == "unix":
        path = (parts.netloc + parts.path) if parts.netloc else parts.path
        if not path:
            raise ValueError(f"bad address {url!r}: unix addresses look like unix:///path/to/socket")
        return Address("unix", path=path)
    if parts.scheme == "tcp":
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None or not 0 <= port < 65536:
            raise ValueError(f"bad address {url!r}: tcp addresses look like tcp://host:port "
                             f"with a port in 1..65535 (0 when listening: pick a free port)")
        return Address("tcp", host=parts.hostname, port=port)
    raise ValueError(f"bad address {url!r}: scheme must be tcp:// or unix://")


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def write_secret(path: str, secret: bytes) -> str:
    """Write the secret with mode 0600 (created that way, never world-readable)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, secret.hex().encode())
    finally:
        os.close(fd)
    return path


def read_secret(path: str) -> bytes:
    with open(path, "rb") as f:
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
