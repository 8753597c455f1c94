"""Optional TLS for TCP connections (SPEC §7: ``ca=`` path or ``"trust_all_connections"``).

Why TLS on top of the HMAC handshake: the per-job secret already proves who is
talking, but frames would otherwise cross the network in clear. With TLS on,
every TCP connection is encrypted before the hpcmesh handshake starts; Unix
sockets (one host, file mode 0600) stay plain.

The mode travels to everything a job starts through ``HPCMESH_TLS_CA``:

- ``trust_all_connections``: encrypt, verify no certificate. Each process that
  listens makes itself a throwaway self-signed certificate (``openssl`` CLI);
  the per-job secret still authenticates both ends.
- a path to a CA bundle (PEM): listeners present ``HPCMESH_TLS_CERT`` /
  ``HPCMESH_TLS_KEY`` (PEM files; default: ``hpcmesh.pem`` / ``hpcmesh.key``
  next to the CA file), and dialers verify that certificate against the CA.
  Host names are not checked: cluster nodes are dialed by IP as often as by name.

TLS runs sans-I/O (``ssl.SSLObject`` over memory BIOs) inside ``Connection``, so
the socket shell stays the same; out-of-band buffers are encrypted (copied), the
price of encryption.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING
from ..errors import HpcmeshError

if TYPE_CHECKING:
    import ssl      # imported when TLS is used: it costs ~6 ms at startup

TRUST_ALL = "trust_all_connections"
#: The handshake key of a worker and a client that pass ``ca="trust_all_connections"``
#: and have no job secret: Monarch's trust model for that mode, where a worker accepts any
#: client that reaches its address. The key is public (it is in this file), so the handshake
#: then proves only that the peer speaks hpcmesh's protocol: anyone who can connect to the
#: worker can start processes there as the worker's user. Used only on that explicit
#: opt-in (never from ``HPCMESH_TLS_CA``); a job secret, when there is one, always wins.
TRUST_ALL_KEY = b"hpcmesh ca=trust_all_connections: no job secret, any peer is trusted"


def trust_all_key(ca, secret: bytes | None) -> bytes | None:
    """``TRUST_ALL_KEY`` when ``ca`` is explicitly ``"trust_all_connections"`` and there is
    no ``secret``; else None (the job secret is what authenticates peers)."""
    if secret is None and isinstance(ca, str) and ca == TRUST_ALL:
        return TRUST_ALL_KEY
    return None
ENV_CA = "HPCMESH_TLS_CA"
ENV_CERT = "HPCMESH_TLS_CERT"
ENV_KEY = "HPCMESH_TLS_KEY"


class TLSConfigError(HpcmeshError, ValueError):
    """The TLS settings cannot work; says which file or value and what is expected."""


@dataclass(frozen=True)
class TLSSettings:
    ca: str                     # TRUST_ALL or a CA bundle path
    cert: str | None = None     # this process's certificate (PEM), for listening
    key: str | None = None

    @property
    def trust_all(self) -> bool:
        return self.ca == TRUST_ALL

    def env(self) -> dict[str, str]:
        """What a child process needs to speak the same TLS."""
        out = {ENV_CA: self.ca}
        if self.cert and not self.trust_all:
            out[ENV_CERT] = self.cert
        if self.key and not self.trust_all:
            out[ENV_KEY] = self.key
        return out


def settings(ca=None, env: dict | None = None) -> TLSSettings | None:
    """TLS settings from an explicit ``ca`` (None: from ``HPCMESH_TLS_CA``), or None
    for plain connections. Raises TLSConfigError naming what is wrong."""
    env = os.environ if env is None else env
    if ca is None:
        ca = env.get(ENV_CA) or None
    if ca is None or ca is False:
        return None
    if not isinstance(ca, (str, os.PathLike)):
        raise TLSConfigError(f"ca={ca!r}: expected a path to a CA bundle (PEM) or "
                             f"{TRUST_ALL!r}")
    ca = os.fspath(ca)
    if ca == TRUST_ALL:
        return TLSSettings(TRUST_ALL)
    if not os.path.isfile(ca):
        raise TLSConfigError(f"ca={ca!r}: no such file; expected a CA bundle (PEM) or "
                             f"{TRUST_ALL!r}")
    base = os.path.dirname(os.path.abspath(ca))
    cert = env.get(ENV_CERT) or os.path.join(base, "hpcmesh.pem")
    key = env.get(ENV_KEY) or os.path.join(base, "hpcmesh.key")
    return TLSSettings(os.path.abspath(ca), cert, key)


def client_context(s: TLSSettings) -> ssl.SSLContext:
    """For the dialing side: verify the listener against the CA (or nothing)."""
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    if s.trust_all:
        ctx.verify_mode = ssl.CERT_NONE
    else:
        try:
            ctx.load_verify_locations(cafile=s.ca)
        except (ssl.SSLError, OSError) as e:
            raise TLSConfigError(f"cannot load the CA bundle {s.ca}: {e}") from e
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


_self_signed_lock = threading.Lock()
_self_signed: tuple[bytes, bytes] | None = None     # this process's (cert, key) PEM


def server_context(s: TLSSettings) -> ssl.SSLContext:
    """For the listening side: present this process's certificate."""
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if s.trust_all:
        _load_throwaway_certificate(ctx)
        return ctx
    for what, path in (("certificate", s.cert), ("private key", s.key)):
        if not path or not os.path.isfile(path):
            raise TLSConfigError(
                f"TLS with ca={s.ca}: no {what} at {path} for this process to present; set "
                f"{ENV_CERT} and {ENV_KEY} (PEM files signed by that CA), or use "
                f"ca={TRUST_ALL!r}")
    try:
        ctx.load_cert_chain(s.cert, s.key)
    except (ssl.SSLError, OSError) as e:
        raise TLSConfigError(f"cannot load the TLS certificate {s.cert} / key {s.key}: "
                             f"{e}") from e
    return ctx


