"""WGPUBackend: the ember backend contract on WebGPU (wgpu-py), with generated WGSL compute shaders.

Every op records one or a few compute dispatches on the device's queue and returns at once; reads (``to_numpy``)
and ``sync()`` wait. Handles are :class:`~ember_wgpu.array.WArray` views of pooled buffers. The kernels live in
:mod:`ember_wgpu.kernels`; this class maps the contract's methods onto them. Methods not here come from the
default compositions of :class:`ember.backend.Backend`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.backend import COMPARISON_OPS, Backend
from ember.dtypes import DType
from ember.errors import DTypeError, UnsupportedError

from . import array as arr
from . import kernels as k
from . import wgsl
from .array import WArray
from .runtime import runtime

_LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor"})
_SCALAR_CACHE_MAX = 1024


def _is_handle(x: Any) -> bool:
    return isinstance(x, WArray)


def _basic(key: tuple[Any, ...]) -> bool:
    return not any(_is_handle(k_) for k_ in key)


class WGPUBackend(Backend):
    """The ``wgpu`` backend: one WebGPU adapter (``Device.wgpu(i, power=...)``)."""

    name = "wgpu"
    contract_version = 1

    def __init__(self, index: int = 0, power: str = "high") -> None:
        super().__init__(index)
        self.rt = runtime(index, power)
        self.power = power
        self.supported_dtypes = arr.supported_dtypes(self.rt.features)
        self._rng_lock = threading.Lock()
        self._key = 0
        self._counter = 0
        self._scalars: dict[tuple[str, str, str], WArray] = {}

    # -- device management ---------------------------------------------------------------------------------------
    def describe(self) -> str:
        return f"wgpu:{self.index} ({self.rt.describe()})"

    def sync(self) -> None:
        self.rt.sync()

    def memory_report(self) -> dict[str, Any]:
        report = dict(self.rt.pool.report())
        report["kernels"] = dict(self.rt.stats)
        return report

    def memory_dry_run(self) -> AbstractContextManager[dict[str, Any]]:
        return self.rt.pool.dry_run()

    def fusion_compile(self, kernel: Any) -> Any:
        """One generated WGSL kernel per fused elementwise block (see :mod:`ember_wgpu.fusion`); None for
        reductions and for anything the WGSL tables lack (fusion then runs the block op by op)."""
        from .fusion import compile_kernel

        return compile_kernel(self, kernel)

    def may_share_memory(self, a: Any, b: Any) -> bool:
        return not (_is_handle(a) and _is_handle(b)) or a.block is b.block

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _check(self, dtype: DType, what: str) -> None:
        if dtype not in self.supported_dtypes:
            arr.storage_type(dtype, self.rt, f"wgpu.{what}")

    def _scalar(self, value: Any, dtype: DType) -> WArray:
        """A 0-d array holding ``value`` as ``dtype`` (float16 operands get a float32 scalar: compute is f32)."""
        if dtype is dt.float16:
            dtype = dt.float32
        key = (dtype.name, type(value).__name__, repr(value))
        h = self._scalars.get(key)
        if h is None:
            if len(self._scalars) >= _SCALAR_CACHE_MAX:
                self._scalars.clear()
            with np.errstate(all="ignore"):
                host = np.array(value).astype(dtype.numpy) if dtype is not dt.bool_ else np.array(bool(value))
            h = self._scalars[key] = arr.upload(self.rt, host, dtype)
        return h

    def _new(self, shape: tuple[int, ...], dtype: DType, what: str) -> WArray:
        self._check(dtype, what)
        return arr.empty(self.rt, tuple(shape), dtype)

    @staticmethod
    def _bcast(h: WArray, shape: tuple[int, ...]) -> WArray:
        return h if h.shape == shape else arr.expand(h, shape)

    def _materialize(self, value: Any, shape: tuple[int, ...], dtype: DType) -> WArray:
        """A new contiguous array of ``shape`` and ``dtype`` from a handle (broadcast, converted) or a scalar."""
        out = self._new(shape, dtype, "assign")
        self._write(out, value)
        return out

    def _write(self, dst: WArray, src: Any) -> None:
        src_h = src if _is_handle(src) else self._scalar(src, dst.dtype)
        if _is_handle(src) and src.block is dst.block:  # a kernel cannot read and write one buffer
            src_h = self.copy(src)
        expr = wgsl.convert("{x0}", wgsl.ctype(src_h.dtype), wgsl.ctype(dst.dtype))
        k.run_map(expr, [self._bcast(src_h, dst.shape)], dst)

    # -- data ----------------------------------------------------------------------------------------------------
    def from_numpy(self, array: np.ndarray) -> WArray:
        return arr.upload(self.rt, array, dt.from_numpy_dtype(array.dtype))

    def to_numpy(self, h: WArray) -> np.ndarray:
        return arr.download(h if h.is_contiguous else self.copy(h))

    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> WArray:
        out = self._new(tuple(shape), dtype, "full")
        self._write(out, value)
        return out

    def arange(self, start: Any, stop: Any, step: Any, dtype: DType) -> WArray:
        # computed on the host as numpy does (float steps accumulate in float64) and uploaded: one transfer
        self._check(dtype, "arange")
        return arr.upload(self.rt, np.arange(start, stop, step).astype(dtype.numpy), dtype)

    def cast(self, h: WArray, dtype: DType) -> WArray:
        out = self._new(h.shape, dtype, "cast")
        k.run_map(wgsl.convert("{x0}", wgsl.ctype(h.dtype), wgsl.ctype(dtype)), [h], out)
        return out

    def copy(self, h: WArray) -> WArray:
        out = arr.empty(self.rt, h.shape, h.dtype)
        k.run_map("{x0}", [h], out)
        return out

    def contiguous(self, h: WArray) -> WArray:
        return h if h.is_contiguous else self.copy(h)

    def dtype_of(self, h: WArray) -> DType:
        return h.dtype

    def assign(self, dst: WArray, src: Any) -> None:
        self._write(dst, src)

    # -- for extension kernels: allocation without importing this plugin -------------------------------------------
    def empty(self, shape: Sequence[int], dtype: DType) -> WArray:
        """A new contiguous, uninitialised array of ``shape`` and ``dtype`` from this device's pool."""
        return self._new(tuple(int(n) for n in shape), dtype, "empty")

    # -- elementwise ---------------------------------------------------------------------------------------------
    def unary(self, op: str, h: WArray) -> WArray:
        expr = wgsl.unary_expr(op, wgsl.ctype(h.dtype), "{x0}")
        if expr is None:
            raise DTypeError(f"wgpu.unary: {op} is not defined for {h.dtype.name} (shape {h.shape})")
        out_dtype = dt.bool_ if op in wgsl.PREDICATES else h.dtype
        out = arr.empty(self.rt, h.shape, out_dtype)
        k.run_map(expr, [h], out)
        return out

    def binary(self, op: str, a: Any, b: Any) -> WArray:
        ref = a if _is_handle(a) else b
        dtype = ref.dtype
        ct = wgsl.ctype(dtype)
        other = b if ref is a else a
        if (not _is_handle(other) and isinstance(other, float) and ct in ("i32", "i64")
                and not float(other).is_integer() and op not in _LOGICAL):
            # an integer tensor with a fractional Python scalar: compute in float32, then back (numpy semantics)
            r = self.binary(op, *((self.cast(ref, dt.float32), other) if ref is a
                                   else (other, self.cast(ref, dt.float32))))
            return r if r.dtype is dt.bool_ else self.cast(r, dtype)
        x = a if _is_handle(a) else self._scalar(a, dtype)
        y = b if _is_handle(b) else self._scalar(b, dtype)
        shape = tuple(np.broadcast_shapes(x.shape, y.shape))
        expr = wgsl.binary_expr(op, ct, "{x0}", "{x1}")
        if expr is None:
            if op == "div" and ct in ("i32", "i64"):
                return self.binary(op, self.cast(x, dt.float32), self.cast(y, dt.float32))
            raise DTypeError(f"wgpu.binary: {op} is not defined for {dtype.name} (shapes {x.shape}, {y.shape})")
        out_dtype = dt.bool_ if (op in _LOGICAL or op in COMPARISON_OPS) else dtype
        out = arr.empty(self.rt, shape, out_dtype)
        k.run_map(expr, [self._bcast(x, shape), self._bcast(y, shape)], out)
        return out

    def where(self, cond: WArray, a: Any, b: Any) -> WArray:
        ref = a if _is_handle(a) else b if _is_handle(b) else None
        if ref is None:
            dtype = dt.float32 if isinstance(a, float) or isinstance(b, float) else dt.int64
            if isinstance(a, bool) and isinstance(b, bool):
                dtype = dt.bool_
        else:
            dtype = ref.dtype
        x = a if _is_handle(a) else self._scalar(a, dtype)
        y = b if _is_handle(b) else self._scalar(b, dtype)
        shape = tuple(np.broadcast_shapes(cond.shape, x.shape, y.shape))
        out = self._new(shape, dtype, "where")
        ct = wgsl.ctype(dtype)
        xs = wgsl.convert("{x1}", wgsl.ctype(x.dtype), ct)
        ys = wgsl.convert("{x2}", wgsl.ctype(y.dtype), ct)
        k.run_map(f"select({ys}, {xs}, {wgsl.truth('{x0}', wgsl.ctype(cond.dtype))})",
                  [self._bcast(cond, shape), self._bcast(x, shape), self._bcast(y, shape)], out)
        return out

    # -- reductions ----------------------------------------------------------------------------------------------
    def reduce(self, op: str, h: WArray, dims: tuple[int, ...], keepdim: bool) -> WArray:
        dims = tuple(sorted(set(dims)))
        kept = tuple(1 if d in dims else n for d, n in enumerate(h.shape)) if keepdim else \
            tuple(n for d, n in enumerate(h.shape) if d not in dims)
        return k.reduce(op, h, dims, kept, h.dtype)

    def argreduce(self, op: str, h: WArray, dim: int | None, keepdim: bool) -> WArray:
        self._check(dt.int64, op)
        if dim is None:
            flat = self.reshape(h, (h.size,))
            out = k.argreduce(op, flat, 0, ())
            return arr.reshape_view(out, (1,) * h.ndim) if keepdim else out
        if h.ndim == 0:
            return self.full((), 0, dt.int64)
        shape = tuple(1 if d == dim else n for d, n in enumerate(h.shape)) if keepdim else \
            tuple(n for d, n in enumerate(h.shape) if d != dim)
        return k.argreduce(op, h, dim, shape)

    def cumulative(self, op: str, h: WArray, dim: int) -> WArray:
        if h.ndim == 0:
            return self.copy(h)
        return k.scan(op, h, dim)

    def matmul(self, a: WArray, b: WArray) -> WArray:
        a2 = arr.reshape_view(a, (1, a.shape[0])) if a.ndim == 1 else a
        b2 = arr.reshape_view(b, (b.shape[0], 1)) if b.ndim == 1 else b
        assert a2 is not None and b2 is not None  # 1-d views always reshape
        batch = tuple(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
        out = k.matmul(self._bcast(a2, batch + a2.shape[-2:]), self._bcast(b2, batch + b2.shape[-2:]))
        shape = list(out.shape)
        if b.ndim == 1:
            shape.pop(-1)
        if a.ndim == 1:
            shape.pop(-2 if b.ndim != 1 else -1)
        return arr.reshape_view(out, tuple(shape)) if tuple(shape) != out.shape else out  # type: ignore[return-value]

    def sort(self, h: WArray, dim: int, descending: bool, stable: bool) -> tuple[WArray, WArray]:
        self._check(dt.int64, "sort")
        if h.ndim == 0:
            return self.copy(h), self.full((), 0, dt.int64)
        return k.sort(h, dim, descending)

    def softmax(self, h: WArray, dim: int, log: bool) -> WArray:
        if h.ndim == 0 or not h.dtype.is_floating_point:
            return super().softmax(h, dim, log)
        return k.softmax(h, dim, log)

    # -- convolution and pooling: im2col + the tuned matmul, gather col2im, direct pooling kernels ---------------------
    def conv(self, x: WArray, w: WArray, b: WArray | None, stride: tuple[int, ...],
             padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> WArray:
        from . import conv

        return conv.conv(self, x, w, b, tuple(stride), tuple(padding), tuple(dilation), groups)

    def conv_transpose(self, x: WArray, w: WArray, b: WArray | None, stride: tuple[int, ...],
                       padding: tuple[int, ...], output_padding: tuple[int, ...], dilation: tuple[int, ...],
                       groups: int) -> WArray:
        from . import conv

        return conv.conv_transpose(self, x, w, b, tuple(stride), tuple(padding), tuple(output_padding),
                                   tuple(dilation), groups)

    def conv_input_grad(self, grad_y: WArray, w: WArray, x_shape: tuple[int, ...], stride: tuple[int, ...],
                        padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> WArray:
        """Gradient of ``conv`` with respect to its input of shape ``x_shape`` (the autodiff decorator uses it)."""
        from . import conv

        return conv.conv_input_grad(self, grad_y, w, tuple(x_shape), tuple(stride), tuple(padding),
                                    tuple(dilation), groups)

    def conv_weight_grad(self, x: WArray, grad_y: WArray, w_shape: tuple[int, ...], stride: tuple[int, ...],
                         padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> WArray:
        """Gradient of ``conv`` with respect to its weight of shape ``w_shape`` (the autodiff decorator uses it)."""
        from . import conv

        return conv.conv_weight_grad(self, x, grad_y, tuple(w_shape), tuple(stride), tuple(padding),
                                     tuple(dilation), groups)

    def max_pool(self, x: WArray, kernel_size: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], dilation: tuple[int, ...], ceil_mode: bool,
                 return_indices: bool) -> Any:
        from . import pooling

        if not pooling.supported(x, "max") or (return_indices and dt.int64 not in self.supported_dtypes):
            return super().max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
        return pooling.max_pool(self, x, tuple(kernel_size), tuple(stride), tuple(padding), tuple(dilation),
                                ceil_mode, return_indices)

    def avg_pool(self, x: WArray, kernel_size: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], ceil_mode: bool, count_include_pad: bool,
                 divisor_override: int | None) -> WArray:
        from . import pooling

        if not pooling.supported(x, "avg"):
            return super().avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        return pooling.avg_pool(self, x, tuple(kernel_size), tuple(stride), tuple(padding), ceil_mode,
                                count_include_pad, divisor_override)

    def adaptive_avg_pool(self, x: WArray, output_size: tuple[int, ...]) -> WArray:
        from . import pooling

        if not pooling.supported(x, "avg"):
            return super().adaptive_avg_pool(x, output_size)
        return pooling.adaptive_pool(self, "avg", x, tuple(output_size), False)  # type: ignore[no-any-return]

    def adaptive_max_pool(self, x: WArray, output_size: tuple[int, ...], return_indices: bool) -> Any:
        from . import pooling

        if not pooling.supported(x, "max") or (return_indices and dt.int64 not in self.supported_dtypes):
            return super().adaptive_max_pool(x, output_size, return_indices)
        return pooling.adaptive_pool(self, "max", x, tuple(output_size), return_indices)

    # -- movement and indexing -----------------------------------------------------------------------------------
    def reshape(self, h: WArray, shape: tuple[int, ...]) -> WArray:
        v = arr.reshape_view(h, tuple(shape))
        if v is None:
            v = arr.reshape_view(self.copy(h), tuple(shape))
        assert v is not None  # a contiguous array always reshapes
        return v

    def permute(self, h: WArray, dims: tuple[int, ...]) -> WArray:
        return arr.permute(h, tuple(dims))

    def expand(self, h: WArray, shape: tuple[int, ...]) -> WArray:
        return arr.expand(h, tuple(shape))

    def _offsets(self, h: WArray, key: tuple[Any, ...]) -> np.ndarray:
        """Element offsets (in h's buffer) of ``h[key]`` for an advanced key: the index handles are read to the
        host and numpy applies the key to h's offset grid, so every numpy indexing rule holds by construction."""
        host_key = tuple(self.to_numpy(x) if _is_handle(x) else x for x in key)
        offs = arr.element_offsets(h)[host_key]
        if offs.size and int(offs.max()) >= 2 ** 31:
            raise UnsupportedError(f"wgpu.getitem: tensor of shape {h.shape} is too large for 32-bit offsets")
        return np.asarray(offs)

    def getitem(self, h: WArray, key: tuple[Any, ...]) -> WArray:
        if _basic(key):
            return arr.basic_index(h, key)
        return k.gather(h, self._offsets(h, key))

    def setitem(self, h: WArray, key: tuple[Any, ...], value: Any) -> None:
        if _basic(key):
            self._write(arr.basic_index(h, key), value)
            return
        offs = self._offsets(h, key)
        if offs.size:
            k.scatter(h, offs, self._materialize(value, tuple(offs.shape), h.dtype))

    def cat(self, hs: Sequence[WArray], dim: int) -> WArray:
        shape = list(hs[0].shape)
        shape[dim] = sum(x.shape[dim] for x in hs)
        dtype = hs[0].dtype
        out = arr.empty(self.rt, tuple(shape), dtype)
        start = 0
        for x in hs:
            n = x.shape[dim]
            if n:
                key = (slice(None),) * dim + (slice(start, start + n),)
                self._write(arr.basic_index(out, key), x)
            start += n
        return out

    # -- random numbers: Philox4x32-10 on the device ----------------------------------------------------------------
    def seed(self, seed: int) -> None:
        with self._rng_lock:
            self._key = int(seed) & 0xFFFFFFFFFFFFFFFF
            self._counter = 0

    def _next(self) -> tuple[int, int]:
        with self._rng_lock:
            c = self._counter
            self._counter += 1
            return self._key, c

    def rand(self, shape: tuple[int, ...], dtype: DType) -> WArray:
        self._check(dtype, "rand")
        key, c = self._next()
        gen = dtype if dtype in (dt.float32, dt.float16) else dt.float32
        out = k.random("rand", self.rt, tuple(shape), gen, key, c)
        return out if gen is dtype else self.cast(out, dtype)

    def randn(self, shape: tuple[int, ...], dtype: DType) -> WArray:
        self._check(dtype, "randn")
        key, c = self._next()
        out = k.random("randn", self.rt, tuple(shape), dt.float32, key, c)
        return out if dtype is dt.float32 else self.cast(out, dtype)

    def randint(self, low: int, high: int, shape: tuple[int, ...], dtype: DType) -> WArray:
        self._check(dtype, "randint")
        key, c = self._next()
        span = int(high) - int(low)
        gen = dt.int64 if (dtype is dt.int64 or span >= 2 ** 31 or not -2 ** 31 <= low < 2 ** 31) else dt.int32
        self._check(gen, "randint")
        out = k.random("randint", self.rt, tuple(shape), gen, key, c, low=int(low), span=span)
        return out if gen is dtype else self.cast(out, dtype)

