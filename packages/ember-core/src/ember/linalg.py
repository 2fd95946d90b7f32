"""``ember.linalg``: PyTorch's ``torch.linalg`` names.

Core ships the products and norms every model needs (``matmul``, ``vector_norm``); decompositions, solvers and
the other ``torch.linalg`` functions come from a plugin that publishes this namespace (``register_namespaces``
or ``backend_extension("linalg.<fn>")``). Without one, those names raise
:class:`ember.errors.MissingPluginError` naming the extra to install.
"""

from .ops.linalg import matmul
from .ops.reduction import vector_norm
from .plugins.namespaces import open_namespace

__all__ = ["vector_norm", "matmul"]

__getattr__, __dir__ = open_namespace("linalg")
