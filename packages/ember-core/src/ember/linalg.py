"""``ember.linalg``: PyTorch's ``torch.linalg`` names that core provides.

Core ships the norms every model needs; matrix decompositions and solvers come from the ember-linalg plugin
(``pip install 'ember[linalg]'``), which registers them as extension ops.
"""

from .ops.linalg import matmul
from .ops.reduction import vector_norm

__all__ = ["vector_norm", "matmul"]
