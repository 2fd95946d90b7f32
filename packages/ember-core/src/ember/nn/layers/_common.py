"""Helpers every layer module shares: parameter/buffer allocation, the module label errors use, and input checks."""

from __future__ import annotations

from typing import Any

from ...errors import DTypeError, ValueRangeError
from ...ops.creation import empty
from ...tensor import Tensor
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
