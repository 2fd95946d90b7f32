"""Reductions (sum/prod/max/min, argmax/argmin), inclusive scans, softmax and logsumexp.

Every op views its input logically as (outer rows) x (reduced length) without copying: the kept dims and the reduced
dims are each collapsed (neighbours merged when their strides allow, in their original order, so a flat index over
the reduced dims is the C-order index argmax needs) and passed to the kernel as sizes and element strides. Two kernel
shapes serve every layout:

* ``row``: work-groups stride over (row, chunk) pairs; the items of a group read the row interleaved (coalesced
  when the reduced dim is the inner one) and combine their results in a local-memory tree.
* ``col``: one work-item per (row, chunk), reading its chunk sequentially; used when the rows are short or when
  the kept dims are inner in memory (e.g. a sum over dim 0), so neighbouring items read neighbouring elements.

When there are too few rows to fill the device, each row is split into G chunks: pass 1 writes per-chunk partials
(float for float16/bfloat16 inputs), pass 2 reduces them with G = 1. float sums are compensated (Kahan) per item
and then combined in the tree; integer sums and products wrap in the input dtype as numpy's do.

Kernel variants depend only on (op, dtypes, number of collapsed reduced dims, pass); every size and stride is a
kernel argument, so a new shape never compiles anything.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.dtypes import DType
from ember_kernels.reduction import (  # noqa: F401 (moved to ember-kernels; re-exported)
    _BOOL_OP,
    _HALF,
    _INT_LIMITS,
    _LANES,
    _SHORT,
    _TILE,
    _UNSIGNED,
    OMAX,
    RMAX,
    _acc_dtype,
    _better_fn,
    _carry,
    _comb_fn,
    _group_tree,
    _identity,
    _lse_source,
    _lse_sources,
    _outer_code,
    _outer_params,
    _red_offset,
    _red_params,
    _red_sources,
    _reduce_source,
    _reduced_walk,
    _run_kernel,
    _scan_source,
    _scan_sources,
    _softmax_source,
    _softmax_sources,
    _tile_kernel,
)

from . import elementwise as ew
from .array import CLArray, contiguous_strides, empty, permute
from .ctypes_ import CType, ctype

# -- layout helpers -----------------------------------------------------------------------------------------------


def _collapse(shape: list[int], strides: list[int]) -> tuple[list[int], list[int]]:
    """Drop size-1 dims and merge neighbours that are contiguous relative to each other (order kept)."""
    out_shape: list[int] = []
    out_strides: list[int] = []
    for n, s in zip(shape, strides):
        if n == 1:
            continue
        if out_shape and out_strides[-1] == s * n:
            out_shape[-1] *= n
            out_strides[-1] = s
        else:
            out_shape.append(n)
            out_strides.append(s)
    return out_shape, out_strides


def _split(h: CLArray, dims: tuple[int, ...]) -> tuple[CLArray, list[int], list[int], list[int], list[int]]:
    """(h or a contiguous copy of it, outer sizes, outer strides, reduced sizes, reduced strides)."""
    red = sorted(set(dims))
    kept = [d for d in range(h.ndim) if d not in red]
    osh, ost = _collapse([h.shape[d] for d in kept], [h.estrides[d] for d in kept])
    rsh, rst = _collapse([h.shape[d] for d in red], [h.estrides[d] for d in red])
    if len(osh) > OMAX or len(rsh) > RMAX:
        # too scattered to decompose: a contiguous copy with the reduced dims last (logical order preserved)
        h = ew.copy(permute(h, tuple(kept + red)))
        rows, n = math.prod(h.shape[: len(kept)]), math.prod(h.shape[len(kept):])
        osh, ost = ([rows], [n]) if rows != 1 else ([], [])
        rsh, rst = [n], [1]
    if not rsh:
        rsh, rst = [1], [0]
    return h, osh, ost, rsh, rst


def _outer_joint(h: CLArray, out: CLArray, dim: int) -> tuple[CLArray, tuple[int, ...], tuple[int, ...],
                                                                  tuple[int, ...]]:
    """The dims other than dim, collapsed jointly for h and out (h copied contiguous when they are too many)."""
    others = [d for d in range(h.ndim) if d != dim]
    shape = tuple(h.shape[d] for d in others)
    osh, (ist, pst) = ew.collapse(shape, [tuple(h.estrides[d] for d in others),
                                          tuple(out.estrides[d] for d in others)])
    if len(osh) > OMAX:
        h = ew.copy(h)
        osh, (ist, pst) = ew.collapse(shape, [tuple(h.estrides[d] for d in others),
                                              tuple(out.estrides[d] for d in others)])
    return h, osh, ist, pst


def _outer_args(osh: Any, *strides: Any) -> list[np.int64]:
    pad = OMAX - len(osh)
    args = [np.int64(v) for v in [1] * pad + list(osh)]
    for st in strides:
        args += [np.int64(v) for v in [0] * pad + list(st)]
    return args


def _red_args(rsh: list[int], rst: list[int]) -> list[np.int64]:
    return [np.int64(v) for v in rsh + rst]


def _out_shape(shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if d in dims else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in dims)


def _acc_itemsize(t: CType) -> int:
    """Bytes of one element of t's compute type (local-memory sizing)."""
    return _acc_dtype(t.dtype).itemsize


