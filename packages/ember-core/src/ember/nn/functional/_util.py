"""Shared validation and handle-level helpers for ``ember.nn.functional``.

The functional ops compose on backend handles through ``x._device.stack`` (one attribute lookup, no Tensor
wrapping between steps) and wrap the final handle once; every check runs before the first backend call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...device import Device
from ...dtypes import DType
from ...errors import DeviceError, DTypeError, ShapeError, ValueRangeError
from ...tensor import Tensor

Handle = Any

REDUCTIONS = ("none", "mean", "sum")


def check_tensor(x: Any, op: str, name: str = "input") -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: argument '{name}' must be a Tensor, got {type(x).__name__}")
    return x


def check_float(x: Any, op: str, name: str = "input") -> Tensor:
    check_tensor(x, op, name)
    if not x._dtype.is_floating_point:
        raise DTypeError(f"{op}: expected a floating point tensor for '{name}', got dtype {x._dtype.name}")
    return x


def check_like(x: Tensor, other: Any, op: str, name: str, shape: tuple[int, ...] | None = None) -> Tensor:
    """other must be a Tensor on x's device with x's dtype (and the given shape when one is given)."""
    check_tensor(other, op, name)
    if other._device is not x._device:
        raise DeviceError(f"{op}: expected '{name}' on device {x._device}, got {other._device}")
    if other._dtype is not x._dtype:
        raise DTypeError(f"{op}: expected '{name}' to have dtype {x._dtype.name} like the input, got "
                         f"{other._dtype.name}")
    if shape is not None and other.shape != shape:
        raise ShapeError(f"{op}: expected '{name}' of shape {shape}, got shape {other.shape}")
    return other


def check_reduction(reduction: Any, op: str, extra: tuple[str, ...] = ()) -> str:
    if reduction not in REDUCTIONS + extra:
        allowed = ", ".join(repr(r) for r in REDUCTIONS + extra)
        raise ValueRangeError(f"{op}: reduction must be one of {allowed}, got {reduction!r}")
    return reduction


def int_tuple(v: Any, n: int, op: str, name: str, minimum: int | None = None) -> tuple[int, ...]:
    """An int or a sequence of n ints (a 1-sequence is repeated, as torch's _ntuple does) as an n-tuple."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        t = (int(v),) * n
    elif isinstance(v, (tuple, list)) and all(isinstance(e, (int, np.integer)) and not isinstance(e, bool)
                                              for e in v):
        t = tuple(int(e) for e in v)
        if len(t) == 1 and n > 1:
            t = t * n
        if len(t) != n:
            raise ValueRangeError(f"{op}: {name} must be an int or a sequence of {n} ints, got {tuple(v)}")
    else:
        raise ValueRangeError(f"{op}: {name} must be an int or a sequence of {n} ints, got {v!r}")
    if minimum is not None and any(e < minimum for e in t):
        what = "positive" if minimum == 1 else "non-negative"
        raise ValueRangeError(f"{op}: {name} must be {what}, got {t}")
    return t


def wrap(h: Handle, dtype: DType, dev: Device) -> Tensor:
    return Tensor._make(h, dtype, dev)


def like(x: Tensor, h: Handle) -> Tensor:
    """Wrap a handle with x's dtype and device."""
    return Tensor._make(h, x._dtype, x._device)


def prod(xs: Sequence[int]) -> int:
    p = 1
    for v in xs:
        p *= int(v)
    return p


def reshape(s: Any, h: Handle, shape: tuple[int, ...]) -> Handle:
    return h if tuple(h.shape) == tuple(shape) else s.reshape(h, tuple(shape))


def mean(s: Any, h: Handle, dims: tuple[int, ...], keepdim: bool) -> Handle:
    n = prod(h.shape[d] for d in dims)
    return s.binary("div", s.reduce("sum", h, dims, keepdim), float(n))


def var(s: Any, h: Handle, dims: tuple[int, ...], correction: int = 0) -> tuple[Handle, Handle]:
    """(mean, variance) over dims with keepdim; two-pass for accuracy."""
    m = mean(s, h, dims, True)
    c = s.binary("sub", h, m)
    n = prod(h.shape[d] for d in dims)
    v = s.binary("div", s.reduce("sum", s.binary("mul", c, c), dims, True), float(max(n - correction, 0)))
    return m, v


def reduce_loss(s: Any, h: Handle, reduction: str) -> Handle:
    """Apply 'none' / 'mean' / 'sum' to an elementwise loss handle."""
    if reduction == "none":
        return h
    dims = tuple(range(len(h.shape)))
    if reduction == "sum":
        return s.reduce("sum", h, dims, False) if dims else h
    n = prod(h.shape)
    if not dims:
        return h
    return s.binary("div", s.reduce("sum", h, dims, False), float(n) if n else float("nan"))


def float_of(s: Any, x: Tensor) -> Tensor:
    """x as the device's default float dtype when it is not floating already."""
    if x._dtype.is_floating_point:
        return x
    d = x._device.default_dtype
    return Tensor._make(s.cast(x._h, d), d, x._device)


def cast(s: Any, x: Tensor, d: DType) -> Handle:
    return x._h if x._dtype is d else s.cast(x._h, d)


def vector_norm(s: Any, h: Handle, p: float, dims: tuple[int, ...], keepdim: bool) -> Handle:
    """p-norm over dims (p may be inf, -inf, 0 or any real), as torch.linalg.vector_norm."""
    a = s.unary("abs", h)
    if p == 2:
        return s.unary("sqrt", s.reduce("sum", s.binary("mul", h, h), dims, keepdim))
    if p == 1:
        return s.reduce("sum", a, dims, keepdim)
    if p == float("inf"):
        return s.reduce("max", a, dims, keepdim)
    if p == float("-inf"):
        return s.reduce("min", a, dims, keepdim)
    if p == 0:
        nz = s.binary("ne", h, 0.0)
        return s.reduce("sum", s.where(nz, s.binary("add", s.binary("mul", a, 0.0), 1.0),
                                       s.binary("mul", a, 0.0)), dims, keepdim)
    return s.binary("pow", s.reduce("sum", s.binary("pow", a, float(p)), dims, keepdim), 1.0 / float(p))


def host_minmax(s: Any, h: Handle) -> tuple[int, int]:
    """min and max of a non-empty integer handle, as Python ints (one small device->host transfer)."""
    dims = tuple(range(len(h.shape)))
    lo = s.reduce("min", h, dims, False) if dims else h
    hi = s.reduce("max", h, dims, False) if dims else h
    return int(np.asarray(s.to_numpy(lo)).reshape(())), int(np.asarray(s.to_numpy(hi)).reshape(()))


def is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

