"""FlexBackend: the ember contract on numpy (and its BLAS).

Handles are ``numpy.ndarray`` objects (never numpy scalars, so in-place ops and views keep working). Hot
methods call numpy directly; convolution, pooling and interpolation come from :mod:`ember_flex.nn_kernels`
(im2col + BLAS); erf/erfc/erfinv from scipy.special.

numpy reports IEEE conditions (``inf - inf``, ``0 / 0``, overflow) as RuntimeWarnings; PyTorch stays silent and
so does flex, through a warnings filter scoped to this package. That costs nothing per op, where
``np.errstate`` would cost ~1.5 us per call -- more than a small op itself.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.backend import Backend
from ember.dtypes import DType
from ember.errors import OutOfMemoryError

from . import host_memory, nn_kernels, random_kernels
from . import threads as _par

ndarray = np.ndarray
_asarray = np.asarray

warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"ember_flex(\.|$)")


def _rsqrt(x: ndarray) -> ndarray:
    r = _asarray(np.sqrt(x))  # a 0-d input gives a numpy scalar, which cannot be an out= target
    np.reciprocal(r, out=r)
    return r


def _sigmoid(x: ndarray) -> ndarray:
    # stable for large |x|: exp of a non-positive number only
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def _special(name: str) -> Any:
    """erf, erfc, erfinv from scipy.special (numpy has none); half types computed in float32."""

    def f(x: ndarray) -> ndarray:
        import scipy.special as sp  # imported on first use: it costs ~100 ms

        fn = getattr(sp, name)
        if x.dtype.itemsize < 4 or x.dtype.name == "bfloat16":
            return fn(x.astype(np.float32)).astype(x.dtype)
        return fn(x)

    return f


#: np.where branches on every element: with a condition the CPU cannot predict (relu's backward, masks of random
#: data) it runs at 5-7 ns per element on a 2-core VM, against ~1 ns for the branch-free :func:`_blend`'s 3-6 integer
#: passes; below this many elements the blend's extra passes and mask array cost more than the mispredictions
BLEND_MIN = 1 << 14
_UINT_OF_SIZE = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _blend(cond: ndarray, a: Any, b: Any) -> ndarray:
    """``np.where(cond, a, b)`` bit for bit (same dtype, shape and C layout) without a branch per element: the
    result's bits are ``(b & ~m) | (a & m)`` with m all ones where cond holds. The caller checked that every array
    operand is C-contiguous and the result dtype is a 2-, 4- or 8-byte number; numpy raises its own errors for
    what np.where would refuse (a Python int that does not fit the dtype)."""
    dt_ = np.result_type(a, b)
    u = _UINT_OF_SIZE[dt_.itemsize]
    shape = np.broadcast_shapes(cond.shape, np.shape(a), np.shape(b))
    keep_b = np.empty(shape, u)
    np.copyto(keep_b, cond)
    keep_b -= u(1)  # cond: 0, else all ones
    out = np.empty(shape, dt_)
    bits = out.view(u)
    np.bitwise_and(_asarray(b, dt_).view(u), keep_b, out=bits)
    ab = _asarray(a, dt_).view(u)
    if ab.ndim or ab != 0:  # a == +0 (all bits clear, relu's backward): nothing to add
        np.invert(keep_b, out=keep_b)
        keep_b &= ab
        bits |= keep_b
    return out


def _where(cond: ndarray, a: Any, b: Any) -> ndarray:
    """np.where, through :func:`_blend` for large C-contiguous numeric operands (identical results)."""
    if cond.size >= BLEND_MIN and cond.dtype == np.bool_ and cond.flags.c_contiguous:
        ok = True
        for x in (a, b):
            if type(x) is ndarray:
                ok = ok and x.flags.c_contiguous and x.dtype.kind in "fiu"
            elif not isinstance(x, (int, float, np.integer, np.floating)) or isinstance(x, bool):
                ok = False
        if ok and np.result_type(a, b).itemsize in _UINT_OF_SIZE:
            return _blend(cond, a, b)
    return np.where(cond, a, b)


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


def _sinc(x: ndarray) -> ndarray:
    """sin(pi x) / (pi x), 1 at 0, in x's dtype as PyTorch computes it (numpy's sinc nudges 0 to 1e-20, which is
    0 in float16, and widens bfloat16)."""
    y = x * np.asarray(np.pi, dtype=x.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):  # sin(inf) / inf is NaN, as in PyTorch
        r = np.sin(y) / y
    return np.where(x == 0, np.ones((), dtype=x.dtype), r)


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
    "sinc": _sinc,
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

# ufunc methods called directly (not np.sum & co.) so IEEE warnings are raised from this module, where the
# package's warnings filter applies, and one Python wrapper layer is skipped
_REDUCE = {"sum": np.add.reduce, "prod": np.multiply.reduce, "max": np.maximum.reduce, "min": np.minimum.reduce}


def _copy_c(h: ndarray) -> ndarray:
    """A C-order copy of h; from ``threads.COPY_MIN`` elements on (by default never: not measured faster) filled
    in chunks on flex's thread pool (a copy is exact however it is split)."""
    if h.size >= _par.COPY_MIN and h.size >= _par.min_elems and _par.active() and (r := _par.copy(h)) is not None:
        return r
    return np.array(h, copy=True, order="C")


