"""Address URLs (``tcp://host:port``, ``unix:///path``) and the per-job secret."""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import allowed_suffix
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


_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
WORKER_SCHEMES = ("tcp", "unix", "ipc")
WORKER_FORMS = ("tcp://host:port (port 1-65535), unix:///absolute/path or ipc:///absolute/path; "
                "Monarch's DIAL@BIND and service@ prefix are taken too")


def is_host_name(text: str) -> bool:
    """A DNS name or IPv4 address as written in a URL or an ssh host list: letters, digits,
    '.', '-' and '_', not starting or ending with '.' or '-'."""
    return bool(_HOST_NAME.fullmatch(text))


def parse_worker_address(url: str) -> Address:
    """The address to dial a running host agent at (``attach_to_workers``, a hosts file's
    ``workers:``): every form ``parse_address`` reads, held to what can be dialled. Its DIAL
    part (all of it, for a plain URL) must be ``tcp://host:port`` with a real port (not 0,
    ``fdN`` or a ``*`` host, which only a listener means) or a unix/ipc socket by absolute
    path (``unix://tmp/s`` is the relative path ``tmp/s``: a slash short); no user names,
    paths, '?' or '#'. The BIND part of ``DIAL@BIND`` is the agent's business, only parsed.
    Raises ValueError naming the URL, the fault and the forms."""
    if not isinstance(url, str):
        raise ValueError(f"worker address must be a string like 'tcp://host:port', got "
                         f"{type(url).__name__} {url!r}")
    if "://" not in url:
        hint = f" (did you mean 'tcp://{url}'?)" if re.fullmatch(r"[\w.-]+:\d+", url) else ""
        raise ValueError(f"worker {url!r} is not a URL; expected {WORKER_FORMS}{hint}")
    dial, bind = split_alias(url)
    who = f"worker {url!r}" + (f" (the address to dial, {dial!r})" if dial != url else "")
    try:
        parts = urlsplit(dial)
    except ValueError as exc:  # a bracketed host that is not IPv6
        raise ValueError(f"{who}: bad IPv6 address ({exc})") from None
    if parts.scheme not in WORKER_SCHEMES:
        raise ValueError(f"{who}: unknown scheme {parts.scheme!r}"
                         f"{allowed_suffix(WORKER_SCHEMES, parts.scheme, cutoff=0.5)}")
    if parts.query or parts.fragment:
        raise ValueError(f"{who}: unexpected '?' or '#' part; expected {WORKER_FORMS}")
    if parts.scheme in ("unix", "ipc"):
        if parts.netloc or not parts.path.startswith("/"):
            raise ValueError(f"{who}: {parts.scheme} addresses need an absolute path "
                             f"(three slashes: {parts.scheme}:///path)")
    else:
        if parts.path not in ("", "/"):
            raise ValueError(f"{who}: unexpected path {parts.path!r}; expected {WORKER_FORMS}")
        if "@" in parts.netloc:
            raise ValueError(f"{who}: user names are not allowed; expected {WORKER_FORMS}")
        host = parts.hostname
        if not host:
            raise ValueError(f"{who} has no host; expected {WORKER_FORMS}")
        if ":" in host:
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise ValueError(f"{who}: bad IPv6 address {host!r}") from None
        elif not is_host_name(host):
            raise ValueError(f"{who}: bad host name {host!r}")
        try:
            port = parts.port
        except ValueError:
            port_text = parts.netloc.rpartition(":")[2]
            raise ValueError(f"{who}: bad port {port_text!r}; port must be 1-65535") from None
        if port is None:
            raise ValueError(f"{who} has no port; expected {WORKER_FORMS}")
        if not 1 <= port <= 65535:
            raise ValueError(f"{who}: port {port} out of range 1-65535")
    if bind != dial:
        parse_bind_address(url)
    return parse_address(url)


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
