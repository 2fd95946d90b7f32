"""FlexBackend: the ember contract on numpy (and its BLAS).

Handles are ``numpy.ndarray`` objects (never numpy scalars, so in-place ops and views keep working). Hot
methods call numpy directly; convolution, pooling and interpolation come from :mod:`ember_flex.nn_kernels`
(im2col + BLAS); erf/erfc/erfinv are plain numpy (scipy.special when installed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.backend import Backend
from ember.dtypes import DType

from . import nn_kernels

ndarray = np.ndarray
_asarray = np.asarray


def _rsqrt(x: ndarray) -> ndarray:
    r = _asarray(np.sqrt(x))  # a 0-d input gives a numpy scalar, which cannot be an out= target
    np.reciprocal(r, out=r)
    return r


def _sigmoid(x: ndarray) -> ndarray:
    # stable for large |x|: exp of a non-positive number only
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


# erf, erfc and erfinv in plain numpy (flex does not depend on scipy): a Chebyshev fit of erfc (Numerical
# Recipes, 3rd ed., 6.2.2) with a Taylor series near 0, and Giles' erfinv start refined by Newton steps.
_ERFC_COF = np.array([
    -1.3026537197817094, 6.4196979235649026e-1, 1.9476473204185836e-2, -9.561514786808631e-3,
    -9.46595344482036e-4, 3.66839497852761e-4, 4.2523324806907e-5, -2.0278578112534e-5, -1.624290004647e-6,
    1.303655835580e-6, 1.5626441722e-8, -8.5238095915e-8, 6.529054439e-9, 5.059343495e-9, -9.91364156e-10,
    -2.27365122e-10, 9.6467911e-11, 2.394038e-12, -6.886027e-12, 8.94487e-13, 3.13092e-13, -1.12708e-13,
    3.81e-16, 7.106e-15, -1.523e-15, -9.4e-17, 1.21e-16, -2.8e-17,
])


def _erfc_pos(z: ndarray) -> ndarray:
    t = 2.0 / (2.0 + z)
    ty = 4.0 * t - 2.0
    d = np.zeros_like(z)
    dd = np.zeros_like(z)
    for c in _ERFC_COF[:0:-1]:
        d, dd = ty * d - dd + c, d
    return t * np.exp(-z * z + 0.5 * (_ERFC_COF[0] + ty * d) - dd)


def _erf_small(x: ndarray) -> ndarray:
    x2 = x * x
    term = x.copy()
    total = x.copy()
    for n in range(1, 18):
        term = term * (-x2) / n
        total = total + term / (2 * n + 1)
    return total * (2.0 / np.sqrt(np.pi))


def erf64(x: Any) -> ndarray:
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    with np.errstate(all="ignore"):
        big = np.sign(x) * (1.0 - _erfc_pos(a))
        small = _erf_small(np.where(a < 0.5, x, 0.0))
    return np.where(a < 0.5, small, big)


def erfc64(x: Any) -> ndarray:
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        r = _erfc_pos(np.abs(x))
        return np.where(np.abs(x) < 0.5, 1.0 - erf64(x), np.where(x < 0, 2.0 - r, r))


def erfinv64(y: Any) -> ndarray:
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(all="ignore"):
        w = -np.log((1.0 - y) * (1.0 + y))
        wa = w - 2.5
        p = np.full_like(y, 2.81022636e-08)
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                  -0.00417768164, 0.246640727, 1.50140941):
            p = c + p * wa
        wb = np.sqrt(w) - 3.0
        q = np.full_like(y, -0.000200214257)
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                  0.00943887047, 1.00167406, 2.83297682):
            q = c + q * wb
        x = np.where(w < 5.0, p, q) * y
        # Newton steps take the float32-accurate start to float64 accuracy; near |y| = 1 they work on
        # log(erfc), which is almost linear there, so the residual neither cancels nor converges slowly
        a = np.abs(y)
        tail = a >= 0.5
        for _ in range(3):
            ax = np.abs(x)
            dens = 2.0 / np.sqrt(np.pi) * np.exp(-ax * ax)
            ec = erfc64(ax)
            step = np.where(tail, (np.log(ec) - np.log1p(-a)) * ec, a - erf64(ax)) / dens
            x = np.copysign(ax + step, y)
        x = np.where(np.abs(y) == 1.0, np.copysign(np.inf, y), x)
        return np.where(np.abs(y) > 1.0, np.nan, x)


_SPECIAL = {"erf": erf64, "erfc": erfc64, "erfinv": erfinv64}


def _special(name: str) -> Any:
    def f(x: ndarray) -> ndarray:
        try:  # scipy's kernels are faster where it happens to be installed
            import scipy.special as sp

            fn = getattr(sp, name)
        except ImportError:
            fn = _SPECIAL[name]
        if x.dtype != np.float64 and fn is _SPECIAL[name]:
            return fn(x.astype(np.float64)).astype(x.dtype)
        if x.dtype.itemsize < 4 or x.dtype.name == "bfloat16":
            return fn(x.astype(np.float32)).astype(x.dtype)
        return fn(x)

    return f


def _sign(x: ndarray) -> ndarray:
    r = np.sign(x)
    if x.dtype.kind in "fV":  # PyTorch: sign(NaN) is 0, numpy gives NaN
        r = np.where(np.isnan(r), 0, r).astype(x.dtype, copy=False)
    return r


def _round(x: ndarray) -> ndarray:
    return np.round(x)  # numpy rounds half to even, as PyTorch does


def _remainder(a: Any, b: Any) -> ndarray:
    return np.remainder(a, b)


def _floor_divide(a: Any, b: Any) -> ndarray:
    return np.floor_divide(a, b)


def _pow(a: Any, b: Any, out: ndarray | None = None) -> ndarray:
    if out is not None and out.dtype.kind in "iub":  # the fallback below must still see the original a
        np.copyto(out, _pow(a, b))
        return out
    try:
        r = np.power(a, b, out=out)
        if r.dtype.kind == "i" and getattr(a, "dtype", getattr(b, "dtype", None)) == np.bool_:
            r = r.astype(np.bool_)  # numpy computes bool ** bool in int8; the contract keeps the operands' dtype
        return r
    except ValueError:
        # numpy refuses integers to negative integer powers; PyTorch gives 1, -1 or 0 (truncated 1/a**|b|)
        neg = b < 0
        r = np.power(a, np.where(neg, 0, b))
        ones = np.where(np.asarray(b) % 2 == 0, 1, np.where(np.asarray(a) == -1, -1, 1))
        alt = np.where(np.abs(a) == 1, ones, 0)
        return np.where(neg, alt, r).astype(r.dtype, copy=False)


_UNARY = {
    "neg": np.negative,
    "abs": np.abs,
    "sign": _sign,
    "exp": np.exp,
    "exp2": np.exp2,
    "expm1": np.expm1,
    "log": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "rsqrt": _rsqrt,
    "reciprocal": np.reciprocal,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "erf": _special("erf"),
    "erfc": _special("erfc"),
    "erfinv": _special("erfinv"),
    "floor": np.floor,
    "ceil": np.ceil,
    "round": _round,
    "trunc": np.trunc,
    "sigmoid": _sigmoid,
    "isnan": np.isnan,
    "isinf": np.isinf,
    "isfinite": np.isfinite,
    "isposinf": np.isposinf,
    "isneginf": np.isneginf,
    "logical_not": np.logical_not,
    "bitwise_not": np.invert,
    "signbit": np.signbit,
}

_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "floor_divide": _floor_divide,
    "remainder": _remainder,
    "fmod": np.fmod,
    "pow": _pow,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "fmax": np.fmax,
    "fmin": np.fmin,
    "atan2": np.arctan2,
    "copysign": np.copysign,
    "hypot": np.hypot,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "bitwise_left_shift": np.left_shift,
    "bitwise_right_shift": np.right_shift,
}

_INPLACE_OK = frozenset(
    "add sub mul div maximum minimum fmax fmin pow fmod atan2 copysign hypot bitwise_and bitwise_or bitwise_xor "
    "bitwise_left_shift bitwise_right_shift".split()
)

_QUIET = frozenset(
    "add mul maximum minimum fmax fmin eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and "
    "bitwise_or bitwise_xor copysign".split()
)

_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


class FlexBackend(Backend):
    """numpy on the host CPU."""

    name = "flex"
    contract_version = 1

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        self._rng = np.random.Generator(np.random.PCG64(0))
        self._unary = _UNARY
        self._binary = _BINARY

    def describe(self) -> str:
        import platform

        return f"flex:{self.index} (numpy {np.__version__} on {platform.machine() or 'cpu'})"

    def memory_report(self) -> dict[str, Any]:
        return {"allocator": "numpy (host malloc)", "in_use": None, "reserved": None, "peak": None}

    # -- data --------------------------------------------------------------------------------------------------
    def from_numpy(self, array: ndarray) -> ndarray:
        return array

    def from_dlpack(self, obj: Any) -> ndarray:
        return np.from_dlpack(obj)

    def to_numpy(self, h: ndarray) -> ndarray:
        return h

    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> ndarray:
        return np.full(shape, value, dtype=dtype.numpy)

    def arange(self, start: Any, stop: Any, step: Any, dtype: DType) -> ndarray:
        return np.arange(start, stop, step, dtype=dtype.numpy)

    def cast(self, h: ndarray, dtype: DType) -> ndarray:
        npdt = dtype.numpy
        if h.dtype.kind == "f" and npdt.kind in "iu":
            with np.errstate(invalid="ignore"):
                return np.trunc(h).astype(npdt)
        return h.astype(npdt)

    def copy(self, h: ndarray) -> ndarray:
        return np.array(h, copy=True, order="C")

    def contiguous(self, h: ndarray) -> ndarray:
        return np.require(h, requirements="C")

    def assign(self, dst: ndarray, src: Any) -> None:
        np.copyto(dst, src, casting="unsafe")

    # -- compute -------------------------------------------------------------------------------------------------
    def unary(self, op: str, h: ndarray) -> ndarray:
        with np.errstate(all="ignore"):
            r = self._unary[op](h)
        return r if type(r) is ndarray else _asarray(r)

    def binary(self, op: str, a: Any, b: Any) -> ndarray:
        # np.errstate costs ~1.5 us, more than the op itself on small arrays: only ops that raise floating
        # point warnings on ordinary inputs (division by zero, log of 0 ...) pay for it
        if op in _QUIET:
            r = self._binary[op](a, b)
        else:
            with np.errstate(all="ignore"):
                r = self._binary[op](a, b)
        if type(r) is not ndarray:
            r = _asarray(r)
        if type(b) is not ndarray or type(a) is not ndarray:
            # a Python scalar operand: ml_dtypes' bfloat16 widens to float32 where numpy's own dtypes do not
            h = a if type(a) is ndarray else b
            if r.dtype != h.dtype and r.dtype != np.bool_:
                r = r.astype(h.dtype)
        return r

    def inplace_binary(self, op: str, a: ndarray, b: Any) -> None:
        if op in _INPLACE_OK:
            with np.errstate(all="ignore"):
                self._binary[op](a, b, out=a)
        else:
            self.assign(a, self.binary(op, a, b))

    def where(self, cond: ndarray, a: Any, b: Any) -> ndarray:
        r = np.where(cond, a, b)
        if type(a) is ndarray and r.dtype != a.dtype:
            r = r.astype(a.dtype)
        elif type(b) is ndarray and r.dtype != b.dtype and type(a) is not ndarray:
            r = r.astype(b.dtype)
        return r

    def reduce(self, op: str, h: ndarray, dims: tuple[int, ...], keepdim: bool) -> ndarray:
        with np.errstate(all="ignore"):
            r = _REDUCE[op](h, axis=dims, keepdims=keepdim)
        return r if type(r) is ndarray else _asarray(r)

    def argreduce(self, op: str, h: ndarray, dim: int | None, keepdim: bool) -> ndarray:
        f = np.argmax if op == "argmax" else np.argmin
        if h.dtype.kind == "f":
            nan = np.isnan(h)
            if nan.any():  # NaN is the extreme value in PyTorch
                r = np.argmax(nan, axis=dim, keepdims=keepdim)
                has = np.any(nan, axis=dim, keepdims=keepdim)
                return _asarray(np.where(has, r, f(h, axis=dim, keepdims=keepdim))).astype(np.int64)
        return _asarray(f(h, axis=dim, keepdims=keepdim)).astype(np.int64, copy=False)

    def cumulative(self, op: str, h: ndarray, dim: int) -> ndarray:
        f = np.cumsum if op == "sum" else np.cumprod
        with np.errstate(all="ignore"):
            return f(h, axis=dim, dtype=h.dtype)

    def matmul(self, a: ndarray, b: ndarray) -> ndarray:
        if a.dtype.kind in "biu" or a.dtype.itemsize < 4:
            if a.dtype.kind in "fV" or a.dtype.name == "bfloat16":  # half types: accumulate in float32
                return _asarray(np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype))
        r = np.matmul(a, b)
        return r if type(r) is ndarray else _asarray(r)

    def sort(self, h: ndarray, dim: int, descending: bool, stable: bool) -> tuple[ndarray, ndarray]:
        if descending:
            # stable descending with NaN first: stable-sort the reversed array, then reverse back
            n = h.shape[dim]
            idx = np.argsort(np.flip(h, dim), axis=dim, kind="stable")
            idx = (n - 1) - np.flip(idx, dim)
        else:
            idx = np.argsort(h, axis=dim, kind="stable")  # numpy puts NaN last, as PyTorch does
        return np.take_along_axis(h, idx, axis=dim), idx.astype(np.int64, copy=False)

    def topk(self, h: ndarray, k: int, dim: int, largest: bool, sorted_: bool) -> tuple[ndarray, ndarray]:
        v, i = self.sort(h, dim, largest, True)
        sl = (slice(None),) * dim + (slice(0, k),)
        return np.require(v[sl], requirements="C"), np.require(i[sl], requirements="C")

    # -- movement and indexing -------------------------------------------------------------------------------
    def reshape(self, h: ndarray, shape: tuple[int, ...]) -> ndarray:
        return h.reshape(shape)

    def permute(self, h: ndarray, dims: tuple[int, ...]) -> ndarray:
        return h.transpose(dims)

    def expand(self, h: ndarray, shape: tuple[int, ...]) -> ndarray:
        return np.broadcast_to(h, shape)

    def getitem(self, h: ndarray, key: tuple[Any, ...]) -> ndarray:
        r = h[key]
        return r if type(r) is ndarray else _asarray(r)

    def setitem(self, h: ndarray, key: tuple[Any, ...], value: Any) -> None:
        h[key] = value

    def cat(self, hs: Sequence[ndarray], dim: int) -> ndarray:
        return np.concatenate(hs, axis=dim)

    def flip(self, h: ndarray, dims: tuple[int, ...]) -> ndarray:
        return np.flip(h, dims).copy()

    def gather(self, h: ndarray, dim: int, index: ndarray) -> ndarray:
        if index.shape[:dim] + index.shape[dim + 1:] != h.shape[:dim] + h.shape[dim + 1:]:
            h = h[tuple(slice(0, n) if d != dim else slice(None) for d, n in enumerate(index.shape))]
        return np.take_along_axis(h, index, axis=dim)

    def scatter(self, h: ndarray, dim: int, index: ndarray, src: Any, reduce: str | None) -> ndarray:
        out = h.copy()
        if type(src) is ndarray:
            src = src[tuple(slice(0, n) for n in index.shape)]
        else:
            src = np.full(index.shape, src, dtype=h.dtype)
        key = self._grid(index, dim)
        if reduce is None:
            out[key] = src
        elif reduce == "add":
            np.add.at(out, key, src)
        else:
            np.multiply.at(out, key, src)
        return out

    @staticmethod
    def _grid(index: ndarray, dim: int) -> tuple[ndarray, ...]:
        grid = list(np.indices(index.shape, sparse=True))
        grid[dim] = index
        return tuple(grid)

    def index_select(self, h: ndarray, dim: int, index: ndarray) -> ndarray:
        return np.take(h, index, axis=dim)

    def masked_fill(self, h: ndarray, mask: ndarray, value: Any) -> ndarray:
        r = np.where(mask, value, h)
        return r.astype(h.dtype, copy=False)

    def tril(self, h: ndarray, diagonal: int, upper: bool) -> ndarray:
        return np.triu(h, diagonal) if upper else np.tril(h, diagonal)

    def einsum(self, equation: str, *hs: ndarray) -> ndarray:
        return _asarray(np.einsum(equation, *hs, optimize=len(hs) > 2))

    def softmax(self, h: ndarray, dim: int, log: bool) -> ndarray:
        m = np.max(h, axis=dim, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        z = h - m
        if log:
            with np.errstate(divide="ignore"):
                return z - np.log(np.sum(np.exp(z), axis=dim, keepdims=True))
        e = np.exp(z)
        e /= np.sum(e, axis=dim, keepdims=True)
        return e

    # -- neural-network kernels (im2col + BLAS; see nn_kernels) -------------------------------------------
    def conv(self, x: ndarray, w: ndarray, b: ndarray | None, stride: tuple[int, ...],
             padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> ndarray:
        return nn_kernels.conv(x, w, b, stride, padding, dilation, groups)

    def conv_transpose(self, x: ndarray, w: ndarray, b: ndarray | None, stride: tuple[int, ...],
                       padding: tuple[int, ...], output_padding: tuple[int, ...], dilation: tuple[int, ...],
                       groups: int) -> ndarray:
        return nn_kernels.conv_transpose(x, w, b, stride, padding, output_padding, dilation, groups)

    def max_pool(self, x: ndarray, kernel_size: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], dilation: tuple[int, ...], ceil_mode: bool,
                 return_indices: bool) -> Any:
        return nn_kernels.max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    def avg_pool(self, x: ndarray, kernel_size: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], ceil_mode: bool, count_include_pad: bool,
                 divisor_override: int | None) -> ndarray:
        return nn_kernels.avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)

    def adaptive_avg_pool(self, x: ndarray, output_size: tuple[int, ...]) -> ndarray:
        return nn_kernels.adaptive_avg_pool(x, output_size)

    def adaptive_max_pool(self, x: ndarray, output_size: tuple[int, ...], return_indices: bool) -> Any:
        return nn_kernels.adaptive_max_pool(x, output_size, return_indices)

    def interpolate(self, x: ndarray, size: tuple[int, ...], mode: str, align_corners: bool | None,
                    scales: tuple[float, ...] | None) -> ndarray:
        return nn_kernels.interpolate(x, size, mode, align_corners, scales)

    def pad(self, h: ndarray, pads: tuple[tuple[int, int], ...], mode: str, value: Any) -> ndarray:
        return nn_kernels.pad(h, pads, mode, 0 if value is None else value)

    # -- random numbers ----------------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def rand(self, shape: tuple[int, ...], dtype: DType) -> ndarray:
        if dtype in (dt.float32, dt.float64):
            return self._rng.random(shape, dtype=dtype.numpy)
        return self._rng.random(shape, dtype=np.float32).astype(dtype.numpy)

    def randn(self, shape: tuple[int, ...], dtype: DType) -> ndarray:
        if dtype in (dt.float32, dt.float64):
            return self._rng.standard_normal(shape, dtype=dtype.numpy)
        return self._rng.standard_normal(shape, dtype=np.float32).astype(dtype.numpy)

    def randint(self, low: int, high: int, shape: tuple[int, ...], dtype: DType) -> ndarray:
        # numpy draws integer dtypes only: bool and float results (torch allows both) are drawn as int64
        draw = dtype.numpy if dtype.is_integer else np.int64
        return self._rng.integers(low, high, size=shape, dtype=draw).astype(dtype.numpy, copy=False)
