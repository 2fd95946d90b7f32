"""``ember.linalg``: PyTorch's ``torch.linalg`` names that core provides.

Core ships the norms every model needs; matrix decompositions and solvers are left to a plugin (an ember-linalg
plugin, not released yet), which would register them as extension ops.
"""

from .ops.linalg import matmul
from .ops.reduction import vector_norm

__all__ = ["vector_norm", "matmul"]
