"""ToyBackend: the required primitives of the ember backend contract, on numpy, and nothing else.

Handles are :class:`ToyArray` objects, not ndarrays: a backend's handle only has to expose ``.shape``. Every
primitive unwraps its handles, calls numpy, and wraps the result. Every method that is *not* here (gather,
scatter, softmax, conv, pooling, pad, ...) comes from the default compositions in :class:`ember.backend.Backend`,
so running the conformance kit against ``toy`` checks that those compositions only use the primitives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.backend import Backend
from ember.dtypes import DType


class ToyArray:
    """The toy backend's handle: an ndarray in a box that shows nothing but its shape."""

    __slots__ = ("a",)

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    @property
    def shape(self) -> tuple[int, ...]:
        return self.a.shape

    @property
    def strides(self) -> tuple[int, ...]:
        # optional: with byte strides, core's view() can tell a viewable reshape from one that must copy (and
        # raise, as PyTorch does); without them view() cannot detect the non-viewable case
        return self.a.strides

    def __repr__(self) -> str:
        return f"ToyArray(shape={self.a.shape}, dtype={self.a.dtype})"


def _wrap(x: Any) -> ToyArray:
    # numpy returns scalars for 0-d results; a handle is always an array (views and in-place writes keep working)
    return ToyArray(x if type(x) is np.ndarray else np.asarray(x))


def _unwrap(x: Any) -> Any:
    """The ndarray inside a handle; Python scalars pass through."""
    return x.a if isinstance(x, ToyArray) else x


def _unwrap_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    # index keys mix ints, slices, None, Ellipsis and int64/bool *handles*
    return tuple(k.a if isinstance(k, ToyArray) else k for k in key)


def _low_precision(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" and a.dtype.itemsize < 4 or a.dtype.name == "bfloat16"


def _via_float64(fn: Any) -> Any:
    """A scalar math function applied elementwise (no scipy here; the toy favours exactness over speed)."""
    ufunc = np.frompyfunc(fn, 1, 1)

    def f(x: np.ndarray) -> np.ndarray:
        return np.asarray(ufunc(x.astype(np.float64)), dtype=np.float64).astype(x.dtype)

    return f


def _erfinv(x: np.ndarray) -> np.ndarray:
    """Inverse error function: Giles' single-precision approximation refined by Newton steps on math.erf/erfc."""
    with np.errstate(all="ignore"):  # x = +-1 gives +-inf, |x| > 1 gives NaN, as in PyTorch
        v = x.astype(np.float64)
        a = np.abs(v)
        w = -np.log((1.0 - a) * (1.0 + a))
        lo = w - 2.5
        p_lo = 2.81022636e-08
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                  -0.00417768164, 0.246640727, 1.50140941):
            p_lo = c + p_lo * lo
        hi = np.sqrt(np.maximum(w, 0.0)) - 3.0
        p_hi = -0.000200214257
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613, 0.00943887047,
                  1.00167406, 2.83297682):
            p_hi = c + p_hi * hi
        z = np.where(w < 5.0, p_lo, p_hi) * a
        erf, erfc = np.frompyfunc(math.erf, 1, 1), np.frompyfunc(math.erfc, 1, 1)
        # near 1, erf(z) - a cancels and erfc is ~exp(-z*z): solve log(erfc(z)) = log(1 - a) there instead
        tail = a > 0.5
        ok = a < 1.0
        for _ in range(4):
            zz = np.where(ok, z, 0.0)
            slope = 2.0 / math.sqrt(math.pi) * np.exp(-zz * zz)
            c = np.asarray(erfc(zz), dtype=np.float64)
            step_tail = (np.log(c) - np.log1p(-a)) * c / slope
            step_head = (np.asarray(erf(zz), dtype=np.float64) - a) / slope
            z = np.where(ok, zz + np.where(tail, step_tail, -step_head), z)
        y = np.copysign(np.where(a == 1.0, np.inf, np.where(a > 1.0, np.nan, z)), v)
    return y.astype(x.dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # exp of a non-positive number only: no overflow
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return np.reciprocal(np.sqrt(x))


def _sign(x: np.ndarray) -> np.ndarray:
    r = np.sign(x)
    if x.dtype.kind == "f" or x.dtype.name == "bfloat16":  # PyTorch: sign(NaN) is 0, numpy gives NaN
        r = np.where(np.isnan(r), 0, r).astype(x.dtype, copy=False)
    return r


def _pow(a: Any, b: Any) -> np.ndarray:
    kinds = {x.dtype.kind for x in (a, b) if isinstance(x, np.ndarray)}
    if kinds == {"b"}:
        return np.asarray(np.power(a, b)).astype(np.bool_)  # numpy gives int8; the contract keeps the dtype
    if not kinds <= {"i", "u", "b"} or not np.any(np.asarray(b) < 0):
        return np.power(a, b)
    # numpy refuses integers to negative integer powers; PyTorch truncates 1 / a**|b|: 1, -1 (odd |b|) or 0
    neg = np.asarray(b) < 0
    r = np.asarray(np.power(a, np.where(neg, 0, b)))
    one_or_minus = np.where((np.asarray(b) % 2 != 0) & (np.asarray(a) == -1), -1, 1)
    return np.where(neg, np.where(np.abs(a) == 1, one_or_minus, 0), r).astype(r.dtype, copy=False)


_UNARY: dict[str, Any] = {
    "sinc": np.sinc,  # torch.sinc is numpy's normalized sinc
    "neg": np.negative, "abs": np.abs, "sign": _sign, "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1,
    "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": _rsqrt,
    "reciprocal": np.reciprocal, "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin,
    "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "erf": _via_float64(math.erf), "erfc": _via_float64(math.erfc),
    "erfinv": _erfinv, "floor": np.floor, "ceil": np.ceil, "round": np.round, "trunc": np.trunc,
    "sigmoid": _sigmoid, "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite, "isposinf": np.isposinf,
    "isneginf": np.isneginf, "logical_not": np.logical_not, "bitwise_not": np.invert, "signbit": np.signbit,
}

_BINARY: dict[str, Any] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "floor_divide": np.floor_divide,
    "remainder": np.remainder, "fmod": np.fmod, "pow": _pow, "maximum": np.maximum, "minimum": np.minimum,
    "fmax": np.fmax, "fmin": np.fmin, "atan2": np.arctan2, "copysign": np.copysign, "hypot": np.hypot,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_xor": np.logical_xor, "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor, "bitwise_left_shift": np.left_shift, "bitwise_right_shift": np.right_shift,
}

