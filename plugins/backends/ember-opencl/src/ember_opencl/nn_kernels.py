"""OpenCL kernels for core's neural-network extension ops: ``nn.gelu``, ``nn.gelu_backward``, ``nn.layer_norm``,
``nn.layer_norm_backward`` and ``nn.scaled_dot_product_attention`` (forward).

Without them OpenCL runs the ops' compositions: GELU as a chain of maps, layer norm as two reductions and four
maps, attention as two GEMMs, a softmax and several maps over full (..., L, S) intermediates. Here each is one
launch of a generated program (:mod:`ember_kernels.nn`, shared with the CUDA/HIP catalog); layer norm's backward is
two (dx per row, dweight/dbias per column). Attention's backward keeps its composition (GEMMs and reductions, which
the backend already runs as kernels), reading the probabilities ``attn`` the forward returns.

Strided operands of GELU and layer norm are first copied contiguous; attention reads q, k, v and the mask through
their strides and per-batch offsets (broadcast batch dims and grouped-query heads cost no copy).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember_kernels import nn as gen
from ember_kernels.ctypes_ import ctype

from . import elementwise as ew
from .array import CLArray, empty

__all__ = ["gelu", "gelu_backward", "layer_norm", "layer_norm_backward", "register", "sdpa"]


def _dense(h: CLArray) -> CLArray:
    return h if h.is_contiguous else ew.copy(h)


def _i64(n: int) -> np.int64:
    return np.int64(n)


def _map_grid(rt: Any, n: int) -> tuple[tuple[int], tuple[int]]:
    return rt.grid(max(n, 1))


# -- GELU ----------------------------------------------------------------------------------------------------------
def _gelu(x: CLArray, grad: CLArray | None, approximate: str) -> CLArray:
    rt = x.rt
    x = _dense(x)
    y = empty(rt, x.shape, x.dtype)
    n = x.size
    if n == 0:
        return y
    t = ctype(x.dtype)
    backward = grad is not None
    name = "ember_gelu_backward" if backward else "ember_gelu"
    knl = rt.kernel(gen.gelu_source(t, approximate, backward, rt.is_cpu), name)
    args: list[Any] = [y.buf, _i64(y.eoff), x.buf, _i64(x.eoff)]
    if grad is not None:
        g = _dense(grad)
        args += [g.buf, _i64(g.eoff)]
    gsize, lsize = _map_grid(rt, n)
    knl(rt.queue, gsize, lsize, *args, _i64(n))
    return y


def gelu(backend: Any, x: CLArray, *, approximate: str = "none") -> CLArray:
    """torch's ``gelu`` (exact or tanh) in one launch."""
    return _gelu(x, None, approximate)


def gelu_backward(backend: Any, x: CLArray, grad: CLArray, *, approximate: str = "none") -> CLArray:
    """torch's ``gelu_backward``: dgelu/dx * grad in one launch."""
    return _gelu(x, grad, approximate)


# -- layer norm ----------------------------------------------------------------------------------------------------
def _ln_group(rt: Any, d: int) -> int:
    """Work-items per row: a power of two up to d, at most 256 (GPU) or 16 (a CPU runs a group as one loop)."""
    cap = min(16 if rt.is_cpu else 256, rt.max_work_group)
    wg = 1
    while wg * 2 <= cap and wg < d:
        wg *= 2
    return wg


def layer_norm(backend: Any, x: CLArray, weight: CLArray | None, bias: CLArray | None, *,
               normalized_shape: tuple[int, ...], eps: float = 1e-5) -> tuple[CLArray, CLArray, CLArray]:
    """torch's ``native_layer_norm``: (y, mean, rstd), one work-group per row (see :mod:`ember_kernels.nn`)."""
    rt = x.rt
    k = len(normalized_shape)
    d = math.prod(normalized_shape)
    rows = math.prod(x.shape[:x.ndim - k])
    stat = tuple(x.shape[:x.ndim - k]) + (1,) * k
    x = _dense(x)
    y = empty(rt, x.shape, x.dtype)
    mean = empty(rt, stat, x.dtype)
    rstd = empty(rt, stat, x.dtype)
    if rows == 0:
        return y, mean, rstd
    t = ctype(x.dtype)
    wg = _ln_group(rt, d)
    knl = rt.kernel(gen.layer_norm_source(t, weight is not None, bias is not None, wg), "ember_layer_norm")
    args: list[Any] = [x.buf, _i64(x.eoff)]
    for p in (weight, bias):
        if p is not None:
            p = _dense(p)
            args += [p.buf, _i64(p.eoff)]
    args += [y.buf, _i64(y.eoff), mean.buf, _i64(mean.eoff), rstd.buf, _i64(rstd.eoff), _i64(d), t.arg(eps)]
    knl(rt.queue, (rows * wg,), (wg,), *args)
    return y, mean, rstd


