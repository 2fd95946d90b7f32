"""Activation functions and softmax-like normalisations (``torch.nn.functional`` names and defaults)."""

from __future__ import annotations

import math
from typing import Any

from ... import dtypes as dt
from ..._bridge import norm_dim
from ...dtypes import DType, as_dtype
from ...errors import DTypeError, ShapeError, ValueRangeError
from ...ops.elementwise import keep_graph, tracks_grad, write_result
from ...tensor import Tensor
from ._util import check_float, check_tensor, like, vector_norm

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _finish(x: Tensor, h: Any, inplace: bool) -> Tensor:
    """Wrap h like x, or write it into x when the caller asked for the in-place form."""
    if inplace:
        return write_result(x, h, "inplace activation")
    return like(x, h)


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """max(x, 0); NaN propagates."""
    check_tensor(input, "relu")
    if input._dtype.is_bool:
        raise DTypeError("relu: not implemented for bool tensors")
    s = input._device.stack
    zero = 0.0 if input._dtype.is_floating_point else 0
    h = input._h
    if tracks_grad(s, h):
        # PyTorch's gradient is zero where x <= 0 (so at x == 0; a NaN passes it); maximum's would halve the tie
        d = s.detach(h)
        return _finish(input, s.where(s.binary("le", d, zero), s.binary("maximum", d, zero), h), inplace)
    return _finish(input, s.binary("maximum", h, zero), inplace)


def relu_(input: Tensor) -> Tensor:
    return relu(input, inplace=True)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """Clamp to [min_val, max_val]."""
    check_tensor(input, "hardtanh")
    if min_val > max_val:
        raise ValueRangeError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val ({max_val})")
    s = input._device.stack
    if not input._dtype.is_floating_point:
        return _hardtanh_int(input, min_val, max_val, inplace)
    lo, hi = float(min_val), float(max_val)
    if tracks_grad(s, input._h):
        # PyTorch zeroes the gradient where x <= min_val or x >= max_val (the bounds included; a NaN passes it)
        d = s.detach(input._h)
        outside = s.binary("logical_or", s.binary("le", d, lo), s.binary("ge", d, hi))
        val = s.binary("minimum", s.binary("maximum", d, lo), hi)
        return _finish(input, s.where(outside, val, input._h), inplace)
    h = s.binary("minimum", s.binary("maximum", input._h, lo), hi)
    return _finish(input, h, inplace)


def _hardtanh_int(input: Tensor, min_val: float, max_val: float, inplace: bool) -> Tensor:
    """torch's hardtanh of an integer tensor: a clamp in the input's dtype, the bounds truncated toward zero;
    bool input and negative bounds for an unsigned dtype are refused."""
    d = input._dtype
    if d.is_bool:
        raise DTypeError("hardtanh: Bool inputs not supported for hardtanh")
    if not d.is_signed and (min_val < 0 or max_val < 0):
        raise ValueRangeError(f"hardtanh: cannot do hardtanh on an unsigned type ({d.name}) with negative limits "
                              f"(min_val={min_val}, max_val={max_val})")
    s = input._device.stack
    lo, hi = dt.convert_scalar(min_val, d, "hardtanh"), dt.convert_scalar(max_val, d, "hardtanh")  # range-checked
    h = s.binary("minimum", s.binary("maximum", input._h, lo), hi)
    return _finish(input, h, inplace)


