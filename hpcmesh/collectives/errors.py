"""The errors collectives raise (all are RuntimeErrors, as torch.distributed's are)."""

from ..errors import HpcmeshError
from ..runtime.errors import COLLECTIVE_TIMEOUT


class CollectiveError(HpcmeshError, RuntimeError):
    """A collective (or the creation of its group) failed or timed out."""


class CollectiveMismatchError(CollectiveError):
    """Members of one group called different collectives or passed different
    shapes/dtypes; detected before the data moves, so the group stays usable
    (gloo would otherwise abort the whole process)."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A collective gave up waiting for its members (one died, hung, or never called it).
    Its failure class (SPEC §12) is ``collective timeout``: an actor that raises it fails,
    or answers a call, with that class, not as a bug of its own code."""

    failure_class = COLLECTIVE_TIMEOUT