_REDUCE: dict[str, Any] = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


class ToyBackend(Backend):
    """numpy behind :class:`ToyArray` handles; required primitives only."""

    name = "toy"
    contract_version = 1

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        self._rng = np.random.Generator(np.random.PCG64(0))

    def describe(self) -> str:
        return f"toy:{self.index} (example backend, numpy {np.__version__})"

    # -- data --------------------------------------------------------------------------------------------------
    def from_numpy(self, array: np.ndarray) -> ToyArray:
        return ToyArray(np.array(array, copy=True))

    def to_numpy(self, h: ToyArray) -> np.ndarray:
        return h.a

    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> ToyArray:
        return ToyArray(np.full(shape, value, dtype=dtype.numpy))

    def arange(self, start: Any, stop: Any, step: Any, dtype: DType) -> ToyArray:
        return ToyArray(np.arange(start, stop, step, dtype=dtype.numpy))

    def cast(self, h: ToyArray, dtype: DType) -> ToyArray:
        a, target = h.a, dtype.numpy
        if a.dtype.kind == "f" and target.kind in "iu":
            with np.errstate(invalid="ignore"):  # float -> int truncates toward zero
                return ToyArray(np.trunc(a).astype(target))
        return ToyArray(a.astype(target))

    def dtype_of(self, h: ToyArray) -> DType:
        return dt.from_numpy_dtype(h.a.dtype)

    def copy(self, h: ToyArray) -> ToyArray:
        return ToyArray(np.array(h.a, copy=True, order="C"))

    def assign(self, dst: ToyArray, src: Any) -> None:
        np.copyto(dst.a, _unwrap(src), casting="unsafe")

    # -- compute -------------------------------------------------------------------------------------------------
    def unary(self, op: str, h: ToyArray) -> ToyArray:
        with np.errstate(all="ignore"):
            return _wrap(_UNARY[op](h.a))

    def binary(self, op: str, a: Any, b: Any) -> ToyArray:
        x, y = _unwrap(a), _unwrap(b)
        with np.errstate(all="ignore"):
            r = np.asarray(_BINARY[op](x, y))
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
            # a Python scalar operand must not change the handle's dtype (ml_dtypes' bfloat16 widens to float32,
            # bool ** True gives int8); comparisons are the exception: they return bool
            ref = x if isinstance(x, np.ndarray) else y
            if r.dtype != ref.dtype and r.dtype != np.bool_:
                r = r.astype(ref.dtype)
        return ToyArray(r)

    def where(self, cond: ToyArray, a: Any, b: Any) -> ToyArray:
        x, y = _unwrap(a), _unwrap(b)
        r = np.where(cond.a, x, y)
        # a Python scalar operand must not change the dtype of the handle operand
        ref = x if isinstance(x, np.ndarray) else y
        if isinstance(ref, np.ndarray) and r.dtype != ref.dtype:
            r = r.astype(ref.dtype)
        return _wrap(r)

    def reduce(self, op: str, h: ToyArray, dims: tuple[int, ...], keepdim: bool) -> ToyArray:
        with np.errstate(all="ignore"):
            return _wrap(_REDUCE[op](h.a, axis=dims, keepdims=keepdim))

    def argreduce(self, op: str, h: ToyArray, dim: int | None, keepdim: bool) -> ToyArray:
        a = h.a
        f = np.argmax if op == "argmax" else np.argmin
        r = np.asarray(f(a, axis=dim, keepdims=keepdim))
        if a.dtype.kind == "f":
            nan = np.isnan(a)  # NaN is the extreme value (PyTorch): the first NaN wins
            r = np.where(np.any(nan, axis=dim, keepdims=keepdim), np.argmax(nan, axis=dim, keepdims=keepdim), r)
        return _wrap(np.asarray(r).astype(np.int64))

    def cumulative(self, op: str, h: ToyArray, dim: int) -> ToyArray:
        f = np.cumsum if op == "sum" else np.cumprod
        return _wrap(f(h.a, axis=dim, dtype=h.a.dtype))

    def matmul(self, a: ToyArray, b: ToyArray) -> ToyArray:
        x, y = a.a, b.a
        if _low_precision(x):  # numpy has no half-precision BLAS: accumulate in float32
            return _wrap(np.asarray(np.matmul(x.astype(np.float32), y.astype(np.float32))).astype(x.dtype))
        return _wrap(np.matmul(x, y))

    def sort(self, h: ToyArray, dim: int, descending: bool, stable: bool) -> tuple[ToyArray, ToyArray]:
        a = h.a
        if descending:
            # stable and NaN first: stable-sort the reversed array ascending, then reverse back
            n = a.shape[dim]
            idx = (n - 1) - np.flip(np.argsort(np.flip(a, dim), axis=dim, kind="stable"), dim)
        else:
            idx = np.argsort(a, axis=dim, kind="stable")  # numpy sorts NaN last, as PyTorch does
        return _wrap(np.take_along_axis(a, idx, axis=dim)), _wrap(idx.astype(np.int64))

    # -- movement and indexing -------------------------------------------------------------------------------
    def reshape(self, h: ToyArray, shape: tuple[int, ...]) -> ToyArray:
        return ToyArray(h.a.reshape(shape))

    def permute(self, h: ToyArray, dims: tuple[int, ...]) -> ToyArray:
        return ToyArray(h.a.transpose(dims))

    def expand(self, h: ToyArray, shape: tuple[int, ...]) -> ToyArray:
        return ToyArray(np.broadcast_to(h.a, shape))

    def getitem(self, h: ToyArray, key: tuple[Any, ...]) -> ToyArray:
        return _wrap(h.a[_unwrap_key(key)])

    def setitem(self, h: ToyArray, key: tuple[Any, ...], value: Any) -> None:
        h.a[_unwrap_key(key)] = _unwrap(value)

    def cat(self, hs: Sequence[ToyArray], dim: int) -> ToyArray:
        return ToyArray(np.concatenate([h.a for h in hs], axis=dim))

    # -- random numbers ----------------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def rand(self, shape: tuple[int, ...], dtype: DType) -> ToyArray:
        if dtype in (dt.float32, dt.float64):
            return ToyArray(self._rng.random(shape, dtype=dtype.numpy))
        return ToyArray(self._rng.random(shape, dtype=np.float32).astype(dtype.numpy))

    def randn(self, shape: tuple[int, ...], dtype: DType) -> ToyArray:
        if dtype in (dt.float32, dt.float64):
            return ToyArray(self._rng.standard_normal(shape, dtype=dtype.numpy))
        return ToyArray(self._rng.standard_normal(shape, dtype=np.float32).astype(dtype.numpy))
