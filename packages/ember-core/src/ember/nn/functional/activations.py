"""Activation functions and softmax-like normalisations (``torch.nn.functional`` names and defaults)."""

from __future__ import annotations

from typing import Any

from ... import dtypes as dt
from ...amp.autocast_mode import STATE as _AMP
from ...amp.autocast_mode import run as _amp_run
from ...dtypes import DType, as_dtype
from ...errors import DTypeError, ShapeError, ValueRangeError
from ...ops import nn as _nn
from ...shapes import norm_dim
from ...tensor import Tensor
from ._util import check_float, check_tensor

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """max(x, 0); NaN propagates."""
    check_tensor(input, "relu")
    if input._dtype.is_bool:
        raise DTypeError("relu: not implemented for bool tensors")
    return _nn.activation("relu", input, inplace=inplace)


def relu_(input: Tensor) -> Tensor:
    return relu(input, inplace=True)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """Clamp to [min_val, max_val]."""
    check_tensor(input, "hardtanh")
    if min_val > max_val:
        raise ValueRangeError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val ({max_val})")
    if not input._dtype.is_floating_point:
        return _hardtanh_int(input, min_val, max_val, inplace)
    return _nn.activation("hardtanh", input, float(min_val), float(max_val), inplace=inplace)


def _hardtanh_int(input: Tensor, min_val: float, max_val: float, inplace: bool) -> Tensor:
    """torch's hardtanh of an integer tensor: a clamp in the input's dtype, the bounds truncated toward zero;
    bool input and negative bounds for an unsigned dtype are refused."""
    d = input._dtype
    if d.is_bool:
        raise DTypeError("hardtanh: Bool inputs not supported for hardtanh")
    if not d.is_signed and (min_val < 0 or max_val < 0):
        raise ValueRangeError(f"hardtanh: cannot do hardtanh on an unsigned type ({d.name}) with negative limits "
                              f"(min_val={min_val}, max_val={max_val})")
    lo, hi = dt.convert_scalar(min_val, d, "hardtanh"), dt.convert_scalar(max_val, d, "hardtanh")  # range-checked
    return _nn.activation("hardtanh", input, lo, hi, inplace=inplace)


def hardtanh_(input: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    return hardtanh(input, min_val, max_val, inplace=True)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """min(max(x, 0), 6)."""
    check_float(input, "relu6")
    return hardtanh(input, 0.0, 6.0, inplace)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x); approximate='tanh' uses the tanh formula."""
    check_float(input, "gelu")
    if approximate not in ("none", "tanh"):
        raise ValueRangeError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _nn.activation("gelu", input, approximate)


def sigmoid(input: Tensor) -> Tensor:
    check_float(input, "sigmoid")
    return _nn.sigmoid(input)


def tanh(input: Tensor) -> Tensor:
    check_float(input, "tanh")
    return _nn.tanh(input)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """x * sigmoid(x)."""
    check_float(input, "silu")
    return _nn.activation("silu", input, inplace=inplace)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """x for x > 0, else alpha * (exp(x) - 1)."""
    check_float(input, "elu")
    return _nn.activation("elu", input, alpha, inplace=inplace)


def elu_(input: Tensor, alpha: float = 1.0) -> Tensor:
    return elu(input, alpha, inplace=True)


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    """scale * elu(x, alpha) with the self-normalising constants."""
    check_float(input, "selu")
    return _nn.activation("elu", input, _SELU_ALPHA, _SELU_SCALE, inplace=inplace)


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    check_float(input, "celu")
    if alpha == 0:
        raise ValueRangeError("celu: alpha must not be 0 (ZeroDivisionError in the formula)")
    return _nn.activation("elu", input, alpha, 1.0, 1.0 / alpha, inplace=inplace)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """x for x > 0, else negative_slope * x."""
    check_float(input, "leaky_relu")
    return _nn.activation("leaky_relu", input, negative_slope, inplace=inplace)


def leaky_relu_(input: Tensor, negative_slope: float = 0.01) -> Tensor:
    return leaky_relu(input, negative_slope, inplace=True)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta * x)) / beta, linear where beta * x > threshold."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("softplus", softplus, input, beta, threshold)
    check_float(input, "softplus")
    if beta == 0:
        raise ValueRangeError("softplus: beta must not be 0")
    return _nn.activation("softplus", input, beta, threshold)


def softsign(input: Tensor) -> Tensor:
    """``x / (1 + |x|)``."""
    check_float(input, "softsign")
    return _nn.activation("softsign", input)


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    """x * tanh(softplus(x))."""
    check_float(input, "mish")
    return _nn.activation("mish", input, inplace=inplace)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """relu6(x + 3) / 6."""
    check_float(input, "hardsigmoid")
    return _nn.activation("hardsigmoid", input, inplace=inplace)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """x * relu6(x + 3) / 6."""
    check_float(input, "hardswish")
    return _nn.activation("hardswish", input, inplace=inplace)


def logsigmoid(input: Tensor) -> Tensor:
    """``log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|))``, stable for large ``|x|``."""
    check_float(input, "logsigmoid")
    return _nn.activation("logsigmoid", input)


def tanhshrink(input: Tensor) -> Tensor:
    """x - tanh(x)."""
    check_float(input, "tanhshrink")
    return _nn.activation("tanhshrink", input)


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x`` where ``|x| > lambd``, else 0."""
    check_float(input, "hardshrink")
    return _nn.activation("hardshrink", input, lambd)


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """x - lambd for x > lambd, x + lambd for x < -lambd, else 0."""
    check_float(input, "softshrink")
    if lambd < 0:
        raise ValueRangeError(f"softshrink: lambda must be greater or equal to 0, but found to be {lambd}")
    return _nn.activation("softshrink", input, lambd)


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """x where x > threshold, else value."""
    check_tensor(input, "threshold")
    return _nn.activation("threshold", input, threshold, value, inplace=inplace)


