"""OpenCLBackend: the ember backend contract on pyopencl.

Every op enqueues generated kernels on the device's in-order queue and returns at once; reads (``to_numpy``) and
``sync()`` wait. Handles are :class:`~ember_opencl.array.CLArray` views of pooled memory blocks. The op families
live in their own modules (elementwise, reduction, matmul, conv, indexing, sorting, random, pooling); this class
only routes the contract's methods to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.backend import Backend
from ember.dtypes import DType
from ember.errors import DTypeError, ShapeError

from . import array as arr
from . import complex_ as cx
from . import elementwise as ew
from . import nn_kernels
from .array import CLArray
from .runtime import runtime

cx.register()  # OpenCL kernels for core's complex ops (real, imag, abs, angle, conj, view_as_real, ...)
nn_kernels.register()  # GELU, layer norm and attention forward as single launches (ember_kernels.nn)


class OpenCLBackend(Backend):
    name = "opencl"
    contract_version = 1

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        self.rt = runtime(index)
        # the real dtypes and complex64/complex128 (float2/double2); without fp64 (e.g. many Intel and mobile GPUs)
        # neither float64 nor complex128
        self.supported_dtypes = frozenset(d for d in dt.ALL_DTYPES + dt.COMPLEX_DTYPES
                                          if self.rt.fp64 or d not in (dt.float64, dt.complex128))
        self._rng_state: Any = None
        # fusion pays on GPUs (one launch and one pass over memory for a chain); on a CPU driver (PoCL) its
        # recording and planning cost more than they save: the seed-CNN training step measured 0.73x (batch 64) and
        # 0.93x (batch 256) of the unfused step's speed. There it fuses only when asked (Device.opencl(i).fusion())
        # and in ember.compile's replayed steps
        self.fuse_by_default = not self.rt.is_cpu

    @property
    def _rng(self) -> Any:
        if self._rng_state is None:
            from .random import Philox

            with self.rt.lock:  # threads' first draws must share one stream (two would repeat each other's numbers)
                if self._rng_state is None:
                    self._rng_state = Philox(self.rt, 0)
        return self._rng_state

    # -- device management ---------------------------------------------------------------------------------------
    def describe(self) -> str:
        return f"opencl:{self.index} ({self.rt.describe()})"

    def sync(self) -> None:
        self.rt.queue.finish()

    def memory_report(self) -> dict[str, Any]:
        report = dict(self.rt.pool.report())
        report["kernels"] = dict(self.rt.programs.stats)
        return report

    def memory_dry_run(self) -> AbstractContextManager[dict[str, Any]]:
        return self.rt.pool.dry_run()

    # -- data ----------------------------------------------------------------------------------------------------
    def from_numpy(self, array: np.ndarray) -> CLArray:
        return arr.upload(self.rt, array, dt.from_numpy_dtype(array.dtype))

    def to_numpy(self, h: CLArray) -> np.ndarray:
        return arr.download(h if h.is_contiguous else ew.copy(h))

    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> CLArray:
        return ew.full(self.rt, tuple(shape), value, dtype)

    def arange(self, start: Any, stop: Any, step: Any, dtype: DType) -> CLArray:
        return ew.arange(self.rt, start, stop, step, dtype)

    def cast(self, h: CLArray, dtype: DType) -> CLArray:
        return ew.cast(h, dtype)

    def copy(self, h: CLArray) -> CLArray:
        return ew.copy(h)

    def contiguous(self, h: CLArray) -> CLArray:
        return h if h.is_contiguous else ew.copy(h)

    def dtype_of(self, h: CLArray) -> DType:
        return h.dtype

    # -- for extension kernels (ember.backend_extension): allocation and compilation without importing this plugin
    def empty(self, shape: Sequence[int], dtype: DType) -> CLArray:
        """A new contiguous, uninitialised array of ``shape`` and ``dtype`` from this device's memory pool.

        For extension kernels that write every element of their output themselves (a fill, as ``full`` does, would
        be a wasted pass). Raises ``DTypeError`` for a dtype this device does not support (float64 without
        cl_khr_fp64) and ``ShapeError`` for a negative dim.
        """
        shape = tuple(int(n) for n in shape)
        if any(n < 0 for n in shape):
            raise ShapeError(f"OpenCLBackend.empty: negative dimension in shape {shape}")
        if dtype not in self.supported_dtypes:
            raise DTypeError(f"OpenCLBackend.empty: {dtype.name} is not supported on {self.describe()}")
        return arr.empty(self.rt, shape, dtype)

    def compile_kernel(self, source: str, name: str) -> Any:
        """The :class:`pyopencl.Kernel` ``name`` of the OpenCL C program ``source``, built for this device.

        Built with the device's build options and cached like the backend's own kernels (in memory per thread, and
        as a binary on disk), so calling it on every launch costs one dict lookup. A program that uses ``double``
        must enable ``cl_khr_fp64`` itself. Launch it on ``self.rt.queue`` with buffers ``h.buf`` and element
        offsets ``h.eoff`` of :class:`~ember_opencl.array.CLArray` handles. A build failure raises
        :class:`~ember_opencl.errors.KernelBuildError` with the compiler's log.
        """
        return self.rt.kernel(source, name)

    def assign(self, dst: CLArray, src: Any) -> None:
        ew.assign(dst, src)

    # -- elementwise ---------------------------------------------------------------------------------------------
    def unary(self, op: str, h: CLArray) -> CLArray:
        return ew.unary(op, h)

    def binary(self, op: str, a: Any, b: Any) -> CLArray:
        return ew.binary(op, a, b)

    def inplace_binary(self, op: str, a: CLArray, b: Any) -> None:
        if isinstance(b, CLArray) and b.block is a.block:
            b = ew.copy(b)  # a's writes must not feed back into b
        ew.binary(op, a, b, out=a)

    def where(self, cond: CLArray, a: Any, b: Any) -> CLArray:
        return ew.where(cond, a, b)

    def masked_fill(self, h: CLArray, mask: CLArray, value: Any) -> CLArray:
        return ew.where(mask, value, h)

    # -- fusion ------------------------------------------------------------------------------------------------
    def may_share_memory(self, a: Any, b: Any) -> bool:
        return a.block is b.block  # views share their pooled block; distinct blocks never overlap

    def fusion_compile(self, kernel: Any) -> Any:
        """One generated OpenCL kernel per fused block (see :mod:`ember_opencl.fusion`); None where unsupported."""
        from . import fusion

        return fusion.fusion_compile(self, kernel)

    # -- reductions and scans ------------------------------------------------------------------------------------
    def reduce(self, op: str, h: CLArray, dims: tuple[int, ...], keepdim: bool) -> CLArray:
        if h.dtype.is_complex:
            return cx.reduce(op, h, dims, keepdim)
        from . import reduction

        return reduction.reduce(op, h, dims, keepdim)

    def argreduce(self, op: str, h: CLArray, dim: int | None, keepdim: bool) -> CLArray:
        if h.dtype.is_complex:
            raise cx.refuse(op, h.dtype)
        from . import reduction

        return reduction.argreduce(op, h, dim, keepdim)

    def cumulative(self, op: str, h: CLArray, dim: int) -> CLArray:
        if h.dtype.is_complex:
            return cx.cumulative(op, h, dim)
        from . import reduction

        return reduction.cumulative(op, h, dim)

    def softmax(self, h: CLArray, dim: int, log: bool) -> CLArray:
        if h.dtype.is_complex:
            raise cx.refuse("log_softmax" if log else "softmax", h.dtype)
        from . import reduction

        return reduction.softmax(h, dim, log)

    def logsumexp(self, h: CLArray, dims: tuple[int, ...], keepdim: bool) -> CLArray:
        if h.dtype.is_complex:
            raise cx.refuse("logsumexp", h.dtype)
        from . import reduction

        return reduction.logsumexp(h, dims, keepdim)

    # -- linear algebra and convolution --------------------------------------------------------------------------
    def matmul(self, a: CLArray, b: CLArray) -> CLArray:
        if a.dtype.is_complex:
            return cx.matmul(a, b)
        from . import matmul

        return matmul.matmul(a, b)

    def conv(self, x: CLArray, w: CLArray, b: CLArray | None, stride: tuple[int, ...],
             padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> CLArray:
        from . import conv

        return conv.conv(x, w, b, stride, padding, dilation, groups)

    def conv_transpose(self, x: CLArray, w: CLArray, b: CLArray | None, stride: tuple[int, ...],
                       padding: tuple[int, ...], output_padding: tuple[int, ...], dilation: tuple[int, ...],
                       groups: int) -> CLArray:
        from . import conv

        return conv.conv_transpose(x, w, b, stride, padding, output_padding, dilation, groups)

    def conv_input_grad(self, grad_y: CLArray, w: CLArray, x_shape: tuple[int, ...], stride: tuple[int, ...],
                        padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> CLArray:
        """Gradient of ``conv`` w.r.t. its input of shape x_shape (the autodiff decorator uses it)."""
        from . import conv

        return conv.conv_input_grad(grad_y, w, x_shape, stride, padding, dilation, groups)

    def conv_weight_grad(self, x: CLArray, grad_y: CLArray, w_shape: tuple[int, ...], stride: tuple[int, ...],
                         padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> CLArray:
        """Gradient of ``conv`` w.r.t. its weight of shape w_shape (the autodiff decorator uses it)."""
        from . import conv

        return conv.conv_weight_grad(x, grad_y, w_shape, stride, padding, dilation, groups)

    # -- sorting ---------------------------------------------------------------------------------------------------
    def sort(self, h: CLArray, dim: int, descending: bool, stable: bool) -> tuple[CLArray, CLArray]:
        if h.dtype.is_complex:
            raise cx.refuse("sort", h.dtype)
        from . import sorting

        return sorting.sort(h, dim, descending, stable)

    def topk(self, h: CLArray, k: int, dim: int, largest: bool, sorted_: bool) -> tuple[CLArray, CLArray]:
        if h.dtype.is_complex:
            raise cx.refuse("topk", h.dtype)
        from . import sorting

        return sorting.topk(h, k, dim, largest, sorted_)

    # -- movement and indexing -----------------------------------------------------------------------------------
    def reshape(self, h: CLArray, shape: tuple[int, ...]) -> CLArray:
        view = arr.reshape_view(h, tuple(shape))
        if view is None:
            view = arr.reshape_view(ew.copy(h), tuple(shape))
        assert view is not None  # a contiguous array always reshapes to a view
        return view

    def permute(self, h: CLArray, dims: tuple[int, ...]) -> CLArray:
        return arr.permute(h, tuple(dims))

    def expand(self, h: CLArray, shape: tuple[int, ...]) -> CLArray:
        return arr.expand(h, tuple(shape))

    def getitem(self, h: CLArray, key: tuple[Any, ...]) -> CLArray:
        if not any(isinstance(k, CLArray) for k in key):
            return arr.basic_index(h, key)  # ints, slices, None, Ellipsis: a view
        from . import indexing

        return indexing.getitem(h, key)

    def setitem(self, h: CLArray, key: tuple[Any, ...], value: Any) -> None:
        from . import indexing

        indexing.setitem(h, key, value)

    def cat(self, hs: Sequence[CLArray], dim: int) -> CLArray:
        from . import indexing

        return indexing.cat(list(hs), dim)

    def gather(self, h: CLArray, dim: int, index: CLArray) -> CLArray:
        from . import indexing

        return indexing.gather(h, dim, index)

    def scatter(self, h: CLArray, dim: int, index: CLArray, src: Any, reduce: str | None) -> CLArray:
        from . import indexing

        if reduce is not None and h.dtype.is_floating_point and indexing.uses_atomics(h, reduce):
            from ember.runtime import alert_not_deterministic

            # declared in plugin.register_backend_traits: float sums in atomic order differ run to run
            alert_not_deterministic("scatter", self.name, f"reduce={reduce!r}, {h.dtype.name}")
        return indexing.scatter(h, dim, index, src, reduce)

    def index_select(self, h: CLArray, dim: int, index: CLArray) -> CLArray:
        from . import indexing

        return indexing.index_select(h, dim, index)

    def flip(self, h: CLArray, dims: tuple[int, ...]) -> CLArray:
        key = tuple(slice(None, None, -1) if d in dims else slice(None) for d in range(h.ndim))
        return ew.copy(arr.basic_index(h, key))

    def tril(self, h: CLArray, diagonal: int, upper: bool) -> CLArray:
        from . import indexing

        return indexing.tril(h, diagonal, upper)

    def pad(self, h: CLArray, pads: tuple[tuple[int, int], ...], mode: str, value: Any) -> CLArray:
        from . import indexing

        return indexing.pad(h, pads, mode, value)

    # -- pooling and resampling ----------------------------------------------------------------------------------
    def max_pool(self, x: CLArray, kernel_size: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
                 dilation: tuple[int, ...], ceil_mode: bool, return_indices: bool) -> Any:
        from . import pooling

        return pooling.max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    def avg_pool(self, x: CLArray, kernel_size: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
                 ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> CLArray:
        from . import pooling

        return pooling.avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)

    def adaptive_avg_pool(self, x: CLArray, output_size: tuple[int, ...]) -> CLArray:
        from . import pooling

        return pooling.adaptive_avg_pool(x, output_size)

    def adaptive_max_pool(self, x: CLArray, output_size: tuple[int, ...], return_indices: bool) -> Any:
        from . import pooling

        return pooling.adaptive_max_pool(x, output_size, return_indices)

    def interpolate(self, x: CLArray, size: tuple[int, ...], mode: str, align_corners: bool | None,
                    scales: tuple[float, ...] | None) -> CLArray:
        from . import pooling

        return pooling.interpolate(x, size, mode, align_corners, scales)

    # -- random numbers (a counter-based Philox stream per device) -------------------------------------------------
    def seed(self, seed: int) -> None:
        self._rng.seed(seed)

    def rand(self, shape: tuple[int, ...], dtype: DType) -> CLArray:
        return self._rng.uniform(tuple(shape), dtype)

    def randn(self, shape: tuple[int, ...], dtype: DType) -> CLArray:
        return self._rng.normal(tuple(shape), dtype)

    def randint(self, low: int, high: int, shape: tuple[int, ...], dtype: DType) -> CLArray:
        return self._rng.integers(low, high, tuple(shape), dtype)
