"""Mutual HMAC challenge-response over a shared per-job secret (sans-I/O).

Nothing is unpickled from a peer until this handshake succeeds: a peer that
does not know the secret is dropped after at most two fixed-size messages.

    dialer  -> listener : MAGIC | nonce_d                       (40 bytes)
    listener -> dialer  : MAGIC | nonce_l | HMAC(s, "L"|nonce_d|nonce_l)  (72 bytes)
    dialer  -> listener : HMAC(s, "D"|nonce_l|nonce_d)           (32 bytes)

The two roles sign different labels so that one side's answer can never be
replayed as the other's.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from ..errors import HpcmeshError

#: "HPCMESH" and the wire version: 2 added batch frames and read-only buffer flags; 3 the
#: response-port flag that travels with an actor class's endpoints; 4 MSG_RESULT (replies
#: pickled apart from their envelope); 5 the message helpers' new home (runtime.messages:
#: pickles name ANSWERED_THROUGH_PORT and ReplyNotSent by module); 6 MSG_CAST and
#: MSG_CAST_REPLY (calls fanned out and answers folded by host agents); 7 MSG_CAST_TREE
#: (casts through a tree of host agents); 8 one reply port per host share and MSG_CAST_UP
#: (answers folded up the tree); 9 packed answers (MSG_RESULTS, MSG_VALUES) and the casts'
#: ``hold``.
MAGIC = b"HPCMESH9"
#: What a listener at its cap of connections in their handshake sends before it closes a new
#: one (instead of the MAGIC): the dialer may try again soon. Reveals nothing of the secret.
BUSY = b"HPCMBUSY"
NONCE = 32
MAC = 32
SECRET_BYTES = 32


class HandshakeError(HpcmeshError):
    """The peer failed authentication or spoke another protocol."""


class HandshakeBusy(HandshakeError):
    """The listener is at its cap of connections in their handshake (a flood, or many
    dialers at once) and turned this one away: try again in a moment."""


def _mac(secret: bytes, label: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, label + a + b, hashlib.sha256).digest()


class Handshake:
    """One side of the handshake. Feed it bytes; it says what to send and when it is done.

    ``receive`` returns ``(to_send, leftover)``; ``done`` turns True once the
    peer is authenticated. Bytes past the handshake are returned as leftover.
    """

    def __init__(self, secret: bytes, dialer: bool):
        if len(secret) < 16:
            raise ValueError("the job secret must be at least 16 bytes")
        self._secret = secret
        self.dialer = dialer
        self.done = False
        self._nonce = os.urandom(NONCE)
        self._peer_nonce = b""
        self._inbox = b""
        self._expect = len(MAGIC) + NONCE + MAC if dialer else len(MAGIC) + NONCE
        self._stage = 0

    def initial(self) -> bytes:
        """Bytes the dialer sends first (the listener sends nothing first)."""
        return MAGIC + self._nonce if self.dialer else b""

    def receive(self, data: bytes) -> tuple[bytes, bytes]:
        if self.done:
            return b"", data
        self._inbox += data
        if self._expects_magic():
            head = self._inbox[:len(MAGIC)]
            if not MAGIC.startswith(head):      # drop an HTTP probe or port scanner at once
                raise HandshakeError(_bad_magic(head))
        out = b""
        # Bytes beyond one step stay in the inbox for the next step (never dropped).
        while not self.done and len(self._inbox) >= self._expect:
            msg, self._inbox = self._inbox[:self._expect], self._inbox[self._expect:]
            out += self._dialer_step(msg) if self.dialer else self._listener_step(msg)
        if self.done:
            rest, self._inbox = self._inbox, b""
            return out, rest
        return out, b""

    def _expects_magic(self) -> bool:
        return self.dialer or self._stage == 0

    def _check_magic(self, msg: bytes) -> bytes:
        if msg[:len(MAGIC)] != MAGIC:
            raise HandshakeError(_bad_magic(msg[:len(MAGIC)]))
        return msg[len(MAGIC):]

    def _dialer_step(self, msg: bytes) -> bytes:
        body = self._check_magic(msg)
        peer_nonce, peer_mac = body[:NONCE], body[NONCE:]
        if not hmac.compare_digest(peer_mac, _mac(self._secret, b"L", self._nonce, peer_nonce)):
            raise HandshakeError("listener failed authentication: it does not hold this job's secret")
        self.done = True
        return _mac(self._secret, b"D", peer_nonce, self._nonce)

    def _listener_step(self, msg: bytes) -> bytes:
        if self._stage == 0:
            self._peer_nonce = self._check_magic(msg)
            self._stage = 1
            self._expect = MAC
            return MAGIC + self._nonce + _mac(self._secret, b"L", self._peer_nonce, self._nonce)
        if not hmac.compare_digest(msg, _mac(self._secret, b"D", self._nonce, self._peer_nonce)):
            raise HandshakeError("dialer failed authentication: it does not hold this job's secret")
        self.done = True
        return b""


def _bad_magic(head: bytes) -> str:
    if len(head) == len(MAGIC) and head[:-1] == MAGIC[:-1]:
        return (f"peer speaks hpcmesh wire version {head[-1:].decode(errors='replace')}, this "
                f"process speaks version {MAGIC[-1:].decode()}: run the same hpcmesh version "
                f"on the controller and on every host")
    return "peer does not speak the hpcmesh protocol (bad magic)"