def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """x for x > 0, else weight * x; weight has 1 or C (= input.shape[1]) elements."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("prelu", prelu, input, weight)
    check_float(input, "prelu")
    check_tensor(weight, "prelu", "weight")
    if weight._dtype is not input._dtype:
        raise DTypeError(f"prelu: weight dtype {weight._dtype.name} differs from input dtype {input._dtype.name}")
    n = weight.numel()
    c = input.shape[1] if input.ndim >= 2 else 1
    if weight.ndim > 1 or n not in (1, c):
        raise ShapeError(f"prelu: weight must have 1 or {c} (input.shape[1]) elements, got shape {weight.shape} "
                         f"for input shape {input.shape}")
    return _nn.prelu(input, weight)


def _softmax_dim(op: str, ndim: int, dim: Any) -> int:
    if dim is None:
        # torch's legacy implicit choice (with a deprecation warning there)
        import warnings

        warnings.warn(f"{op}: implicit dimension choice is deprecated; pass dim=", UserWarning, stacklevel=3)
        dim = 0 if ndim in (0, 1, 3) else 1
    return norm_dim(dim, ndim, op)


def _softmax_dtype(op: str, input: Tensor, dtype: Any) -> DType:
    """The dtype softmax computes in: dtype= (floating) or the input's own (floating unless empty)."""
    check_tensor(input, op)
    if dtype is not None:
        d = as_dtype(dtype)
        if not d.is_floating_point:
            raise DTypeError(f"{op}: dtype must be a floating point dtype, got {d.name}")
        return d
    if not input._dtype.is_floating_point and input.numel():  # torch returns an empty input as is, any dtype
        raise DTypeError(f"{op}: not implemented for dtype {input._dtype.name} (pass dtype= or a float tensor)")
    return input._dtype


def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """exp(x) / sum(exp(x)) along dim; dtype casts the input first."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("softmax", softmax, input, dim, _stacklevel, dtype)
    d = _softmax_dtype("softmax", input, dtype)
    return _nn.softmax(input, _softmax_dim("softmax", input.ndim, dim), d)


def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """log(softmax(x)) computed stably."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("log_softmax", log_softmax, input, dim, _stacklevel, dtype)
    d = _softmax_dtype("log_softmax", input, dtype)
    return _nn.softmax(input, _softmax_dim("log_softmax", input.ndim, dim), d, log=True)


def softmin(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """softmax(-x)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("softmin", softmin, input, dim, _stacklevel, dtype)
    d = _softmax_dtype("softmin", input, dtype)
    return _nn.softmax(input, _softmax_dim("softmin", input.ndim, dim), d, negate=True)


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """a * sigmoid(b) where a, b are the two halves of input along dim."""
    check_float(input, "glu")
    if input.ndim == 0:
        raise ShapeError("glu: halving dimension must be even, but a 0-d tensor has no dimension to split")
    d = norm_dim(dim, input.ndim, "glu")
    n = input.shape[d]
    if n % 2:
        raise ShapeError(f"glu: halving dimension must be even, but dimension {d} is size {n} "
                         f"(input shape {input.shape})")
    return _nn.glu(input, d)


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out: Any = None) -> Tensor:
    """x / max(||x||_p, eps) along dim."""
    check_float(input, "normalize")
    if out is not None:
        raise ValueRangeError("normalize: out= is not supported; assign the result instead")
    if input.ndim == 0:
        norm_dim(dim, 0, "normalize")
        return _nn.normalize(input, p, None, eps)
    return _nn.normalize(input, p, norm_dim(dim, input.ndim, "normalize"), eps)


__all__ = [
    "relu", "relu_", "relu6", "hardtanh", "hardtanh_", "gelu", "sigmoid", "tanh", "silu", "elu", "elu_", "selu",
    "celu", "leaky_relu", "leaky_relu_", "softplus", "softsign", "mish", "hardsigmoid", "hardswish", "logsigmoid",
    "tanhshrink", "hardshrink", "softshrink", "threshold", "prelu", "softmax", "log_softmax", "softmin", "glu",
    "normalize",
]
