"""The root of every error hpcmesh raises of its own.

Each hpcmesh error is also the built-in a caller would expect (a ``SpecError`` is a
``ValueError``, a ``SlurmStartTimeout`` a ``TimeoutError``, a ``ConnectionClosed`` a
``ConnectionError``), and beside that an ``HpcmeshError``: ``except HpcmeshError`` catches
what hpcmesh raised and nothing else. Also the wording every "what is allowed" message
shares. Imports nothing of hpcmesh, so every layer may use it.
"""

from typing import Sequence


class HpcmeshError(Exception):
    """Raised by hpcmesh itself (the errors of user code come back as ``ActorError``, which
    is one too)."""


def allowed_suffix(allowed: Sequence[str], guess: str | None = None,
                   cutoff: float = 0.6) -> str:
    """``"; allowed: a, b (did you mean 'b'?)"`` (empty without ``allowed``); ``cutoff``:
    how close ``guess`` must be (difflib's ratio) to be suggested."""
    if not allowed:
        return ""
    text = "; allowed: " + ", ".join(allowed)
    if guess is not None:
        import difflib
        close = difflib.get_close_matches(guess, list(allowed), n=1, cutoff=cutoff)
        if close:
            text += f" (did you mean {close[0]!r}?)"
    return text


def excerpt(value: str, limit: int = 60) -> str:
    """``repr(value)``, cut after ``limit`` characters with the length said, so an
    error about a 100 KB value stays one readable line."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"
