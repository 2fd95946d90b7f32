"""Pooling layers: ``MaxPool``, ``AvgPool``, ``AdaptiveAvgPool`` and ``AdaptiveMaxPool`` in 1, 2 and 3 dims."""

from __future__ import annotations

from typing import Any

from ...errors import ShapeError
from ...tensor import Tensor
from .. import functional as F
from ..module import Module
from ._common import _check_input, _label


def _check_rank(m: Module, x: Any, nd: int) -> Tensor:
    _check_input(m, x)
    if x.ndim not in (nd + 1, nd + 2):
        raise ShapeError(f"{_label(m)}: expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input, got shape "
                         f"{x.shape}")
    return x


class _MaxPoolNd(Module):
    _nd = 0

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    def forward(self, input: Tensor) -> Any:
        _check_rank(self, input, self._nd)
        fn = getattr(F, f"max_pool{self._nd}d")
        return fn(input, self.kernel_size, self.stride, self.padding, self.dilation, ceil_mode=self.ceil_mode,
                  return_indices=self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool1d(_MaxPoolNd):
    """1-d max pooling over ``(N, C, L)`` or ``(C, L)``."""

    _nd = 1


class MaxPool2d(_MaxPoolNd):
    """2-d max pooling over ``(N, C, H, W)`` or ``(C, H, W)``."""

    _nd = 2


class MaxPool3d(_MaxPoolNd):
    """3-d max pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)``."""

    _nd = 3


class AvgPool1d(Module):
    """1-d average pooling; kernel_size, stride and padding are kept as 1-tuples (as PyTorch)."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True) -> None:
        super().__init__()

        def single(v: Any) -> Any:
            return tuple(v) if isinstance(v, (tuple, list)) else (v,)

        self.kernel_size = single(kernel_size)
        self.stride = single(stride if stride is not None else kernel_size)
        self.padding = single(padding)
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad

    def forward(self, input: Tensor) -> Tensor:
        _check_rank(self, input, 1)
        return F.avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class _AvgPoolNd(Module):
    _nd = 0

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input: Tensor) -> Tensor:
        _check_rank(self, input, self._nd)
        fn = getattr(F, f"avg_pool{self._nd}d")
        return fn(input, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                  self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(_AvgPoolNd):
    """2-d average pooling over ``(N, C, H, W)`` or ``(C, H, W)``."""

    _nd = 2


class AvgPool3d(_AvgPoolNd):
    """3-d average pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)``."""

    _nd = 3


class _AdaptiveAvgPoolNd(Module):
    _nd = 0

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, input: Tensor) -> Tensor:
        _check_rank(self, input, self._nd)
        return getattr(F, f"adaptive_avg_pool{self._nd}d")(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd):
    """Average pooling to a fixed length."""

    _nd = 1


class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd):
    """Average pooling to a fixed (H, W); None keeps the input's size."""

    _nd = 2


class AdaptiveAvgPool3d(_AdaptiveAvgPoolNd):
    """Average pooling to a fixed (D, H, W); None keeps the input's size."""

    _nd = 3


class _AdaptiveMaxPoolNd(Module):
    _nd = 0

    def __init__(self, output_size: Any, return_indices: bool = False) -> None:
        super().__init__()
        self.output_size = output_size
        self.return_indices = return_indices

    def forward(self, input: Tensor) -> Any:
        _check_rank(self, input, self._nd)
        return getattr(F, f"adaptive_max_pool{self._nd}d")(input, self.output_size, self.return_indices)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    """Max pooling to a fixed length."""

    _nd = 1


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    """Max pooling to a fixed (H, W)."""

    _nd = 2


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    """Max pooling to a fixed (D, H, W)."""

    _nd = 3


__all__ = [
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
]
