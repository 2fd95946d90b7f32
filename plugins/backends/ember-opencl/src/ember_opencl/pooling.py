"""Pooling and resampling kernels: max/avg pooling (fixed and adaptive windows) and interpolate.

Every op is one kernel with one work-item per output element (grid-stride), looping over its window or its
interpolation taps and reading the input through its strides (no padding copy, no contiguous copy). Spatial
ranks 1 and 2 run as rank 3 with leading size-1 dims; the batch dims in front of the spatial ones merge into at
most two (strided) dims. All sizes, strides and modes are kernel arguments, so each dtype compiles a single
program holding the five kernels. Semantics follow PyTorch's CPU kernels (and ember's default compositions):

* max pooling: ``val > best || isnan(val)`` over the in-bounds window in row-major order from -inf, so the
  first maximum and the last NaN win; indices are flat per (N, C) plane. Windows start at ``o*stride - pad``
  and skip the padding in steps of the dilation (torch's ``while (start < 0) start += dilation``).
* average pooling: the window's divisor counts the padding (``count_include_pad``) up to ``size + pad``;
  ``divisor_override`` replaces it. Adaptive windows are ``[floor(o*I/O), ceil((o+1)*I/O))``.
* interpolate: nearest indices in float32 as torch (``nearest`` short-cuts equal and doubled sizes in 2-d, or
  when no scale was given), linear/cubic source coordinates in the op-math type, ``guard_index_and_lambda``,
  cubic convolution with A = -0.75, and linear modes copy a dim whose size does not change. The source
  coordinate ``scale * (o + 0.5) - 0.5`` is one fused multiply-add, as the compiler builds torch's x86 and ARM
  kernels: it decides the taps, and a separately rounded product moves them near integer coordinates. Nothing
  else is contracted (``FP_CONTRACT OFF``), so every device rounds alike.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.errors import ShapeError, UnsupportedError
from ember.shapes import pool_output_size
from ember_kernels.pooling import (  # noqa: F401 (moved to ember-kernels; re-exported)
    _COMMON_ARGS,
    _CPU_LOOP,
    _CPU_NEXT,
    _DECOMPOSE,
    _GPU_LOOP,
    _INTERP_TEMPLATE,
    _LOWEST,
    _TEMPLATE,
    _acc_ctype,
    _program,
    _programs,
)

from . import elementwise as ew
from .array import CLArray, empty
from .ctypes_ import ctype

_RANK = 3  # kernels see every input as (batch0, batch1, D, H, W)
_NARROW = 2**31  # below this many outputs the kernels split the output index in 32 bits

_INTERP_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear", "bicubic", "area")

# -- OpenCL source -------------------------------------------------------------------------------------------------


def _kernel(x: CLArray, name: str, n: int) -> Any:
    rt = x.rt
    return rt.kernel(_program(x.dtype, bool(rt.fp64), n >= _NARROW, rt.is_cpu), name)


# -- host side ---------------------------------------------------------------------------------------------------
def _i64(*values: int) -> list[np.int64]:
    return [np.int64(v) for v in values]


def _layout(op: str, x: CLArray, nd: int) -> tuple[CLArray, tuple[int, ...], list[np.int64], tuple[int, ...]]:
    """(x, lead shape, the common kernel arguments after n, padded input sizes) for op over nd trailing dims.

    The batch dims merge where their strides allow into (L0, L1); more than two that do not merge are copied."""
    if not 1 <= nd <= _RANK or x.ndim < nd:
        raise ShapeError(f"{op}: {nd} spatial dims over an input of shape {x.shape} (1 to {_RANK} supported on "
                         f"opencl)")
    lead = tuple(x.shape[: x.ndim - nd])
    merged: list[list[int]] = []
    for size, stride in zip(lead, x.estrides[: x.ndim - nd]):
        if size == 1:
            continue
        if merged and merged[-1][1] == stride * size:
            merged[-1] = [merged[-1][0] * size, stride]
        else:
            merged.append([size, stride])
    if len(merged) > 2:
        x = ew.copy(x)
        merged = [[math.prod(lead), math.prod(x.shape[x.ndim - nd:])]]
    while len(merged) < 2:
        merged.insert(0, [1, 0])
    sizes = (1,) * (_RANK - nd) + tuple(x.shape[x.ndim - nd:])
    strides = (0,) * (_RANK - nd) + tuple(x.estrides[x.ndim - nd:])
    return x, lead, _i64(merged[1][0], merged[0][1], merged[1][1], *sizes, *strides), sizes


def _pad3(values: tuple[int, ...], fill: int) -> tuple[int, ...]:
    return (fill,) * (_RANK - len(values)) + tuple(int(v) for v in values)


def _launch(kernel: Any, x: CLArray, n: int, args: list[Any]) -> None:
    gsize, lsize = x.rt.grid(n)
    kernel(x.rt.queue, gsize, lsize, *args)


def _max(op: str, x: CLArray, nd: int, out_size: tuple[int, ...], window: list[np.int64], adaptive: bool,
         return_indices: bool) -> Any:
    x, lead, common, _ = _layout(op, x, nd)
    shape = lead + tuple(out_size)
    out = empty(x.rt, shape, x.dtype)
    idx = empty(x.rt, shape, dt.int64) if return_indices else None
    n = out.size
    if n:
        args: list[Any] = [out.buf, np.int64(out.eoff)]
        args += [idx.buf, np.int64(idx.eoff), np.int32(1)] if idx is not None else [out.buf, np.int64(0), np.int32(0)]
        args += [np.int32(adaptive), x.buf, np.int64(x.eoff), np.int64(n), *common, *_i64(*_pad3(out_size, 1))]
        _launch(_kernel(x, "ember_max_pool", n), x, n, args + window)
    return (out, idx) if return_indices else out


def max_pool(x: CLArray, kernel_size: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
             dilation: tuple[int, ...], ceil_mode: bool, return_indices: bool) -> Any:
    """Max pooling over the trailing len(kernel_size) dims; with return_indices also the int64 argmax, a flat index
    into each input plane (PyTorch). NaN wins over numbers; among equal maxima the first in row-major order."""
    nd = len(kernel_size)
    spatial = x.shape[x.ndim - nd:]
    out_size = tuple(pool_output_size(L, k, s, p, d, ceil_mode)
                     for L, k, s, p, d in zip(spatial, kernel_size, stride, padding, dilation))
    window = _i64(*_pad3(kernel_size, 1), *_pad3(stride, 1), *_pad3(padding, 0), *_pad3(dilation, 1))
    return _max("max_pool", x, nd, out_size, window, False, return_indices)


def adaptive_max_pool(x: CLArray, output_size: tuple[int, ...], return_indices: bool) -> Any:
    """Max over the windows [floor(o*I/O), ceil((o+1)*I/O)) of the trailing len(output_size) dims (+ indices)."""
    nd = len(output_size)
    window = _i64(*(1,) * _RANK, *(1,) * _RANK, *(0,) * _RANK, *(1,) * _RANK)
    return _max("adaptive_max_pool", x, nd, tuple(int(o) for o in output_size), window, True, return_indices)


def _avg(op: str, x: CLArray, nd: int, out_size: tuple[int, ...], tail: list[Any], adaptive: bool) -> CLArray:
    x, lead, common, _ = _layout(op, x, nd)
    out = empty(x.rt, lead + tuple(out_size), x.dtype)
    n = out.size
    if n:
        args = [out.buf, np.int64(out.eoff), np.int32(adaptive), x.buf, np.int64(x.eoff), np.int64(n), *common,
                *_i64(*_pad3(out_size, 1))]
        _launch(_kernel(x, "ember_avg_pool", n), x, n, args + tail)
    return out


def avg_pool(x: CLArray, kernel_size: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
             ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> CLArray:
    """Average pooling over the trailing len(kernel_size) dims (sums in float, double for float64)."""
    nd = len(kernel_size)
    spatial = x.shape[x.ndim - nd:]
    out_size = tuple(pool_output_size(L, k, s, p, 1, ceil_mode) for L, k, s, p in zip(spatial, kernel_size, stride,
                                                                                     padding))
    tail = [*_i64(*_pad3(kernel_size, 1), *_pad3(stride, 1), *_pad3(padding, 0)), np.int32(bool(count_include_pad)),
            np.int64(int(divisor_override) if divisor_override else 0)]
    return _avg("avg_pool", x, nd, out_size, tail, False)


def adaptive_avg_pool(x: CLArray, output_size: tuple[int, ...]) -> CLArray:
    """Mean over the windows [floor(o*I/O), ceil((o+1)*I/O)) of the trailing len(output_size) dims."""
    nd = len(output_size)
    tail = [*_i64(*(1,) * _RANK, *(1,) * _RANK, *(0,) * _RANK), np.int32(1), np.int64(0)]
    return _avg("adaptive_avg_pool", x, nd, tuple(int(o) for o in output_size), tail, True)


def _user_scale(scales: Any, d: int) -> float | None:
    if scales is None:
        return None
    s = scales[d] if len(scales) > 1 else scales[0]
    return float(s) if s is not None and s > 0 else None


def interpolate(x: CLArray, size: tuple[int, ...], mode: str, align_corners: bool | None,
                scales: tuple[float, ...] | None) -> CLArray:
    """Resize the trailing len(size) dims (torch.nn.functional.interpolate); scales are the user's scale factors
    (output / input) when torch would hand them to its kernel, which then steps the source by 1 / scale."""
    if mode not in _INTERP_MODES:
        raise UnsupportedError(f"interpolate: mode {mode!r} is not supported on opencl (one of "
                               f"{', '.join(_INTERP_MODES)}; input shape {x.shape}, dtype {x.dtype})")
    size = tuple(int(s) for s in size)
    if mode == "area":
        return adaptive_avg_pool(x, size)
    nd = len(size)
    x, lead, common, sizes = _layout("interpolate", x, nd)
    out = empty(x.rt, lead + size, x.dtype)
    n = out.size
    if not n:
        return out
    out_size = _pad3(size, 1)
    user = (None,) * (_RANK - nd) + tuple(_user_scale(scales, d) for d in range(nd))
    head = [out.buf, np.int64(out.eoff), x.buf, np.int64(x.eoff), np.int64(n), *common, *_i64(*out_size)]
    codes = []
    if mode in ("nearest", "nearest-exact"):
        factors = []
        for n_in, n_out, s in zip(sizes, out_size, user):
            # torch's nearest_idx short-cuts equal and doubled sizes; its 1-d and 3-d kernels only without a scale
            short = mode == "nearest" and (nd == 2 or s is None)
            codes.append(0 if short and n_in == n_out else 2 if short and n_out == 2 * n_in else 1)
            factors.append(np.float32(1.0 / s) if s is not None else np.float32(n_in) / np.float32(n_out))
        args = head + [np.float32(f) for f in factors] + [np.int32(c) for c in codes]
        _launch(_kernel(x, "ember_nearest", n), x, n, args + [np.int32(mode == "nearest-exact")])
        return out
    cubic = mode == "bicubic"
    ac = bool(align_corners)
    acc = _acc_ctype(ctype(x.dtype), bool(x.rt.fp64))
    real = acc.scalar
    factors = []
    for n_in, n_out, s in zip(sizes, out_size, user):
        # linear modes copy a dim whose size is kept, whatever the scale; cubic honours a given scale there
        codes.append(0 if n_in == n_out and (not cubic or ac or s is None or s == 1.0) else 1)
        if ac:
            factors.append(real(n_in - 1) / real(n_out - 1) if n_out > 1 else real(0))
        else:
            factors.append(real(1.0 / s) if s is not None else real(n_in) / real(n_out))
    args = head + [real(f) for f in factors] + [np.int32(c) for c in codes] + [np.int32(ac)]
    _launch(_kernel(x, "ember_interp_cubic" if cubic else "ember_interp_linear", n), x, n, args)
    return out
