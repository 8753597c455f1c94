"""The root of every error hpcmesh raises of its own.

Each hpcmesh error is also the built-in a caller would expect (a ``SpecError`` is a
``ValueError``, a ``SlurmStartTimeout`` a ``TimeoutError``, a ``ConnectionClosed`` a
``ConnectionError``), and beside that an ``HpcmeshError``: ``except HpcmeshError`` catches
what hpcmesh raised and nothing else. Imports nothing, so every layer may use it.
"""


class HpcmeshError(Exception):
    """Raised by hpcmesh itself (the errors of user code come back as ``ActorError``, which
    is one too)."""