def hardtanh_(input: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    return hardtanh(input, min_val, max_val, inplace=True)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """min(max(x, 0), 6)."""
    check_float(input, "relu6")
    return hardtanh(input, 0.0, 6.0, inplace)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x); approximate='tanh' uses the tanh formula."""
    check_float(input, "gelu")
    s = input._device.stack
    h = input._h
    if approximate == "none":
        cdf = s.binary("add", s.binary("mul", s.unary("erf", s.binary("mul", h, 1.0 / math.sqrt(2.0))), 0.5), 0.5)
        return like(input, s.binary("mul", h, cdf))
    if approximate == "tanh":
        inner = s.binary("mul", s.binary("add", h, s.binary("mul", s.binary("mul", s.binary("mul", h, h), h),
                                                             0.044715)), math.sqrt(2.0 / math.pi))
        cdf = s.binary("mul", s.binary("add", s.unary("tanh", inner), 1.0), 0.5)
        return like(input, s.binary("mul", h, cdf))
    raise ValueRangeError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def sigmoid(input: Tensor) -> Tensor:
    check_float(input, "sigmoid")
    return like(input, input._device.stack.unary("sigmoid", input._h))


def tanh(input: Tensor) -> Tensor:
    check_float(input, "tanh")
    return like(input, input._device.stack.unary("tanh", input._h))


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """x * sigmoid(x)."""
    check_float(input, "silu")
    s = input._device.stack
    return _finish(input, s.binary("mul", input._h, s.unary("sigmoid", input._h)), inplace)


def _elu_h(s: Any, h: Any, alpha: float, scale: float = 1.0, input_scale: float = 1.0) -> Any:
    neg = s.binary("mul", s.unary("expm1", s.binary("mul", h, input_scale) if input_scale != 1.0 else h),
                   float(alpha))
    r = s.where(s.binary("gt", h, 0.0), h, neg)
    return s.binary("mul", r, float(scale)) if scale != 1.0 else r


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """x for x > 0, else alpha * (exp(x) - 1)."""
    check_float(input, "elu")
    return _finish(input, _elu_h(input._device.stack, input._h, alpha), inplace)


def elu_(input: Tensor, alpha: float = 1.0) -> Tensor:
    return elu(input, alpha, inplace=True)


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    """scale * elu(x, alpha) with the self-normalising constants."""
    check_float(input, "selu")
    return _finish(input, _elu_h(input._device.stack, input._h, _SELU_ALPHA, _SELU_SCALE), inplace)


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    check_float(input, "celu")
    if alpha == 0:
        raise ValueRangeError("celu: alpha must not be 0 (ZeroDivisionError in the formula)")
    return _finish(input, _elu_h(input._device.stack, input._h, alpha, 1.0, 1.0 / alpha), inplace)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """x for x > 0, else negative_slope * x."""
    check_float(input, "leaky_relu")
    s = input._device.stack
    h = input._h
    return _finish(input, s.where(s.binary("gt", h, 0.0), h, s.binary("mul", h, float(negative_slope))), inplace)


def leaky_relu_(input: Tensor, negative_slope: float = 0.01) -> Tensor:
    return leaky_relu(input, negative_slope, inplace=True)


def _softplus_h(s: Any, h: Any, beta: float, threshold: float) -> Any:
    bx = s.binary("mul", h, float(beta)) if beta != 1 else h
    # log1p(exp(bx)) written stably: max(bx, 0) + log1p(exp(-|bx|))
    sp = s.binary("add", s.binary("maximum", bx, 0.0), s.unary("log1p", s.unary("exp", s.unary("neg",
                                                                                            s.unary("abs", bx)))))
    if beta != 1:
        sp = s.binary("div", sp, float(beta))
    return s.where(s.binary("gt", bx, float(threshold)), h, sp)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta * x)) / beta, linear where beta * x > threshold."""
    check_float(input, "softplus")
    if beta == 0:
        raise ValueRangeError("softplus: beta must not be 0")
    return like(input, _softplus_h(input._device.stack, input._h, beta, threshold))


def softsign(input: Tensor) -> Tensor:
    """``x / (1 + |x|)``."""
    check_float(input, "softsign")
    s = input._device.stack
    return like(input, s.binary("div", input._h, s.binary("add", s.unary("abs", input._h), 1.0)))


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    """x * tanh(softplus(x))."""
    check_float(input, "mish")
    s = input._device.stack
    return _finish(input, s.binary("mul", input._h, s.unary("tanh", _softplus_h(s, input._h, 1.0, 20.0))), inplace)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """relu6(x + 3) / 6."""
    check_float(input, "hardsigmoid")
    s = input._device.stack
    r = s.binary("minimum", s.binary("maximum", s.binary("add", input._h, 3.0), 0.0), 6.0)
    return _finish(input, s.binary("div", r, 6.0), inplace)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """x * relu6(x + 3) / 6."""
    check_float(input, "hardswish")
    s = input._device.stack
    r = s.binary("minimum", s.binary("maximum", s.binary("add", input._h, 3.0), 0.0), 6.0)
    return _finish(input, s.binary("div", s.binary("mul", input._h, r), 6.0), inplace)