def layer_norm_backward(backend: Any, x: CLArray, weight: CLArray | None, mean: CLArray, rstd: CLArray,
                        dy: CLArray, *, normalized_shape: tuple[int, ...]) -> tuple[CLArray, CLArray, CLArray]:
    """(dx, dweight, dbias) of :func:`layer_norm`: dx one work-group per row, dweight/dbias one work-item per
    column summing the rows in order (see :mod:`ember_kernels.nn`)."""
    rt = x.rt
    k = len(normalized_shape)
    d = math.prod(normalized_shape)
    rows = math.prod(x.shape[:x.ndim - k])
    x, mean, rstd, dy = _dense(x), _dense(mean), _dense(rstd), _dense(dy)
    dx = empty(rt, x.shape, x.dtype)
    dw = empty(rt, tuple(normalized_shape), x.dtype)
    db = empty(rt, tuple(normalized_shape), x.dtype)
    if rows == 0 or d == 0:
        zero = ew.full(rt, tuple(normalized_shape), 0, x.dtype)
        return dx, zero, ew.copy(zero)
    t = ctype(x.dtype)
    wg = _ln_group(rt, d)
    src = gen.layer_norm_backward_source(t, weight is not None, wg)
    stats = [mean.buf, _i64(mean.eoff), rstd.buf, _i64(rstd.eoff), dy.buf, _i64(dy.eoff)]
    args: list[Any] = [x.buf, _i64(x.eoff)]
    if weight is not None:
        w = _dense(weight)
        args += [w.buf, _i64(w.eoff)]
    args += stats + [dx.buf, _i64(dx.eoff), _i64(d)]
    rt.kernel(src, "ember_layer_norm_dx")(rt.queue, (rows * wg,), (wg,), *args)
    gsize, lsize = _map_grid(rt, d)
    rt.kernel(src, "ember_layer_norm_dparams")(rt.queue, gsize, lsize, x.buf, _i64(x.eoff), *stats, dw.buf,
                                               _i64(dw.eoff), db.buf, _i64(db.eoff), _i64(rows), _i64(d))
    return dx, dw, db


# -- attention -----------------------------------------------------------------------------------------------------
_offsets_lock = threading.Lock()
#: per-batch offset arrays on the device, by (runtime, batch dims' shape and strides, GQA repeat, batch): the same
#: for every call of a model's layer, so each is uploaded once
_offsets: dict[tuple[Any, ...], Any] = {}
_OFFSETS_MAX = 256


