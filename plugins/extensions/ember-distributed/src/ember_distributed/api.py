"""``ember.distributed``: process groups, collectives, DistributedDataParallel and a DistributedSampler on MPI
(mpi4py) and NCCL (CuPy), with ``torch.distributed``'s names.

>>> import ember
>>> import ember.distributed as dist                    # doctest: +SKIP
>>> dist.init()                                         # doctest: +SKIP
>>> t = ember.ones(4) * (dist.rank() + 1)               # doctest: +SKIP
>>> dist.all_reduce(t, op=dist.ReduceOp.SUM)            # doctest: +SKIP
"""

from __future__ import annotations

from .collectives import (
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    barrier,
    broadcast,
    broadcast_object_list,
    reduce_scatter,
    reduce_scatter_tensor,
)
from .ddp import DataParallel, DistributedDataParallel
from .errors import DistributedError, DistributedTimeoutError
from .group import (
    ProcessGroup,
    ReduceOp,
    Work,
    destroy_process_group,
    get_backend,
    get_rank,
    get_world_size,
    init,
    init_process_group,
    is_available,
    is_initialized,
    new_group,
    rank,
    world_size,
)
from .sampler import DistributedSampler

__all__ = [
    "init", "init_process_group", "is_initialized", "is_available", "destroy_process_group", "new_group",
    "rank", "world_size", "get_rank", "get_world_size", "get_backend", "ProcessGroup", "ReduceOp", "Work",
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "barrier", "all_gather_object", "broadcast_object_list", "DataParallel", "DistributedDataParallel",
    "DistributedSampler", "DistributedError", "DistributedTimeoutError",
]
