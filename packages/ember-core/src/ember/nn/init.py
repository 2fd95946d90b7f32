"""``ember.nn.init``: in-place parameter initialisation with PyTorch's names, arguments and formulas.

Every function fills its tensor in place under ``no_grad`` and returns it, through ember ops only (the Tensor
random fills of :mod:`ember.ops.random`, ``copy_``, ``fill_``): no device stack is called here. Random draws come
from ``generator=`` (an :class:`ember.Generator` of the tensor's device) when given, else from the tensor's own
device random stream (``tensor.device.seed(n)`` reproduces them); the distributions match PyTorch's, the
individual samples cannot (a different generator).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from ..autograd import no_grad
from ..dtypes import DType, float32
from ..errors import DTypeError, ShapeError, ValueRangeError
from ..ops.creation import eye, rand, randn
from ..ops.creation import tensor as _as_tensor
from ..tensor import Tensor

_LINEAR_FNS = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


def _check(tensor: Any, op: str, floating: bool = True) -> Tensor:
    if not isinstance(tensor, Tensor):
        raise DTypeError(f"nn.init.{op}: expected a Tensor, got {type(tensor).__name__}")
    if floating and not tensor._dtype.is_floating_point:
        raise DTypeError(f"nn.init.{op}: expected a floating point tensor, got dtype {tensor._dtype.name}")
    return tensor


def _work_dtype(tensor: Tensor) -> DType:
    """Half-precision tensors are drawn and computed in float32 and rounded once when stored."""
    return float32 if tensor._dtype.itemsize < 4 else tensor._dtype


def _write(tensor: Tensor, values: Tensor) -> Tensor:
    """Store values (of _work_dtype(tensor), tensor's shape) into tensor in place, outside the gradient graph;
    copy_ rounds half precision once."""
    with no_grad():
        tensor.copy_(values)
    return tensor


def _draw(tensor: Tensor, fn: Any, generator: Any = None) -> Tensor:
    """Uniform [0, 1) (fn=rand) or standard normal (fn=randn) samples shaped like tensor, in its work dtype, from
    ``generator`` (an :class:`ember.Generator` of the tensor's device) or else the device's stream."""
    with no_grad():
        return fn(tensor.shape, generator=generator, dtype=_work_dtype(tensor), device=tensor._device)


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (PyTorch's table: relu sqrt(2), tanh 5/3, selu 3/4, ...)."""
    if nonlinearity in _LINEAR_FNS or nonlinearity == "sigmoid":
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = float(param)
        else:
            raise ValueRangeError(f"nn.init.calculate_gain: negative_slope {param!r} is not a valid number")
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueRangeError(f"nn.init.calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight (out, in, *kernel): in * prod(kernel) and out * prod(kernel)."""
    _check(tensor, "_calculate_fan_in_and_fan_out", floating=False)
    if tensor.ndim < 2:
        raise ShapeError("nn.init: fan in and fan out can not be computed for tensor with fewer than 2 dimensions, "
                         f"got shape {tensor.shape}")
    receptive = 1
    for v in tensor.shape[2:]:
        receptive *= v
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    mode = mode.lower() if isinstance(mode, str) else mode
    if mode not in ("fan_in", "fan_out"):
        raise ValueRangeError(f"nn.init: mode {mode!r} not supported, please use one of 'fan_in', 'fan_out'")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Tensor:
    """Fill with samples from U(a, b)."""
    _check(tensor, "uniform_")
    if not a <= b:
        raise ValueRangeError(f"nn.init.uniform_: expected a <= b, got a={a}, b={b}")
    with no_grad():
        return tensor.uniform_(float(a), float(b), generator=generator)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Tensor:
    """Fill with samples from N(mean, std^2)."""
    _check(tensor, "normal_")
    if not std >= 0:
        raise ValueRangeError(f"nn.init.normal_: expected std >= 0, got {std}")
    with no_grad():
        return tensor.normal_(float(mean), float(std), generator=generator)


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator: Any = None) -> Tensor:
    """Fill with N(mean, std^2) truncated to [a, b] (inverse-CDF sampling, as PyTorch)."""
    _check(tensor, "trunc_normal_")
    if not a < b:
        raise ValueRangeError(f"nn.init.trunc_normal_: expected a < b, got a={a}, b={b}")
    if not std > 0:
        raise ValueRangeError(f"nn.init.trunc_normal_: expected std > 0, got {std}")
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("nn.init.trunc_normal_: mean is more than 2 std from [a, b]; the distribution of values may "
                      "be incorrect", stacklevel=2)

    def cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    lo, hi = cdf((a - mean) / std), cdf((b - mean) / std)
    with no_grad():
        u = _draw(tensor, rand, generator) * (2 * hi - 2 * lo) + (2 * lo - 1)
        v = (u.erfinv() * (std * math.sqrt(2.0)) + float(mean)).clamp(float(a), float(b))
    return _write(tensor, v)


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill with val."""
    _check(tensor, "constant_", floating=False)
    with no_grad():
        return tensor.fill_(val)


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1)


def zeros_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 0)


def eye_(tensor: Tensor) -> Tensor:
    """Fill a 2-D tensor with the identity matrix (ones on the main diagonal of a rectangular matrix)."""
    _check(tensor, "eye_", floating=False)
    if tensor.ndim != 2:
        raise ShapeError(f"nn.init.eye_: only tensors with 2 dimensions are supported, got shape {tensor.shape}")
    return _write(tensor, eye(*tensor.shape, dtype=tensor._dtype, device=tensor._device))


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
    """Fill a 3/4/5-D conv weight with the Dirac delta (identity convolution, per group)."""
    _check(tensor, "dirac_", floating=False)
    if tensor.ndim not in (3, 4, 5):
        raise ShapeError(f"nn.init.dirac_: only tensors with 3, 4, or 5 dimensions are supported, got shape "
                         f"{tensor.shape}")
    if not isinstance(groups, int) or groups < 1 or tensor.shape[0] % groups:
        raise ValueRangeError(f"nn.init.dirac_: dim 0 ({tensor.shape[0]}) must be divisible by groups ({groups})")
    out_per = tensor.shape[0] // groups
    a = np.zeros(tensor.shape, dtype=tensor._dtype.numpy)
    centre = tuple(k // 2 for k in tensor.shape[2:])
    for g in range(groups):
        for d in range(min(out_per, tensor.shape[1])):
            a[(g * out_per + d, d) + centre] = 1
    return _write(tensor, _as_tensor(a, dtype=tensor._dtype, device=tensor._device))


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010)."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(_check(tensor, "xavier_uniform_"))
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(_check(tensor, "xavier_normal_"))
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def _kaiming_std(tensor: Tensor, op: str, a: float, mode: str, nonlinearity: str) -> float | None:
    _check(tensor, op)
    if 0 in tensor.shape:
        warnings.warn(f"nn.init.{op}: initializing zero-element tensors is a no-op", stacklevel=3)
        return None
    fan = _calculate_correct_fan(tensor, mode)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator: Any = None) -> Tensor:
    """U(-b, b) with b = gain * sqrt(3 / fan) (He et al., 2015)."""
    std = _kaiming_std(tensor, "kaiming_uniform_", a, mode, nonlinearity)
    if std is None:
        return tensor
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator: Any = None) -> Tensor:
    """N(0, std^2) with std = gain / sqrt(fan)."""
    std = _kaiming_std(tensor, "kaiming_normal_", a, mode, nonlinearity)
    if std is None:
        return tensor
    return normal_(tensor, 0.0, std, generator)


def orthogonal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """A (semi-)orthogonal matrix from the QR decomposition of a normal draw (Saxe et al., 2013); trailing dims
    are flattened. The QR runs on the host: initialisation is not a hot path."""
    _check(tensor, "orthogonal_")
    if tensor.ndim < 2:
        raise ShapeError(f"nn.init.orthogonal_: only tensors with 2 or more dimensions are supported, got shape "
                         f"{tensor.shape}")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    draw = np.asarray(_draw(tensor, randn, generator).numpy(), dtype=np.float64).reshape(rows, cols)
    if rows < cols:
        draw = draw.T
    q, r = np.linalg.qr(draw)
    q = q * np.sign(np.diag(r))  # makes the decomposition unique, so q is uniform over orthogonal matrices
    if rows < cols:
        q = q.T
    q = np.ascontiguousarray((q * gain).reshape(tensor.shape).astype(_work_dtype(tensor).numpy))
    return _write(tensor, _as_tensor(q, dtype=_work_dtype(tensor), device=tensor._device))


# PyTorch's deprecated non-underscore aliases are not provided: they warn in torch and are rarely used.
__all__ = [
    "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
]