# -- sizing ------------------------------------------------------------------------------------------------------
def _target_groups(rt: Any) -> int:
    """Work-groups that keep every compute unit busy."""
    return rt.compute_units * (2 if rt.is_cpu else 8)


def _target_items(rt: Any) -> int:
    """Work-items that keep every compute unit busy (one-item-per-row kernels)."""
    return rt.compute_units * (128 if rt.is_cpu else 2048)


_wg_caps: dict[int, int] = {}


def _local_size(rt: Any, kernel: Any, length: int) -> int:
    """A power-of-two work-group size for rows of this length (the tree needs a power of two), within what
    kernel (when given) can launch."""
    cap = rt.max_work_group
    if kernel is not None:
        cap = _wg_caps.get(id(kernel), 0)
        if not cap:
            import pyopencl as cl

            info = cl.kernel_work_group_info.WORK_GROUP_SIZE
            cap = _wg_caps[id(kernel)] = int(kernel.get_work_group_info(info, rt.device))
    local = 1 << (min(rt.ew_local, cap, rt.max_work_group).bit_length() - 1)
    while local > 16 and local > length:
        local //= 2
    return local


def _cpu_local(rt: Any, items: int) -> int:
    """Work-group size for one-item-per-task CPU kernels: as large as ew_local while every core still gets a few
    groups (PoCL spreads work-groups, not work-items, over its threads)."""
    local = rt.ew_local
    while local > 1 and -(-items // local) < 4 * rt.compute_units:
        local //= 2
    return local


def _chunks(length: int, want: int) -> tuple[int, int]:
    """(chunk count, chunk length) splitting length into at most want non-empty chunks."""
    want = max(1, min(want, length))
    size = -(-length // want)
    return -(-length // size), size


def _local_mem(nbytes: int) -> Any:
    import pyopencl as cl

    return cl.LocalMemory(max(nbytes, 8))


# -- OpenCL C snippets -----------------------------------------------------------------------------------------------


# -- reduce / argreduce kernels ---------------------------------------------------------------------------------


def _reduce(op: str, arg: bool, h: CLArray, dims: tuple[int, ...], out_shape: tuple[int, ...], out_dtype: DType,
            xi: CLArray | None = None, final: bool = False) -> CLArray:
    """Reduce h over dims into a new contiguous array of out_shape (pass 2 when xi or final is given)."""
    rt = h.rt
    if math.prod(out_shape) == 0:
        return empty(rt, out_shape, out_dtype)
    h, osh, ost, rsh, rst = _split(h, dims)
    rows, length = math.prod(osh), math.prod(rsh)
    if length == 0:  # max/min/argmax of nothing are rejected by core; bool min is all() of nothing
        return ew.full(rt, out_shape, 1 if op in ("prod", "min") else 0, out_dtype)
    tin = ctype(h.dtype)
    col = length <= _SHORT or (bool(ost) and abs(ost[-1]) < min(abs(s) for s in rst))
    tile = rt.is_cpu and col and rows >= 2 * _TILE
    if rt.is_cpu:  # one work-item per (row or tile of rows, chunk): enough chunks to feed every core, each long
        # enough to pay for its partial
        tasks = -(-rows // _TILE) if tile else rows
        want = 1 if final or tasks >= _target_items(rt) else min(-(-_target_items(rt) // tasks), length // 2048)
        groups, chunk = _chunks(length, want)
    elif col:
        want = 1 if final or rows >= _target_items(rt) else min(-(-_target_items(rt) // rows), length // 64)
        groups, chunk = _chunks(length, want)
    else:
        local = _local_size(rt, None, length)
        want = 1 if final or rows >= _target_groups(rt) else min(-(-_target_groups(rt) // rows),
                                                                  length // (local * 16))
        groups, chunk = _chunks(length, want)
    if groups > 1:  # pass 1 writes partials in the accumulation dtype, pass 2 reduces them
        pdt = _acc_dtype(h.dtype)
        pshape = (groups, rows) if col else (rows, groups)
        pv = empty(rt, pshape, pdt)
        pi = empty(rt, pshape, dt.int64) if arg else None
        tout = ctype(pdt)
        outs: list[Any] = ([pi.buf, np.int64(pi.eoff), pv.buf, np.int64(pv.eoff), np.int32(1)] if pi is not None
                           else [pv.buf, np.int64(pv.eoff)])
        result = None
    else:
        out = empty(rt, out_shape, out_dtype)
        tout = ctype(out_dtype)
        outs = ([out.buf, np.int64(out.eoff), out.buf, np.int64(0), np.int32(0)] if arg
                else [out.buf, np.int64(out.eoff)])
        result = out
    src = _reduce_source(op, tin, tout if not arg else ctype(dt.int64), len(rsh), arg, xi is not None, rt.is_cpu)
    args: list[Any] = [*outs, h.buf, np.int64(h.eoff)]
    if xi is not None:
        args += [xi.buf, np.int64(xi.eoff)]
    args += [np.int64(rows), np.int64(length), np.int64(groups), np.int64(chunk)]
    args += _outer_args(osh, ost) + _red_args(rsh, rst)
    if tile:
        total = -(-rows // _TILE) * groups
        local = _cpu_local(rt, total)
        rt.kernel(src, "ember_red_tile")(rt.queue, (-(-total // local) * local,), (local,), *args)
    elif rt.is_cpu:
        kernel = rt.kernel(src, "ember_red_run")
        args.append(np.int32(col))
        total = rows * groups
        local = _cpu_local(rt, total)
        kernel(rt.queue, (-(-total // local) * local,), (local,), *args)
    elif col:
        kernel = rt.kernel(src, "ember_red_col")
        gsize, lsize = rt.grid(rows * groups)
        kernel(rt.queue, gsize, lsize, *args)
    else:
        kernel = rt.kernel(src, "ember_red_row")
        local = _local_size(rt, kernel, length)
        args.append(_local_mem(local * _acc_itemsize(tin)))
        if arg:
            args.append(_local_mem(local * 8))
        ngroups = min(rows * groups, max(rt.ew_max_groups, _target_groups(rt)))
        kernel(rt.queue, (ngroups * local,), (local,), *args)
    if result is not None:
        return result
    return _reduce(op, arg, pv, (0 if col else 1,), out_shape, out_dtype, xi=pi, final=True)


def reduce(op: str, h: CLArray, dims: tuple[int, ...], keepdim: bool) -> CLArray:
    """sum/prod/max/min of h over dims (result dtype = h's; max/min propagate NaN; ints wrap)."""
    if h.dtype is dt.bool_:
        op = _BOOL_OP.get(op, op)
    return _reduce(op, False, h, dims, _out_shape(h.shape, dims, keepdim), h.dtype)


def argreduce(op: str, h: CLArray, dim: int | None, keepdim: bool) -> CLArray:
    """argmax/argmin (int64) along dim, or over the flattened tensor when dim is None; the first occurrence wins
    and NaN counts as the extreme value."""
    dims = tuple(range(h.ndim)) if dim is None else (dim,)
    return _reduce(op, True, h, dims, _out_shape(h.shape, dims, keepdim), dt.int64)


# -- logsumexp ------------------------------------------------------------------------------------------------------


def _lse_composed(h: CLArray, dims: tuple[int, ...], keepdim: bool) -> CLArray:
    """The core default composition (used for few, very long rows, where the two-pass reductions parallelise)."""
    m = reduce("max", h, dims, True)
    m = ew.where(ew.unary("isfinite", m), m, 0.0)
    s = reduce("sum", ew.unary("exp", ew.binary("sub", h, m)), dims, True)
    r = ew.binary("add", ew.unary("log", s), m)
    if keepdim:
        return r
    shape = _out_shape(h.shape, dims, False)
    return r.view(shape, contiguous_strides(shape), r.offset)


def logsumexp(h: CLArray, dims: tuple[int, ...], keepdim: bool) -> CLArray:
    """log(sum(exp(h))) over dims, stably (max shifted out; rows of -inf give -inf, NaN propagates)."""
    rt = h.rt
    out_shape = _out_shape(h.shape, dims, keepdim)
    if math.prod(out_shape) == 0:
        return empty(rt, out_shape, h.dtype)
    src_h, osh, ost, rsh, rst = _split(h, dims)
    rows, length = math.prod(osh), math.prod(rsh)
    if length == 0:
        return ew.full(rt, out_shape, -math.inf, h.dtype)
    if rows < _target_groups(rt) and length > 4096:
        return _lse_composed(h, dims, keepdim)
    t = ctype(h.dtype)
    src = _lse_source(t, len(rsh))
    out = empty(rt, out_shape, h.dtype)
    args = [out.buf, np.int64(out.eoff), src_h.buf, np.int64(src_h.eoff), np.int64(rows), np.int64(length)]
    args += _outer_args(osh, ost) + _red_args(rsh, rst)
    if length <= _SHORT or (bool(ost) and abs(ost[-1]) < min(abs(s) for s in rst)):
        gsize, lsize = rt.grid(rows)
        rt.kernel(src, "ember_lse_col")(rt.queue, gsize, lsize, *args)
    else:
        kernel = rt.kernel(src, "ember_lse_row")
        local = _local_size(rt, kernel, length)
        args.append(_local_mem(local * _acc_itemsize(t)))
        ngroups = min(rows, rt.ew_max_groups)
        kernel(rt.queue, (ngroups * local,), (local,), *args)
    return out


# -- softmax ---------------------------------------------------------------------------------------------------------


def _softmax_composed(h: CLArray, dim: int, log: bool) -> CLArray:
    """The core default composition (used for few, very long rows)."""
    z = ew.binary("sub", h, reduce("max", h, (dim,), True))  # an infinite max gives a NaN row, as in PyTorch
    if log:
        return ew.binary("sub", z, ew.unary("log", reduce("sum", ew.unary("exp", z), (dim,), True)))
    e = ew.unary("exp", z)
    return ew.binary("div", e, reduce("sum", e, (dim,), True))


def softmax(h: CLArray, dim: int, log: bool) -> CLArray:
    """softmax (or log_softmax) of h along dim, one fused kernel per row (max, sum of exp, write)."""
    rt = h.rt
    out = empty(rt, h.shape, h.dtype)
    if out.size == 0:
        return out
    length = h.shape[dim]
    rows = out.size // length
    if rows < _target_groups(rt) and length > 4096:
        return _softmax_composed(h, dim, log)
    h, osh, ist, pst = _outer_joint(h, out, dim)
    t = ctype(h.dtype)
    src = _softmax_source(t)
    args = [out.buf, np.int64(out.eoff), h.buf, np.int64(h.eoff), np.int64(rows), np.int64(length),
            np.int64(h.estrides[dim]), np.int64(out.estrides[dim]), np.int32(log)]
    args += _outer_args(osh, ist, pst)
    if length <= _SHORT or (bool(ist) and abs(ist[-1]) < abs(h.estrides[dim])):
        gsize, lsize = rt.grid(rows)
        rt.kernel(src, "ember_softmax_col")(rt.queue, gsize, lsize, *args)
    else:
        kernel = rt.kernel(src, "ember_softmax_row")
        local = _local_size(rt, kernel, length)
        args.append(_local_mem(local * _acc_itemsize(t)))
        kernel(rt.queue, (min(rows, rt.ew_max_groups) * local,), (local,), *args)
    return out


# -- inclusive scans -------------------------------------------------------------------------------------------------


def _scan(op: str, h: CLArray, dim: int) -> CLArray:
    rt = h.rt
    out = empty(rt, h.shape, h.dtype)
    if out.size == 0:
        return out
    length = h.shape[dim]
    rows = out.size // length
    h, osh, ist, pst = _outer_joint(h, out, dim)
    sx, so = h.estrides[dim], out.estrides[dim]
    t = ctype(h.dtype)
    src = _scan_source(op, t)
    outer = _outer_args(osh, ist, pst)
    column = bool(ist) and abs(ist[-1]) < abs(sx)
    if length <= 2 * _SHORT or rows >= _target_items(rt) or (column and rows >= _target_groups(rt) * 32):
        gsize, lsize = rt.grid(rows)
        rt.kernel(src, "ember_scan_seq")(rt.queue, gsize, lsize, out.buf, np.int64(out.eoff), h.buf,
                                         np.int64(h.eoff), np.int64(rows), np.int64(length), np.int64(sx),
                                         np.int64(so), *outer)
        return out
    block = rt.kernel(src, "ember_scan_block")
    local = _local_size(rt, block, length)
    want = 1 if rows >= _target_groups(rt) else min(-(-_target_groups(rt) // rows), length // (local * 16))
    groups, chunk = _chunks(length, want)
    acc_t = ctype(_acc_dtype(h.dtype))
    ngroups = min(rows * groups, max(rt.ew_max_groups, _target_groups(rt)))
    carry: CLArray = out  # unused unless there are several chunks per row
    if groups > 1:
        totals = empty(rt, (rows, groups), acc_t.dtype)
        rt.kernel(src, "ember_scan_totals")(
            rt.queue, (ngroups * local,), (local,), totals.buf, np.int64(totals.eoff), h.buf, np.int64(h.eoff),
            np.int64(rows), np.int64(length), np.int64(groups), np.int64(chunk), np.int64(sx), *outer,
            _local_mem(local * _acc_itemsize(t)))
        carry = _scan(op, totals, 1)
    block(rt.queue, (ngroups * local,), (local,), out.buf, np.int64(out.eoff), h.buf, np.int64(h.eoff), carry.buf,
          np.int64(carry.eoff), np.int32(groups > 1), np.int64(rows), np.int64(length), np.int64(groups),
          np.int64(chunk), np.int64(sx), np.int64(so), *outer, _local_mem(local * _acc_itemsize(t)))
    return out


def cumulative(op: str, h: CLArray, dim: int) -> CLArray:
    """Inclusive cumsum/cumprod of h along dim in h's dtype (float16/bfloat16 accumulate in float; ints wrap)."""
    if h.dtype is dt.bool_:
        op = _BOOL_OP[op]
    return _scan(op, h, dim)
