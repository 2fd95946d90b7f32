"""``SparseAdam``: a PyTorch optimizer ember does not provide; constructing one raises UnsupportedError naming
what to use instead (the name exists so a port fails with that message, not an AttributeError)."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedError
from .optimizer import Optimizer


class SparseAdam(Optimizer):
    """Not supported: ember has no sparse gradients (``nn.Embedding(sparse=True)`` gives dense ones), so the
    lazy sparse Adam update has nothing to act on. Use :class:`ember.optim.Adam` (identical on dense gradients
    except that rows with a zero gradient still decay their moments)."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 maximize: bool = False) -> None:
        raise UnsupportedError(
            "SparseAdam: ember has no sparse gradients, so SparseAdam is not provided; use "
            f"ember.optim.Adam(params, lr={lr!r}, betas={betas!r}, eps={eps!r}, maximize={maximize!r}) on the "
            "dense gradients instead"
        )

