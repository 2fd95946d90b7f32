"""Affine layers: ``Linear`` and ``Bilinear`` (plus the helpers every layer module shares)."""

from __future__ import annotations

import math
from typing import Any

from ...errors import DTypeError, ShapeError, ValueRangeError
from ...ops.creation import empty
from ...tensor import Tensor
from .. import functional as F
from .. import init
from ..module import Module, Parameter


def _empty(shape: tuple[int, ...], device: Any, dtype: Any) -> Tensor:
    """A zero-filled tensor for a parameter or buffer, honouring the ``device=`` / ``dtype=`` factory kwargs."""
    return empty(*shape, device=device, dtype=dtype)


def _param(shape: tuple[int, ...], device: Any, dtype: Any) -> Parameter:
    return Parameter(_empty(shape, device, dtype))


def _label(m: Module) -> str:
    """``Linear(in_features=4, out_features=3, bias=True)``: the module as errors name it."""
    return f"{type(m).__name__}({m.extra_repr()})"


def _check_input(m: Module, x: Any) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{_label(m)}: expected a Tensor input, got {type(x).__name__}")
    return x


def _positive_int(m: str, name: str, v: Any, allow_zero: bool = True) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if allow_zero else 1):
        what = "a non-negative" if allow_zero else "a positive"
        raise ValueRangeError(f"{m}: {name} must be {what} int, got {v!r}")
    return v


class Linear(Module):
    """``y = x @ weight.T + bias``; weight ``(out_features, in_features)``, kaiming-uniform initialised."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.in_features = _positive_int("Linear", "in_features", in_features)
        self.out_features = _positive_int("Linear", "out_features", out_features)
        self.weight = _param((out_features, in_features), device, dtype)
        if bias:
            self.bias = _param((out_features,), device, dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # a=sqrt(5) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's long-standing default
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor) -> Tensor:
        _check_input(self, input)
        if input.ndim == 0 or input.shape[-1] != self.in_features:
            raise ShapeError(f"{_label(self)}: expected input with last dim {self.in_features}, got shape "
                             f"{input.shape}")
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Bilinear(Module):
    """``y = x1^T A x2 + b``; weight ``(out_features, in1_features, in2_features)``."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.in1_features = _positive_int("Bilinear", "in1_features", in1_features)
        self.in2_features = _positive_int("Bilinear", "in2_features", in2_features)
        self.out_features = _positive_int("Bilinear", "out_features", out_features)
        self.weight = _param((out_features, in1_features, in2_features), device, dtype)
        if bias:
            self.bias = _param((out_features,), device, dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.weight.shape[1]) if self.weight.shape[1] else 0.0
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1: Tensor, input2: Tensor) -> Tensor:
        _check_input(self, input1)
        _check_input(self, input2)
        if input1.ndim == 0 or input1.shape[-1] != self.in1_features or input2.ndim == 0 or \
                input2.shape[-1] != self.in2_features:
            raise ShapeError(f"{_label(self)}: expected inputs with last dims {self.in1_features} and "
                             f"{self.in2_features}, got shapes {input1.shape} and {input2.shape}")
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


__all__ = ["Linear", "Bilinear"]
