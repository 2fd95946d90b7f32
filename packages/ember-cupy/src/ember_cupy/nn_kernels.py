"""CuPy (CUDA/HIP) kernels for core's neural-network extension ops: ``nn.gelu``, ``nn.gelu_backward``,
``nn.layer_norm``, ``nn.layer_norm_backward`` and ``nn.scaled_dot_product_attention`` (forward).

The programs are :mod:`ember_kernels.nn`'s -- the text ember-opencl runs (on PoCL in CI) and ``ember kernels check
--area nn`` compiles for CUDA and HIP -- launched with ember-opencl's arguments (see ``ember_opencl.nn_kernels``):
arrays are passed as themselves (their data pointer) with element offset 0, strides in elements. GPU geometry:
GELU's grid-stride loop, 256 threads per layer-norm row, 64 query rows per attention block with 16-key by
64-feature (32 for float64) shared-memory tiles.

:func:`register` attaches them to the ops for a backend name (``cuda``, ``rocm``); the backends' plugins call it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember_kernels import nn as gen
from ember_kernels.ctypes_ import ctype

__all__ = ["gelu", "gelu_backward", "layer_norm", "layer_norm_backward", "register", "sdpa"]

_LN_THREADS = 256
_SDPA_ROWS = 64
_SDPA_KEYS = 16
_Z = np.int64(0)  # the element offset of an array passed as itself


def _ctype(h: Any) -> Any:
    return ctype(dt.from_numpy_dtype(h.dtype))


def _est(h: Any) -> tuple[int, ...]:
    return tuple(s // h.itemsize for s in h.strides)


def _gelu(be: Any, x: Any, grad: Any | None, approximate: str) -> Any:
    cp = be.cp
    x = cp.ascontiguousarray(x)
    y = cp.empty(x.shape, dtype=x.dtype)
    n = int(x.size)
    if n == 0:
        return y
    backward = grad is not None
    src = gen.gelu_source(_ctype(x), approximate, backward)
    args: list[Any] = [y, _Z, x, _Z]
    if grad is not None:
        args += [cp.ascontiguousarray(grad), _Z]
    be._launch(src, "ember_gelu_backward" if backward else "ember_gelu", n, args + [np.int64(n)])
    return y


def gelu(be: Any, x: Any, *, approximate: str = "none") -> Any:
    """torch's ``gelu`` (exact or tanh) in one launch."""
    return _gelu(be, x, None, approximate)


def gelu_backward(be: Any, x: Any, grad: Any, *, approximate: str = "none") -> Any:
    """torch's ``gelu_backward`` in one launch."""
    return _gelu(be, x, grad, approximate)


def layer_norm(be: Any, x: Any, weight: Any | None, bias: Any | None, *, normalized_shape: tuple[int, ...],
               eps: float = 1e-5) -> tuple[Any, Any, Any]:
    """torch's ``native_layer_norm``: (y, mean, rstd), one block of 256 threads per row."""
    cp = be.cp
    k = len(normalized_shape)
    d = math.prod(normalized_shape)
    rows = math.prod(x.shape[:x.ndim - k])
    stat = tuple(x.shape[:x.ndim - k]) + (1,) * k
    x = cp.ascontiguousarray(x)
    y = cp.empty(x.shape, dtype=x.dtype)
    mean = cp.empty(stat, dtype=x.dtype)
    rstd = cp.empty(stat, dtype=x.dtype)
    if rows == 0:
        return y, mean, rstd
    t = _ctype(x)
    src = gen.layer_norm_source(t, weight is not None, bias is not None, _LN_THREADS)
    args: list[Any] = [x, _Z]
    for p in (weight, bias):
        if p is not None:
            args += [cp.ascontiguousarray(p), _Z]
    args += [y, _Z, mean, _Z, rstd, _Z, np.int64(d), t.arg(eps)]
    be._launch_groups(src, "ember_layer_norm", rows, _LN_THREADS, args)
    return y, mean, rstd


