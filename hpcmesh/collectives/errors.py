"""The errors collectives raise (both are RuntimeErrors, as torch.distributed's are)."""

from ..errors import HpcmeshError


class CollectiveError(HpcmeshError, RuntimeError):
    """A collective (or the creation of its group) failed or timed out."""


class CollectiveMismatchError(CollectiveError):
    """Members of one group called different collectives or passed different
    shapes/dtypes; detected before the data moves, so the group stays usable
    (gloo would otherwise abort the whole process)."""
