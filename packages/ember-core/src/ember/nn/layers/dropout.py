"""Dropout layers: active in training mode (``module.train()``), the identity in eval mode."""

from __future__ import annotations

from ...errors import ShapeError, ValueRangeError
from ...tensor import Tensor
from .. import functional as F
from ..module import Module
from ._common import _check_input, _label


class _DropoutNd(Module):
    _fn = "dropout"
    _ranks: tuple[int, ...] = ()

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueRangeError(f"{type(self).__name__}: dropout probability has to be between 0 and 1, but got "
                                  f"{p!r}")
        self.p = p
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        _check_input(self, input)
        if self._ranks and input.ndim not in self._ranks:
            want = " or ".join(f"{r}D" for r in self._ranks)
            raise ShapeError(f"{_label(self)}: expected {want} input, got shape {input.shape}")
        return getattr(F, self._fn)(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout(_DropoutNd):
    """Zero each element with probability p and scale the rest by 1 / (1 - p) while training."""


class Dropout1d(_DropoutNd):
    """Zero whole channels of ``(N, C, L)`` or ``(C, L)`` input while training."""

    _fn = "dropout1d"
    _ranks = (2, 3)


class Dropout2d(_DropoutNd):
    """Zero whole channels of ``(N, C, H, W)`` or ``(C, H, W)`` input while training."""

    _fn = "dropout2d"
    _ranks = (3, 4)


class Dropout3d(_DropoutNd):
    """Zero whole channels of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input while training."""

    _fn = "dropout3d"
    _ranks = (4, 5)


__all__ = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d"]
