"""Private building blocks of the sequence layers: a linear map, a layer norm and a dropout with PyTorch's
parameter names (so state_dict keys match torch's ``Linear``/``LayerNorm``), initialisers and mask helpers.

They are private so the sequence layers stay independent of the public basic layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ... import dtypes as dt
from ...autograd import no_grad
from ...errors import DTypeError, ShapeError, ValueRangeError
from ...tensor import Tensor
from .. import functional as F
from ..module import Parameter


def _rand(shape: tuple[int, ...], device: Any, dtype: Any) -> Tensor:
    from ...ops.creation import rand

    return rand(*shape, dtype=dtype, device=device)


def uniform_param(shape: tuple[int, ...], bound: float, device: Any = None, dtype: Any = None) -> Parameter:
    """A parameter drawn from U(-bound, bound)."""
    with no_grad():
        t = (_rand(shape, device, dtype) * 2.0 - 1.0) * bound
    return Parameter(t)


def normal_param(shape: tuple[int, ...], std: float, device: Any = None, dtype: Any = None) -> Parameter:
    """A parameter drawn from N(0, std^2)."""
    from ...ops.creation import randn

    with no_grad():
        t = randn(*shape, dtype=dtype, device=device) * std
    return Parameter(t)


def const_param(shape: tuple[int, ...], value: float, device: Any = None, dtype: Any = None) -> Parameter:
    from ...ops.creation import full

    return Parameter(full(shape, value, dtype=dtype, device=device))


def xavier_uniform_bound(fan_out: int, fan_in: int) -> float:
    """Bound of torch's xavier_uniform_ (gain 1) for a (fan_out, fan_in) matrix."""
    return math.sqrt(6.0 / float(fan_in + fan_out)) if fan_in + fan_out else 0.0


def check_positive_int(cls: str, name: str, value: Any, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DTypeError(f"{cls}: {name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueRangeError(f"{cls}: {name} must be {'non-negative' if allow_zero else 'positive'}, got {value}")
    return value


def check_prob(cls: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DTypeError(f"{cls}: {name} must be a number in [0, 1], got {type(value).__name__} ({value!r})")
    if not 0.0 <= value <= 1.0:
        raise ValueRangeError(f"{cls}: {name} must be in [0, 1] (a probability), got {value}")
    return float(value)


def check_input(cls: str, name: str, t: Any) -> Tensor:
    if not isinstance(t, Tensor):
        raise DTypeError(f"{cls}: expected {name} to be a Tensor, got {type(t).__name__}")
    if not t._dtype.is_floating_point:
        raise DTypeError(f"{cls}: expected {name} to be a floating-point tensor, got dtype {t._dtype.name}")
    return t


def get_activation(cls: str, activation: Any) -> Callable[[Tensor], Tensor]:
    """torch's ``_get_activation_fn``: "relu", "gelu" or any callable (a Module is kept and registered)."""
    if isinstance(activation, str):
        if activation == "relu":
            return F.relu
        if activation == "gelu":
            return F.gelu
        raise ValueRangeError(f"{cls}: activation should be 'relu' or 'gelu' (or a callable), not {activation!r}")
    if callable(activation):
        return activation
    raise DTypeError(f"{cls}: activation must be 'relu', 'gelu' or a callable, got {type(activation).__name__}")


def float_mask(cls: str, name: str, mask: Tensor | None, like: Tensor) -> Tensor | None:
    """torch's ``_canonical_mask``: a bool mask (True = masked out) becomes an additive float mask of ``like``'s
    dtype (-inf where True); a float mask is used as given (cast to ``like``'s dtype)."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise DTypeError(f"{cls}: expected {name} to be a Tensor or None, got {type(mask).__name__}")
    d = like._dtype
    if mask._dtype is dt.bool_:
        from ...ops.creation import zeros

        return zeros(mask.shape, dtype=d, device=like._device).masked_fill(mask, float("-inf"))
    if not mask._dtype.is_floating_point:
        raise DTypeError(f"{cls}: only bool and floating types of {name} are supported, got {mask._dtype.name}")
    return mask if mask._dtype is d else mask.to(d)


def causal_mask(size_l: int, size_s: int, like: Tensor) -> Tensor:
    """Additive float mask that hides keys after each query (top-left aligned lower triangle, as torch)."""
    from ...ops.creation import arange, zeros

    r = arange(size_l, device=like._device).reshape(size_l, 1)
    c = arange(size_s, device=like._device).reshape(1, size_s)
    return zeros((size_l, size_s), dtype=like._dtype, device=like._device).masked_fill(c > r, float("-inf"))


def expect_shape(cls: str, name: str, t: Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ShapeError(f"{cls}: expected {name} of shape {tuple(shape)}, got {tuple(t.shape)}")
