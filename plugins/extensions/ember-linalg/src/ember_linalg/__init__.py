"""ember-linalg: PyTorch's ``torch.linalg`` for ember, published as ``ember.linalg.*``.

Decompositions and solvers (cholesky, qr, eigh, svd, lu, solve, inv, det, lstsq, pinv, ...) are
``ember.backend_extension`` ops running LAPACK (numpy.linalg / scipy.linalg) on the host, with vjps written in ember
ops; norms and products are compositions. Import nothing from here to use it: ``ember.linalg.cholesky(A)`` finds
this plugin through its entry point.
"""

from __future__ import annotations

from ._base import LinAlgError

__version__ = "0.1.0"

__all__ = ["LinAlgError", "__version__"]
