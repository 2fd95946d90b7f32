"""ember-distributed's errors; each derives from :class:`ember.EmberError` and the matching Python built-in."""

from __future__ import annotations

from ember.errors import EmberError


class DistributedError(EmberError, RuntimeError):
    """A distributed operation cannot run: no process group, a rank outside the group, an engine failure, a
    gradient reduction a DataParallel iteration left unfinished."""


class DistributedTimeoutError(DistributedError, TimeoutError):
    """A collective did not complete within the process group's timeout: a peer rank died or is stuck. The group
    is unusable afterwards (MPI cannot finalize with a lost peer, so the process exits with status 1 at interpreter
    exit instead of hanging in ``MPI_Finalize``)."""


__all__ = ["DistributedError", "DistributedTimeoutError"]
