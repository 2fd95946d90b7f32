"""Shared argument validation for ``ember.nn.functional``.

The functional ops check their arguments here and in their own modules, then call one function of
:mod:`ember.ops.nn` (the nn layer of the Bridge), which alone talks to the device's stack; every check runs
before the first backend call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import DeviceError, DTypeError, ShapeError, ValueRangeError
from ...tensor import Tensor

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


def device_mismatch(op: str, name: str, expected: Tensor, got: Tensor) -> DeviceError:
    """The DeviceError for argument ``name`` on another device than the input's, saying how to fix it: a
    module's state (a weight, bias, running statistic) moves with ``model.to(device)``, anything else with
    ``.to(device)``; both name the device to move to."""
    want, have = expected._device, got._device
    if name.endswith(("weight", "bias")) or name.startswith("running_"):
        fix = (f"call model.to('{want}') on the module holding it (the inputs' device), or move the inputs with "
               f".to('{have}')")
    else:
        fix = f"move one with .to(device), e.g. {name}.to('{want}')"
    return DeviceError(f"{op}: expected '{name}' on device {want}, got {have}; {fix}")


def check_like(x: Tensor, other: Any, op: str, name: str, shape: tuple[int, ...] | None = None) -> Tensor:
    """other must be a Tensor on x's device with x's dtype (and the given shape when one is given)."""
    check_tensor(other, op, name)
    if other._device is not x._device:
        raise device_mismatch(op, name, x, other)
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


def prod(xs: Sequence[int]) -> int:
    p = 1
    for v in xs:
        p *= int(v)
    return p


def is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