def layer_norm_backward(be: Any, x: Any, weight: Any | None, mean: Any, rstd: Any, dy: Any, *,
                        normalized_shape: tuple[int, ...]) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias): dx one block of 256 threads per row, dweight/dbias one thread per column."""
    cp = be.cp
    k = len(normalized_shape)
    d = math.prod(normalized_shape)
    rows = math.prod(x.shape[:x.ndim - k])
    x, mean, rstd, dy = (cp.ascontiguousarray(a) for a in (x, mean, rstd, dy))
    dx = cp.empty(x.shape, dtype=x.dtype)
    if rows == 0 or d == 0:
        return dx, cp.zeros(normalized_shape, dtype=x.dtype), cp.zeros(normalized_shape, dtype=x.dtype)
    dw = cp.empty(normalized_shape, dtype=x.dtype)
    db = cp.empty(normalized_shape, dtype=x.dtype)
    src = gen.layer_norm_backward_source(_ctype(x), weight is not None, _LN_THREADS)
    stats = [mean, _Z, rstd, _Z, dy, _Z]
    args: list[Any] = [x, _Z] + ([cp.ascontiguousarray(weight), _Z] if weight is not None else [])
    be._launch_groups(src, "ember_layer_norm_dx", rows, _LN_THREADS, args + stats + [dx, _Z, np.int64(d)])
    be._launch(src, "ember_layer_norm_dparams", d, [x, _Z] + stats + [dw, _Z, db, _Z, np.int64(rows), np.int64(d)])
    return dx, dw, db


def _batch_offsets(cp: Any, h: Any, repeat: int, batch: tuple[int, ...]) -> Any:
    """int64 element offsets (from h's first element) of each batch element's matrix, heads (dim -3) repeated
    ``repeat`` times (GQA's repeat_interleave), batch dims broadcast to ``batch``; on the device."""
    nb = h.ndim - 2
    st = _est(h)
    offs = np.zeros(h.shape[:nb], np.int64)
    for d in range(nb):
        shape = [1] * nb
        shape[d] = h.shape[d]
        offs = offs + np.arange(h.shape[d], dtype=np.int64).reshape(shape) * st[d]
    if repeat != 1:
        offs = np.repeat(offs, repeat, axis=-1)
    offs = np.ascontiguousarray(np.broadcast_to(offs, batch)).reshape(-1)
    return cp.asarray(offs if offs.size else np.zeros(1, np.int64))


def sdpa(be: Any, q: Any, k: Any, v: Any, mask: Any | None, drop: Any | None, *, scale: float,
         is_causal: bool = False, repeat_k: int = 1, repeat_v: int = 1,
         mask_grad: bool = False) -> tuple[Any, Any]:
    """(out, attn) of core's ``nn.scaled_dot_product_attention`` in one launch (see :mod:`ember_kernels.nn`)."""
    from ember.ops.attention import sdpa_shapes

    cp = be.cp
    batch, L, S, ev = sdpa_shapes(q, k, v, mask, repeat_k, repeat_v)
    E = q.shape[-1]
    B = math.prod(batch)
    out = cp.empty(batch + (L, ev), dtype=q.dtype)
    attn = cp.empty(batch + (L, S), dtype=q.dtype)
    if B * L == 0:
        return out, attn
    if S == 0:
        return cp.zeros(batch + (L, ev), dtype=q.dtype), attn
    t = _ctype(q)
    acc = np.float64 if q.dtype == np.float64 else np.float32
    ec = 32 if acc is np.float64 else 64
    nblk = -(-L // _SDPA_ROWS)
    scratch = cp.empty((B * L * S,), dtype=acc)
    args: list[Any] = []
    for h, r in ((q, 1), (k, repeat_k), (v, repeat_v)):
        st = _est(h)
        args += [h, _Z, _batch_offsets(cp, h, r, batch), _Z, np.int64(st[-2]), np.int64(st[-1])]
    mt = None
    if mask is not None:
        mt = _ctype(mask)
        me = cp.broadcast_to(mask, batch + (L, S))
        st = _est(me)
        args += [me, _Z, _batch_offsets(cp, me, 1, batch), _Z, np.int64(st[-2]), np.int64(st[-1])]
    if drop is not None:
        args += [cp.ascontiguousarray(drop), _Z]
    args += [out, _Z, attn, _Z, scratch, _Z]
    args += [np.int64(L), np.int64(S), np.int64(E), np.int64(ev), np.int64(nblk), acc(scale)]
    src = gen.sdpa_source(t, mt, is_causal, drop is not None, _SDPA_ROWS, _SDPA_KEYS, ec)
    be._launch_groups(src, "ember_sdpa", B * nblk, _SDPA_ROWS, args)
    return out, attn


def register(name: str) -> None:
    """Register the kernels with core's GELU, layer-norm and attention ops for the backend ``name``."""
    from ember.ops import attention
    from ember.ops import train_kernels as T

    T.gelu.kernel(name)(gelu)
    T.gelu_backward.kernel(name)(gelu_backward)
    T.layer_norm.kernel(name)(layer_norm)
    T.layer_norm_backward.kernel(name)(layer_norm_backward)
    attention.sdpa.kernel(name)(sdpa)
