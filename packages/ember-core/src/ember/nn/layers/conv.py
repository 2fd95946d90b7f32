"""Convolution layers: ``Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d`` with PyTorch's arguments and init."""

from __future__ import annotations

import math
from typing import Any

from ...errors import ShapeError, ValueRangeError
from ...tensor import Tensor
from .. import functional as F
from .. import init
from ..module import Module
from ._common import _check_input, _label, _param, _positive_int

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _ntuple(v: Any, n: int, cls: str, name: str, minimum: int) -> tuple[int, ...]:
    if isinstance(v, (tuple, list)):
        t = tuple(v)
    else:
        t = (v,) * n
    if len(t) != n or any(isinstance(e, bool) or not isinstance(e, int) or e < minimum for e in t):
        what = "positive" if minimum == 1 else "non-negative"
        raise ValueRangeError(f"{cls}: {name} must be a {what} int or a sequence of {n} {what} ints, got {v!r}")
    return t


class _ConvNd(Module):
    """Shared constructor, initialisation and repr of the convolutions (torch.nn.modules.conv._ConvNd)."""

    _nd = 0
    _transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any, padding: Any,
                 dilation: Any, output_padding: Any, groups: int, bias: bool, padding_mode: str, device: Any,
                 dtype: Any) -> None:
        super().__init__()
        cls, nd = type(self).__name__, self._nd
        _positive_int(cls, "in_channels", in_channels)
        _positive_int(cls, "out_channels", out_channels)
        if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
            raise ValueRangeError(f"{cls}: groups must be a positive integer, got {groups!r}")
        if in_channels % groups:
            raise ValueRangeError(f"{cls}: in_channels ({in_channels}) must be divisible by groups ({groups})")
        if out_channels % groups:
            raise ValueRangeError(f"{cls}: out_channels ({out_channels}) must be divisible by groups ({groups})")
        self.kernel_size = _ntuple(kernel_size, nd, cls, "kernel_size", 1)
        self.stride = _ntuple(stride, nd, cls, "stride", 1)
        self.dilation = _ntuple(dilation, nd, cls, "dilation", 1)
        self.output_padding = _ntuple(output_padding, nd, cls, "output_padding", 0)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueRangeError(f"{cls}: invalid padding string {padding!r}, should be one of "
                                      "('same', 'valid')")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueRangeError(f"{cls}: padding='same' is not supported for strided convolutions "
                                      f"(stride {self.stride})")
            self.padding: Any = padding
        else:
            self.padding = _ntuple(padding, nd, cls, "padding", 0)
        if padding_mode not in _PADDING_MODES:
            raise ValueRangeError(f"{cls}: padding_mode must be one of {_PADDING_MODES}, got {padding_mode!r}")
        if self._transposed and padding_mode != "zeros":
            raise ValueRangeError(f"{cls}: only 'zeros' padding mode is supported, got {padding_mode!r}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.transposed = self._transposed
        self.padding_mode = padding_mode
        # F.pad's order: (left, right) of the last dim first
        self._reversed_padding_repeated_twice = [v for pair in reversed(self._pad_pairs()) for v in pair]
        if self._transposed:
            shape = (in_channels, out_channels // groups) + self.kernel_size
        else:
            shape = (out_channels, in_channels // groups) + self.kernel_size
        self.weight = _param(shape, device, dtype)
        if bias:
            self.bias = _param((out_channels,), device, dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def _pad_pairs(self) -> list[tuple[int, int]]:
        if self.padding == "valid":
            return [(0, 0)] * self._nd
        if self.padding == "same":
            return [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2)
                    for d, k in zip(self.dilation, self.kernel_size)]
        return [(p, p) for p in self.padding]

    def reset_parameters(self) -> None:
        # a=sqrt(5) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)) as PyTorch
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def _check(self, input: Any) -> Tensor:
        _check_input(self, input)
        nd = self._nd
        if input.ndim not in (nd + 1, nd + 2):
            raise ShapeError(f"{_label(self)}: expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input, got "
                             f"shape {input.shape}")
        c = input.shape[-nd - 1]
        if c != self.in_channels:
            raise ShapeError(f"{_label(self)}: expected input with {self.in_channels} channels (dim "
                             f"{input.ndim - nd - 1}), got {c} in shape {input.shape}")
        return input

    def extra_repr(self) -> str:
        nd = self._nd
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * nd:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * nd:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * nd:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class _Conv(_ConvNd):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, 0, groups, bias,
                         padding_mode, device, dtype)

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        fn = getattr(F, f"conv{self._nd}d")
        if self.padding_mode != "zeros":
            padded = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return fn(padded, weight, bias, self.stride, 0, self.dilation, self.groups)
        return fn(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input: Tensor) -> Tensor:
        return self._conv_forward(self._check(input), self.weight, self.bias)


class Conv1d(_Conv):
    """1-d convolution over ``(N, C_in, L)`` or ``(C_in, L)``."""

    _nd = 1


class Conv2d(_Conv):
    """2-d convolution over ``(N, C_in, H, W)`` or ``(C_in, H, W)``."""

    _nd = 2


class Conv3d(_Conv):
    """3-d convolution over ``(N, C_in, D, H, W)`` or ``(C_in, D, H, W)``."""

    _nd = 3


class _ConvTranspose(_ConvNd):
    _transposed = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 output_padding: Any = 0, groups: int = 1, bias: bool = True, dilation: Any = 1,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None) -> None:
        if isinstance(padding, str):
            raise ValueRangeError(f"{type(self).__name__}: string padding {padding!r} is not supported for "
                                  "transposed convolutions")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, output_padding, groups,
                         bias, padding_mode, device, dtype)

    def _output_padding(self, input: Tensor, output_size: Any) -> tuple[int, ...]:
        """The output_padding that makes the output spatial size equal output_size (PyTorch's rule)."""
        if output_size is None:
            return self.output_padding
        nd = self._nd
        size = list(output_size.shape if isinstance(output_size, Tensor) else output_size)
        non_spatial = 2 if input.ndim == nd + 2 else 1
        if len(size) == non_spatial + nd:
            size = size[non_spatial:]
        if len(size) != nd:
            raise ValueRangeError(f"{_label(self)}: output_size must have {nd} or {non_spatial + nd} elements "
                                  f"(got {len(size)})")
        res = []
        for d in range(nd):
            lo = ((input.shape[d + non_spatial] - 1) * self.stride[d] - 2 * self.padding[d]
                  + self.dilation[d] * (self.kernel_size[d] - 1) + 1)
            hi = lo + self.stride[d] - 1
            if not lo <= int(size[d]) <= hi:
                raise ValueRangeError(f"{_label(self)}: requested an output size of {tuple(size)}, but valid sizes "
                                      f"range from {lo} to {hi} in dim {d} (for an input of shape {input.shape})")
            res.append(int(size[d]) - lo)
        return tuple(res)

    def forward(self, input: Tensor, output_size: Any = None) -> Tensor:
        self._check(input)
        op = self._output_padding(input, output_size)
        fn = getattr(F, f"conv_transpose{self._nd}d")
        return fn(input, self.weight, self.bias, self.stride, self.padding, op, self.groups, self.dilation)


class ConvTranspose1d(_ConvTranspose):
    """1-d transposed convolution; weight ``(C_in, C_out/groups, kL)``."""

    _nd = 1


class ConvTranspose2d(_ConvTranspose):
    """2-d transposed convolution; weight ``(C_in, C_out/groups, kH, kW)``."""

    _nd = 2


class ConvTranspose3d(_ConvTranspose):
    """3-d transposed convolution; weight ``(C_in, C_out/groups, kD, kH, kW)``."""

    _nd = 3


__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]