def _too_big(exc: BaseException) -> bool:
    """numpy's refusals of a size past what the address space can hold (raised as ValueError, not MemoryError)."""
    msg = str(exc)
    return "array is too big" in msg or "Maximum allowed size exceeded" in msg


def _describe(args: Sequence[Any]) -> str:
    parts = []
    for a in args:
        if type(a) is ndarray:
            parts.append(f"array{a.shape}:{a.dtype}")
        elif isinstance(a, tuple) and all(type(n) is int for n in a):
            parts.append(f"shape {a} ({math.prod(a)} elements)")
        elif isinstance(a, DType):
            parts.append(f"dtype {a.name} ({a.itemsize} bytes each)")
    return ", ".join(parts)


def _oom(op: str, args: Sequence[Any], exc: BaseException) -> OutOfMemoryError:
    return OutOfMemoryError(f"{op}: flex (host memory) cannot allocate the result for {_describe(args)}: {exc}")


def _alloc_guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """numpy's MemoryError and "array is too big" ValueError become OutOfMemoryError naming the op and sizes.
    For methods whose result size is not bounded by their inputs' (creation, copies, concatenation...)."""
    op = fn.__name__

    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except MemoryError as exc:
            raise _oom(op, args, exc) from None
        except ValueError as exc:
            if _too_big(exc):
                raise _oom(op, args, exc) from None
            raise

    return method


def _register_complex_kernels() -> None:
    """numpy kernels for core's complex ops (ember.ops.complex: real, imag, abs, angle, conj, view_as_real...)."""
    from ember.ops.complex import HOST_KERNELS

    for op, fn in HOST_KERNELS.items():
        op.kernel("flex")(fn)


_register_complex_kernels()


#: eager binary ops on operands below this many elements skip binary() (Backend.binary_kernels): a few us of
#: work, where the call frame and core's shape check are a fifth of the op
_KERNEL_ELEMS = 1 << 14