def logsigmoid(input: Tensor) -> Tensor:
    """``log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|))``, stable for large ``|x|``."""
    check_float(input, "logsigmoid")
    s = input._device.stack
    h = input._h
    return like(input, s.binary("sub", s.binary("minimum", h, 0.0),
                                s.unary("log1p", s.unary("exp", s.unary("neg", s.unary("abs", h))))))


def tanhshrink(input: Tensor) -> Tensor:
    """x - tanh(x)."""
    check_float(input, "tanhshrink")
    s = input._device.stack
    return like(input, s.binary("sub", input._h, s.unary("tanh", input._h)))


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x`` where ``|x| > lambd``, else 0."""
    check_float(input, "hardshrink")
    s = input._device.stack
    h = input._h
    return like(input, s.where(s.binary("gt", s.unary("abs", h), float(lambd)), h, s.binary("mul", h, 0.0)))


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """x - lambd for x > lambd, x + lambd for x < -lambd, else 0."""
    check_float(input, "softshrink")
    if lambd < 0:
        raise ValueRangeError(f"softshrink: lambda must be greater or equal to 0, but found to be {lambd}")
    s = input._device.stack
    h = input._h
    shrunk = s.binary("sub", h, s.binary("mul", s.unary("sign", h), float(lambd)))
    return like(input, s.where(s.binary("gt", s.unary("abs", h), float(lambd)), shrunk, s.binary("mul", h, 0.0)))


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """x where x > threshold, else value."""
    check_tensor(input, "threshold")
    s = input._device.stack
    h = input._h
    zero = 0.0 if input._dtype.is_floating_point else 0
    fill = s.binary("add", s.binary("mul", h, zero), value)
    return _finish(input, s.where(s.binary("gt", h, threshold), h, fill), inplace)


def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """x for x > 0, else weight * x; weight has 1 or C (= input.shape[1]) elements."""
    check_float(input, "prelu")
    check_tensor(weight, "prelu", "weight")
    if weight._dtype is not input._dtype:
        raise DTypeError(f"prelu: weight dtype {weight._dtype.name} differs from input dtype {input._dtype.name}")
    n = weight.numel()
    c = input.shape[1] if input.ndim >= 2 else 1
    if weight.ndim > 1 or n not in (1, c):
        raise ShapeError(f"prelu: weight must have 1 or {c} (input.shape[1]) elements, got shape {weight.shape} "
                         f"for input shape {input.shape}")
    s = input._device.stack
    # weight lines up with dim 1 (channels); a single weight broadcasts everywhere
    view = (n,) + (1,) * (input.ndim - 2) if n > 1 else (1,) * input.ndim
    w = s.reshape(weight._h, view)
    h = input._h
    return like(input, s.where(s.binary("gt", h, 0.0), h, s.binary("mul", h, w)))


def _softmax_dim(op: str, ndim: int, dim: Any) -> int:
    if dim is None:
        # torch's legacy implicit choice (with a deprecation warning there)
        import warnings

        warnings.warn(f"{op}: implicit dimension choice is deprecated; pass dim=", UserWarning, stacklevel=3)
        dim = 0 if ndim in (0, 1, 3) else 1
    return norm_dim(dim, ndim, op)


def _softmax_input(op: str, input: Tensor, dtype: Any) -> tuple[Any, DType]:
    check_tensor(input, op)
    s = input._device.stack
    if dtype is not None:
        d = as_dtype(dtype)
        if not d.is_floating_point:
            raise DTypeError(f"{op}: dtype must be a floating point dtype, got {d.name}")
        return (input._h if input._dtype is d else s.cast(input._h, d)), d
    if not input._dtype.is_floating_point and input.numel():  # torch returns an empty input as is, any dtype
        raise DTypeError(f"{op}: not implemented for dtype {input._dtype.name} (pass dtype= or a float tensor)")
    return input._h, input._dtype


def _softmax_0d(s: Any, h: Any, log: bool) -> Any:
    """(log-)softmax of a 0-d handle as that of a 1-element vector, so its value (NaN for a non-finite input) and
    its gradient (g - exp(y) * g: NaN there too) are torch's."""
    return s.reshape(s.softmax(s.reshape(h, (1,)), 0, log), ())


