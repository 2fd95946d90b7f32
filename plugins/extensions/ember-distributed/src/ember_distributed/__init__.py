"""ember-distributed: ``torch.distributed``-style process groups, collectives, DistributedDataParallel and a
DistributedSampler for ember, on MPI (mpi4py) for CPUs and clusters and NCCL (CuPy) for GPUs. Published as
``ember.distributed``; ``ember launch -n N -- python train.py`` starts the ranks through the installed ``mpiexec``.
"""

__version__ = "0.1.0"
#: backend-contract version this plugin was built against
CONTRACT = 1

from .api import *  # noqa: E402,F403
from .api import __all__  # noqa: E402,F401