class FlexBackend(Backend):
    """numpy on the host CPU."""

    name = "flex"
    contract_version = 1
    #: the real dtypes and complex64/complex128 (numpy's complex arrays)
    supported_dtypes = frozenset(dt.ALL_DTYPES + dt.COMPLEX_DTYPES)
    #: fusion only when asked for (``Device.flex().fusion()``): recording costs ~1.3 us per op and the numexpr
    #: kernels did not beat numpy's op-by-op chains on a training step (0.83-1.04x, docs/plugins/fusion.md);
    #: ember.compile still fuses replayed steps through fusion_compile
    fuse_by_default = False

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        host_memory.keep_freed_memory()  # once per process: the next step reuses this step's freed pages
        self._rng = np.random.Generator(np.random.PCG64(0))
        self._unary = _UNARY
        self._binary = _BINARY
        if type(self).binary is FlexBackend.binary:  # a subclass with its own binary keeps core calling it
            # eager a + b calls these ufuncs directly (Backend.binary_kernels: no frame, no shape check in core):
            # operands this small never go to the pool at its thresholds (MIN_ELEMS, EMBER_FLEX_THREADS_MIN; a
            # min_elems lowered at run time chunks only what reaches binary(), with the same bits), and binary()
            # adds nothing else for two arrays with elements (numpy returns arrays, a bad broadcast raises)
            self.binary_kernels = _BINARY
            self.binary_kernel_elems = min(_par.MIN_ELEMS, _KERNEL_ELEMS)

    def describe(self) -> str:
        import platform

        return f"flex:{self.index} (numpy {np.__version__} on {platform.machine() or 'cpu'})"

    def may_share_memory(self, a: Any, b: Any) -> bool:
        return bool(np.may_share_memory(a, b))  # a bounds check: well under a microsecond

    def fusion_compile(self, kernel: Any) -> Any:
        """A fused kernel on numexpr where it measures faster than numpy op by op (see :mod:`ember_flex.fusion`),
        or None where numexpr cannot compute any of it exactly."""
        from .fusion import compile_kernel  # imported on first use: it loads numexpr

        return compile_kernel(kernel, self)

    def memory_report(self) -> dict[str, Any]:
        return {"allocator": f"numpy (host malloc, {host_memory.describe()})", "in_use": None, "reserved": None,
                "peak": None}

    # -- data --------------------------------------------------------------------------------------------------
    def from_numpy(self, array: ndarray) -> ndarray:
        return array

    def from_dlpack(self, obj: Any) -> ndarray:
        return np.from_dlpack(obj)

    def to_numpy(self, h: ndarray) -> ndarray:
        return h

    @_alloc_guard
    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> ndarray:
        return np.full(shape, value, dtype=dtype.numpy)

    @_alloc_guard
    def arange(self, start: Any, stop: Any, step: Any, dtype: DType) -> ndarray:
        return np.arange(start, stop, step, dtype=dtype.numpy)

    def cast(self, h: ndarray, dtype: DType) -> ndarray:
        npdt = dtype.numpy
        try:
            if h.size >= _par.min_elems and h.dtype != npdt and _par.active():  # large: chunked on flex's pool
                r = _par.cast(h, npdt, h.dtype.kind == "f" and npdt.kind in "iu")
                if r is not None:
                    return r
            if h.dtype.kind == "f" and npdt.kind in "iu":
                return np.asarray(np.trunc(h).astype(npdt))  # a 0-d input would give a numpy scalar
            return h.astype(npdt)
        except MemoryError as exc:
            raise _oom("cast", (h, dtype), exc) from None

    def dtype_of(self, h: ndarray) -> DType:
        return dt.from_numpy_dtype(h.dtype)

    @_alloc_guard
    def copy(self, h: ndarray) -> ndarray:
        return _copy_c(h)

    @_alloc_guard
    def contiguous(self, h: ndarray) -> ndarray:
        return h if h.flags.c_contiguous else _copy_c(h)

    def assign(self, dst: ndarray, src: Any) -> None:
        np.copyto(dst, src, casting="unsafe")

    # -- compute -------------------------------------------------------------------------------------------------
    def unary(self, op: str, h: ndarray) -> ndarray:
        try:  # free when nothing is raised; an expanded (stride-0) input can ask for far more than it holds
            # large inputs: chunked on flex's thread pool (None where chunking would not give the same bits)
            if h.size < _par.min_elems or not _par.active() or (
                    r := _par.elementwise(self._unary[op], (h,))) is None:
                r = self._unary[op](h)
        except MemoryError as exc:
            raise _oom(op, (h,), exc) from None
        return r if type(r) is ndarray else _asarray(r)

    def binary(self, op: str, a: Any, b: Any) -> ndarray:
        ta, tb = type(a) is ndarray, type(b) is ndarray
        try:
            m = _par.min_elems  # large operands: chunked on flex's thread pool (None: not exactly, run serially)
            if not ((ta and a.size >= m) or (tb and b.size >= m)) or not _par.active() or (
                    r := _par.elementwise(self._binary[op], (a, b))) is None:
                r = self._binary[op](a, b)
        except MemoryError as exc:
            raise _oom(op, (a, b), exc) from None
        if type(r) is not ndarray:
            r = _asarray(r)
        if not (ta and tb):
            # a Python scalar operand: ml_dtypes' bfloat16 widens to float32 where numpy's own dtypes do not
            h = a if ta else b
            if r.dtype != h.dtype and r.dtype != np.bool_:
                r = r.astype(h.dtype)
        return r

    def inplace_binary(self, op: str, a: ndarray, b: Any) -> None:
        if op in _INPLACE_OK:
            if a.size < _par.min_elems or not _par.active() or not _par.inplace(self._binary[op], a, b):
                self._binary[op](a, b, out=a)
        else:
            self.assign(a, self.binary(op, a, b))

    def where(self, cond: ndarray, a: Any, b: Any) -> ndarray:
        try:
            m = _par.min_elems  # large operands: chunked on flex's thread pool
            big = any(type(x) is ndarray and x.size >= m for x in (cond, a, b))
            if not big or not _par.active() or (r := _par.elementwise(_where, (cond, a, b))) is None:
                r = _where(cond, a, b)
        except MemoryError as exc:
            raise _oom("where", (cond, a, b), exc) from None
        if type(a) is ndarray and r.dtype != a.dtype:
            r = r.astype(a.dtype)
        elif type(b) is ndarray and r.dtype != b.dtype and type(a) is not ndarray:
            r = r.astype(b.dtype)
        return r

    def reduce(self, op: str, h: ndarray, dims: tuple[int, ...], keepdim: bool) -> ndarray:
        if h.size >= _par.min_elems and _par.active():  # large: chunked on flex's pool, the serial call's bits
            r = _par.reduce(_REDUCE[op].__self__, h, dims, keepdim)  # the ufunc of the bound reduce
            if r is not None:
                return r
        if not keepdim and len(dims) == h.ndim and (h.dtype.kind == "f" or op in ("max", "min")):
            # a whole-array reduction whose result has h's dtype: straight into a 0-d array (numpy would return a
            # scalar, and wrapping it costs more than the empty array)
            return _REDUCE[op](h, dims, None, np.empty((), h.dtype))
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

    @_alloc_guard
    def cumulative(self, op: str, h: ndarray, dim: int) -> ndarray:
        f = np.add.accumulate if op == "sum" else np.multiply.accumulate
        return f(h, axis=dim, dtype=h.dtype)

    @_alloc_guard
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
        try:
            return h.reshape(shape)
        except MemoryError as exc:  # reshaping an expanded view copies it
            raise _oom("reshape", (h, shape), exc) from None

    def permute(self, h: ndarray, dims: tuple[int, ...]) -> ndarray:
        return h.transpose(dims)

    def expand(self, h: ndarray, shape: tuple[int, ...]) -> ndarray:
        return np.broadcast_to(h, shape)

    @_alloc_guard
    def getitem(self, h: ndarray, key: tuple[Any, ...]) -> ndarray:
        r = h[key]
        return r if type(r) is ndarray else _asarray(r)

    def setitem(self, h: ndarray, key: tuple[Any, ...], value: Any) -> None:
        h[key] = value

    @_alloc_guard
    def cat(self, hs: Sequence[ndarray], dim: int) -> ndarray:
        return np.concatenate(hs, axis=dim)

    @_alloc_guard
    def flip(self, h: ndarray, dims: tuple[int, ...]) -> ndarray:
        return np.flip(h, dims).copy()

    @_alloc_guard
    def gather(self, h: ndarray, dim: int, index: ndarray) -> ndarray:
        if index.shape[:dim] + index.shape[dim + 1:] != h.shape[:dim] + h.shape[dim + 1:]:
            h = h[tuple(slice(0, n) if d != dim else slice(None) for d, n in enumerate(index.shape))]
        return np.take_along_axis(h, index, axis=dim)

    @_alloc_guard
    def scatter(self, h: ndarray, dim: int, index: ndarray, src: Any, reduce: str | None) -> ndarray:
        out = h.copy()
        if type(src) is ndarray:
            src = src[tuple(slice(0, n) for n in index.shape)]
        else:
            src = np.full(index.shape, src, dtype=h.dtype)
        if reduce is None and self._scatter_rows(out, dim, index, src):
            return out
        key = self._grid(index, dim)
        if reduce is None:
            out[key] = src
        elif reduce == "add":
            np.add.at(out, key, src)
        else:
            np.multiply.at(out, key, src)
        return out

    @staticmethod
    def _scatter_rows(out: ndarray, dim: int, index: ndarray, src: ndarray) -> bool:
        """Replace-scatter along the last axis, index covering out's leading dims (max-pool's backward scatters its
        gradient so, 2.8M values at the seed CNN's batch 256), through one flat index: half the time of the
        open-grid fancy index. Written in the same (C) order, so duplicates keep the same value. False (nothing
        written) where it does not apply, negative indices included (the grid wraps them)."""
        if dim != out.ndim - 1 or index.shape[:-1] != out.shape[:-1] or index.size == 0 or not out.flags.c_contiguous:
            return False
        if index.min() < 0:
            return False
        k = index.shape[-1]
        rows = index.size // k
        flat = index.reshape(rows, k) + (np.arange(rows, dtype=np.int64) * out.shape[-1])[:, None]
        out.reshape(-1)[flat.reshape(-1)] = src.reshape(-1)
        return True

    @staticmethod
    def _grid(index: ndarray, dim: int) -> tuple[ndarray, ...]:
        grid = list(np.indices(index.shape, sparse=True))
        grid[dim] = index
        return tuple(grid)

    @_alloc_guard
    def index_select(self, h: ndarray, dim: int, index: ndarray) -> ndarray:
        return np.take(h, index, axis=dim)

    @_alloc_guard
    def masked_fill(self, h: ndarray, mask: ndarray, value: Any) -> ndarray:
        r = np.where(mask, value, h)
        return r.astype(h.dtype, copy=False)

    def tril(self, h: ndarray, diagonal: int, upper: bool) -> ndarray:
        return np.triu(h, diagonal) if upper else np.tril(h, diagonal)

    @_alloc_guard
    def einsum(self, equation: str, *hs: ndarray) -> ndarray:
        dtype = hs[0].dtype if hs else None
        if dtype is not None and dtype.kind in "fV" and dtype.itemsize < 4:
            # half types: numpy's einsum refuses ml_dtypes' bfloat16 and sums float16 in float16; accumulate in
            # float32 and round once, as matmul (and PyTorch) do
            wide = [h.astype(np.float32) for h in hs]
            return _asarray(np.einsum(equation, *wide, optimize=len(hs) > 2).astype(dtype))
        return _asarray(np.einsum(equation, *hs, optimize=len(hs) > 2))

    def softmax(self, h: ndarray, dim: int, log: bool) -> ndarray:
        if h.size == 0:  # a zero-length dim has no max; the result is as empty as the input (PyTorch)
            return np.zeros(h.shape, h.dtype)
        # as PyTorch: a row whose max is infinite gives inf - inf = NaN throughout (a +inf element, or all -inf)
        z = h - np.max(h, axis=dim, keepdims=True)
        if log:
            with np.errstate(divide="ignore"):
                return z - np.log(np.sum(np.exp(z), axis=dim, keepdims=True))
        e = np.exp(z)
        e /= np.sum(e, axis=dim, keepdims=True)
        return e

    # -- neural-network kernels (im2col + BLAS; see nn_kernels) -------------------------------------------
    @_alloc_guard
    def conv(self, x: ndarray, w: ndarray, b: ndarray | None, stride: tuple[int, ...],
             padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> ndarray:
        return nn_kernels.conv(x, w, b, stride, padding, dilation, groups)

    @_alloc_guard
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

    @_alloc_guard
    def interpolate(self, x: ndarray, size: tuple[int, ...], mode: str, align_corners: bool | None,
                    scales: tuple[float, ...] | None) -> ndarray:
        return nn_kernels.interpolate(x, size, mode, align_corners, scales)

    @_alloc_guard
    def pad(self, h: ndarray, pads: tuple[tuple[int, int], ...], mode: str, value: Any) -> ndarray:
        return nn_kernels.pad(h, pads, mode, 0 if value is None else value)

    # -- random numbers ----------------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        self._rng = np.random.Generator(np.random.PCG64(seed))

    @_alloc_guard
    def rand(self, shape: tuple[int, ...], dtype: DType) -> ndarray:
        # numpy's Generator.random bit for bit; large draws chunked on the pool (random_kernels)
        if dtype in (dt.float32, dt.float64):
            return random_kernels.uniform(self._rng, shape, dtype.numpy)
        return random_kernels.uniform(self._rng, shape, np.float32).astype(dtype.numpy)

    @_alloc_guard
    def randn(self, shape: tuple[int, ...], dtype: DType) -> ndarray:
        if dtype in (dt.float32, dt.float64):
            return self._rng.standard_normal(shape, dtype=dtype.numpy)
        return self._rng.standard_normal(shape, dtype=np.float32).astype(dtype.numpy)

    @_alloc_guard
    def randint(self, low: int, high: int, shape: tuple[int, ...], dtype: DType) -> ndarray:
        # numpy draws integer dtypes only: bool and float results (torch allows both) are drawn as int64
        draw = dtype.numpy if dtype.is_integer else np.int64
        return self._rng.integers(low, high, size=shape, dtype=draw).astype(dtype.numpy, copy=False)

    def new_random_stream(self, seed: int) -> Any:
        """An ``ember.Generator``'s stream: numpy's PCG64 drawn exactly as this backend's own stream (the arrays are
        adopted, not copied), so a generator seeded with n repeats ``Device.flex().seed(n)``'s draws."""
        from ember.generator import HostRandomStream

        return HostRandomStream(self, np.random.PCG64(seed), uniform=random_kernels.uniform)

    # -- optional backward kernels: the autodiff decorator uses them for conv gradients when present -------------
    def conv_input_grad(self, grad_y: ndarray, w: ndarray, x_shape: tuple[int, ...], stride: tuple[int, ...],
                        padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> ndarray:
        """Gradient of ``conv`` w.r.t. its input of shape x_shape (col2im: one GEMM per kernel tap)."""
        return nn_kernels.conv_input_grad(grad_y, w, x_shape, stride, padding, dilation, groups)

    def max_pool_backward(self, grad: ndarray, indices: ndarray, x_shape: tuple[int, ...], nd: int,
                          overlap: bool) -> ndarray:
        """Gradient of max pooling w.r.t. its input of shape x_shape: grad written (added where windows overlap) at
        the forward's flat per-plane indices, per block of planes in cache; the values of a scatter into zeros."""
        return nn_kernels.max_pool_backward(grad, indices, x_shape, nd, overlap)

    def conv_weight_grad(self, x: ndarray, grad_y: ndarray, w_shape: tuple[int, ...], stride: tuple[int, ...],
                         padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> ndarray:
        """Gradient of ``conv`` w.r.t. its weight of shape w_shape (im2col + one GEMM per group)."""
        return nn_kernels.conv_weight_grad(x, grad_y, w_shape, stride, padding, dilation, groups)
