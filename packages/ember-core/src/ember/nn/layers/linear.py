"""Affine layers: ``Linear`` and ``Bilinear``."""

from __future__ import annotations

import math
from typing import Any

from ...errors import ShapeError
from ...tensor import Tensor
from .. import functional as F
from .. import init
from ..module import Module
from ._common import _check_input, _label, _param, _positive_int


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