def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """exp(x) / sum(exp(x)) along dim; dtype casts the input first."""
    h, d = _softmax_input("softmax", input, dtype)
    dim = _softmax_dim("softmax", input.ndim, dim)
    s = input._device.stack
    if input.ndim == 0:
        return Tensor._make(_softmax_0d(s, h, False), d, input._device)
    if 0 in input.shape:  # nothing to normalise; backends need not reduce an empty dim (PyTorch: empty result)
        return Tensor._make(keep_graph(s, s.full(input.shape, 0.0, d), h), d, input._device)
    return Tensor._make(s.softmax(h, dim, False), d, input._device)


def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """log(softmax(x)) computed stably."""
    h, d = _softmax_input("log_softmax", input, dtype)
    dim = _softmax_dim("log_softmax", input.ndim, dim)
    s = input._device.stack
    if input.ndim == 0:
        return Tensor._make(_softmax_0d(s, h, True), d, input._device)
    if 0 in input.shape:  # nothing to normalise; backends need not reduce an empty dim (PyTorch: empty result)
        return Tensor._make(keep_graph(s, s.full(input.shape, 0.0, d), h), d, input._device)
    return Tensor._make(s.softmax(h, dim, True), d, input._device)


def softmin(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """softmax(-x)."""
    h, d = _softmax_input("softmin", input, dtype)
    dim = _softmax_dim("softmin", input.ndim, dim)
    s = input._device.stack
    if input.ndim == 0:
        return Tensor._make(_softmax_0d(s, s.unary("neg", h), False), d, input._device)
    if 0 in input.shape:  # nothing to normalise; backends need not reduce an empty dim (PyTorch: empty result)
        return Tensor._make(keep_graph(s, s.full(input.shape, 0.0, d), h), d, input._device)
    return Tensor._make(s.softmax(s.unary("neg", h), dim, False), d, input._device)


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
    s = input._device.stack
    pre = (slice(None),) * d
    a = s.getitem(input._h, pre + (slice(0, n // 2),))
    b = s.getitem(input._h, pre + (slice(n // 2, n),))
    return like(input, s.binary("mul", a, s.unary("sigmoid", b)))


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out: Any = None) -> Tensor:
    """x / max(||x||_p, eps) along dim."""
    check_float(input, "normalize")
    if out is not None:
        raise ValueRangeError("normalize: out= is not supported; assign the result instead")
    s = input._device.stack
    if input.ndim == 0:
        norm_dim(dim, 0, "normalize")
        dims: tuple[int, ...] = ()
        nrm = s.unary("abs", input._h)
    else:
        dims = (norm_dim(dim, input.ndim, "normalize"),)
        nrm = vector_norm(s, input._h, float(p), dims, True)
    den = s.binary("maximum", nrm, float(eps))
    return like(input, s.binary("div", input._h, den))


__all__ = [
    "relu", "relu_", "relu6", "hardtanh", "hardtanh_", "gelu", "sigmoid", "tanh", "silu", "elu", "elu_", "selu",
    "celu", "leaky_relu", "leaky_relu_", "softplus", "softsign", "mish", "hardsigmoid", "hardswish", "logsigmoid",
    "tanhshrink", "hardshrink", "softshrink", "threshold", "prelu", "softmax", "log_softmax", "softmin", "glu",
    "normalize",
]