def _load_throwaway_certificate(ctx: ssl.SSLContext) -> None:
    """Load this process's self-signed certificate (trust_all mode verifies nothing).

    Made once per process with ``openssl`` and kept in memory; it touches the disk only
    inside a private temporary directory removed at once (``load_cert_chain`` reads
    files), so no private key is left behind, even by a process that ends in
    ``os._exit``."""
    global _self_signed
    with _self_signed_lock:
        if _self_signed is None:
            with tempfile.TemporaryDirectory(prefix="hpcmesh-tls-") as d:
                cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
                try:
                    subprocess.run(
                        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                         "ec_paramgen_curve:prime256v1", "-nodes", "-days", "30", "-subj",
                         "/CN=hpcmesh", "-keyout", key, "-out", cert],
                        check=True, capture_output=True, timeout=30)
                except FileNotFoundError:
                    raise TLSConfigError(f"ca={TRUST_ALL!r} needs the `openssl` command to "
                                         f"make a throwaway certificate; install openssl, or "
                                         f"pass a CA bundle with {ENV_CERT}/{ENV_KEY}") from None
                except subprocess.CalledProcessError as e:
                    raise TLSConfigError(f"openssl could not make a certificate: "
                                         f"{e.stderr.decode(errors='replace').strip()}") from None
                except subprocess.TimeoutExpired:
                    raise TLSConfigError(f"openssl took over 30 s to make a throwaway "
                                         f"certificate for ca={TRUST_ALL!r}") from None
                with open(cert, "rb") as fc, open(key, "rb") as fk:
                    _self_signed = (fc.read(), fk.read())
        cert_pem, key_pem = _self_signed
    with tempfile.TemporaryDirectory(prefix="hpcmesh-tls-") as d:
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        for path, data in ((cert, cert_pem), (key, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(cert, key)


class TLSSession:
    """One connection's TLS state, sans-I/O: feed it what the socket read, take from it
    what to write (``ssl.SSLObject`` over two memory BIOs)."""

    __slots__ = ("obj", "incoming", "outgoing", "_want_read")

    def __init__(self, ctx: ssl.SSLContext, server_side: bool):
        import ssl
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_side=server_side)
        self._want_read = ssl.SSLWantReadError

    def handshake_step(self, data: bytes) -> tuple[bool, bytes]:
        """Feed received bytes; returns (done, bytes to send)."""
        if data:
            self.incoming.write(data)
        try:
            self.obj.do_handshake()
            done = True
        except self._want_read:
            done = False
        return done, self.outgoing.read()

    def encrypt(self, pieces) -> bytes:
        """Ciphertext for ``pieces`` (bytes-like); small pieces are joined first so a
        frame header does not become a TLS record of its own."""
        write = self.obj.write
        small: list = []
        for p in pieces:
            if (len(p) if isinstance(p, (bytes, bytearray)) else p.nbytes) < 65536:
                small.append(p)
                continue
            if small:
                write(b"".join(small))
                small = []
            write(p)
        if small:
            write(b"".join(small))
        return self.outgoing.read()

    def decrypt_into(self, data, view: memoryview) -> int:
        """Feed ``data``; read as much plaintext as fits into ``view``. Returns the count
        (0: need more ciphertext)."""
        if data:
            self.incoming.write(data)
        try:
            return self.obj.read(view.nbytes, view)
        except self._want_read:
            return 0