def _batch_offsets(h: CLArray, repeat: int, batch: tuple[int, ...]) -> Any:
    """A read-only ``cl.Buffer`` (its own, not the pool's: kernels index it from its start) of the int64 element
    offsets (from h's first element) of each batch element's (rows, features) matrix of h, its
    heads (dim -3) repeated ``repeat`` times and its batch dims broadcast to ``batch``."""
    nb = h.ndim - 2
    key = (id(h.rt), h.shape[:nb], h.estrides[:nb], repeat, batch)
    got = _offsets.get(key)
    if got is not None:
        return got
    offs = np.zeros(h.shape[:nb], np.int64)
    for d in range(nb):
        shape = [1] * nb
        shape[d] = h.shape[d]
        offs = offs + np.arange(h.shape[d], dtype=np.int64).reshape(shape) * h.estrides[d]
    if repeat != 1:
        offs = np.repeat(offs, repeat, axis=-1)  # repeat_interleave: head hr reads head hr // repeat
    offs = np.ascontiguousarray(np.broadcast_to(offs, batch)).reshape(-1)
    import pyopencl as cl

    host = offs if offs.size else np.zeros(1, np.int64)
    dev = cl.Buffer(h.rt.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    with _offsets_lock:
        if len(_offsets) >= _OFFSETS_MAX:
            _offsets.clear()
        _offsets[key] = dev
    return dev


def _tiles(rt: Any, is_double: bool) -> tuple[int, int, int]:
    """(query rows per work-group, keys per tile, features per tile)."""
    if rt.is_cpu:
        return min(16, rt.max_work_group), 16, 32
    return min(64, rt.max_work_group), 16, 32 if is_double else 64


def sdpa(backend: Any, q: CLArray, k: CLArray, v: CLArray, mask: CLArray | None, drop: CLArray | None, *,
         scale: float, is_causal: bool = False, repeat_k: int = 1, repeat_v: int = 1,
         mask_grad: bool = False) -> tuple[CLArray, CLArray]:
    """(out, attn) of core's ``nn.scaled_dot_product_attention`` in one launch (see :mod:`ember_kernels.nn`)."""
    from ember.ops.attention import sdpa_shapes

    rt = q.rt
    batch, L, S, ev = sdpa_shapes(q, k, v, mask, repeat_k, repeat_v)
    E = q.shape[-1]
    B = math.prod(batch)
    out = empty(rt, batch + (L, ev), q.dtype)
    attn = empty(rt, batch + (L, S), q.dtype)
    if B * L == 0:
        return out, attn
    if S == 0:  # no keys: every row's probabilities are empty and its output is the empty sum
        return ew.full(rt, batch + (L, ev), 0, q.dtype), attn
    t = ctype(q.dtype)
    acc = dt.float64 if q.dtype is dt.float64 else dt.float32
    wg, tk, ec = _tiles(rt, acc is dt.float64)
    nblk = -(-L // wg)
    scratch = empty(rt, (B * L * S,), acc)
    args: list[Any] = []
    for h, r in ((q, 1), (k, repeat_k), (v, repeat_v)):
        offs = _batch_offsets(h, r, batch)
        args += [h.buf, _i64(h.eoff), offs, _i64(0), _i64(h.estrides[-2]), _i64(h.estrides[-1])]
    mt = None
    if mask is not None:
        mt = ctype(mask.dtype)
        me = mask.view(*_expanded(mask, batch + (L, S)))
        offs = _batch_offsets(me, 1, batch)
        args += [me.buf, _i64(me.eoff), offs, _i64(0), _i64(me.estrides[-2]), _i64(me.estrides[-1])]
    if drop is not None:
        dd = _dense(drop)
        args += [dd.buf, _i64(dd.eoff)]
    args += [out.buf, _i64(out.eoff), attn.buf, _i64(attn.eoff), scratch.buf, _i64(scratch.eoff)]
    args += [_i64(L), _i64(S), _i64(E), _i64(ev), _i64(nblk), ctype(acc).arg(scale)]
    src = gen.sdpa_source(t, mt, is_causal, drop is not None, wg, tk, ec)
    knl = rt.kernel(src, "ember_sdpa")
    knl(rt.queue, (B * nblk * wg,), (wg,), *args)
    return out, attn


def _expanded(h: CLArray, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """The (shape, element strides, offset) of h broadcast to ``shape`` (stride 0 along broadcast dims)."""
    from ember.shapes import expand_strides

    return tuple(shape), expand_strides(h.shape, h.estrides, tuple(shape)), h.offset


def register() -> None:
    """Register the kernels with core's GELU, layer-norm and attention ops (called when the backend is imported)."""
    from ember.ops import attention
    from ember.ops import train_kernels as T

    T.gelu.kernel("opencl")(gelu)
    T.gelu_backward.kernel("opencl")(gelu_backward)
    T.layer_norm.kernel("opencl")(layer_norm)
    T.layer_norm_backward.kernel("opencl")(layer_norm_backward)
    attention.sdpa.kernel("opencl")(sdpa)
