"""Pooling on WebGPU: one kernel for max, average and their adaptive forms, one invocation per output element.

Each output element walks its window (1/2/3-d; stride, padding, dilation, ceil mode, or PyTorch's adaptive
windows ``[floor(i*n/o), ceil((i+1)*n/o))``) over a strided ``(B, *S)`` view of the input -- no padded copy.

* max: PyTorch's running update ``(v > best) || isnan(v)`` from ``-inf`` (the type's lowest value for integers)
  with the index of the first position in the input, so NaN propagates and ties keep the first maximum; the
  indices are flat per input plane (int64), as ``max_pool(..., return_indices=True)`` returns them.
* avg: the sum of the positions inside the input, divided by ``divisor_override``, or the window's size clipped to
  the padded input (``count_include_pad``) or to the input, or the adaptive window's size.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from ember import dtypes as dt
from ember.dtypes import DType
from ember.shapes import pool_output_size

from . import wgsl
from .array import WArray, empty

#: words per spatial dim: input length, input stride, output length, window taps, stride, low padding, dilation
_DIM = 7
_HEAD = 7


@functools.cache
def pool_source(kind: str, dtype: DType, adaptive: bool, indices: bool) -> str:
    """kind "max" or "avg"; ``p`` = [total, nd, offset, batch stride, count_include_pad, divisor_override,
    outputs per plane, per dim 7 words]."""
    ct = wgsl.ctype(dtype)
    lowest = {"f32": "-f_inf()", "i32": "i32(-2147483647 - 1)", "i64": "i64(-9223372036854775807 - 1)"}[ct]
    binds = [f"var<storage, read> x: array<{wgsl.stype(dtype)}>;",
             f"var<storage, read_write> out: array<{wgsl.stype(dtype)}>;"]
    if indices:
        binds.append("var<storage, read_write> idx: array<i64>;")
    binds.append("var<storage, read> p: array<i32>;")
    body = "".join(f"@group(0) @binding({k}) {b}\n" for k, b in enumerate(binds))
    body += ("@compute @workgroup_size(256)\n"
             "fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {\n"
             "  let i = i32(gid.x + gid.y * nwg.x * 256u);\n"
             "  if (i >= p[0]) { return; }\n"
             "  let nd = p[1];\n"
             "  let plane = i / p[6]; var orem = i % p[6];\n"
             "  var start: array<i32, 3>; var taps: array<i32, 3>; var ntaps = 1; var div = 1; var valid = 1;\n"
             "  for (var d = nd - 1; d >= 0; d = d - 1) {\n"
             f"    let q = {_HEAD} + {_DIM} * d;\n"
             "    let o = orem % p[q + 2]; orem = orem / p[q + 2];\n")
    if adaptive:
        body += ("    let s0 = (o * p[q]) / p[q + 2]; let s1 = ((o + 1) * p[q] + p[q + 2] - 1) / p[q + 2];\n"
                 "    start[d] = s0; taps[d] = s1 - s0; div = div * (s1 - s0); valid = valid * (s1 - s0);\n")
    else:
        body += ("    let s0 = o * p[q + 4] - p[q + 5];\n"
                 "    start[d] = s0; taps[d] = p[q + 3];\n"
                 "    let e = min(s0 + p[q + 3], p[q] + p[q + 5]);\n"
                 "    div = div * (e - s0);\n"
                 "    valid = valid * (min(e, p[q]) - max(s0, 0));\n")
    body += "    ntaps = ntaps * taps[d];\n  }\n"
    if kind == "max":
        body += (f"  var best: {ct} = {lowest};\n"
                 "  var bi = -1;\n")
    else:
        body += "  var acc = 0.0;\n"
    body += ("  for (var t = 0; t < ntaps; t = t + 1) {\n"
             "    var tr = t; var off = p[2] + plane * p[3]; var flat = 0; var fmul = 1; var ok = true;\n"
             "    for (var d = nd - 1; d >= 0; d = d - 1) {\n"
             f"      let q = {_HEAD} + {_DIM} * d;\n"
             "      let k = tr % taps[d]; tr = tr / taps[d];\n"
             f"      let pos = start[d] + k * {'1' if adaptive else 'p[q + 6]'};\n"
             "      ok = ok && pos >= 0 && pos < p[q];\n"
             "      off = off + pos * p[q + 1]; flat = flat + pos * fmul; fmul = fmul * p[q];\n    }\n"
             "    if (ok) {\n"
             f"      let v = {wgsl.load(dtype, 'x[off]')};\n")
    if kind == "max":
        nan = " || is_nan(v)" if ct == "f32" else ""
        body += (f"      if (bi < 0) {{ bi = flat; }}\n"
                 f"      if (v > best{nan}) {{ best = v; bi = flat; }}\n")
    else:
        body += "      acc = acc + v;\n"
    body += "    }\n  }\n"
    if kind == "max":
        body += f"  out[i] = {wgsl.store(dtype, 'best')};\n"
        if indices:
            body += "  idx[i] = i64(bi);\n"
    else:
        body += ("  var den = f32(select(select(valid, div, p[4] != 0), p[5], p[5] != 0));\n"
                 f"  out[i] = {wgsl.store(dtype, 'acc / den')};\n")
    body += "}\n"
    from .kernels import _with_library

    return _with_library(body, [dtype, dt.int64] if indices else [dtype])


def _pool(be: Any, kind: str, x: WArray, out: tuple[int, ...], words: list[int], adaptive: bool, indices: bool,
          count_include_pad: bool = False, divisor_override: int | None = None) -> Any:
    from .kernels import _params

    nd = len(out)
    lead = x.shape[:x.ndim - nd]
    B = math.prod(lead)
    xb = be.reshape(x, (B, *x.shape[x.ndim - nd:]))
    rt = x.rt
    y = empty(rt, (*lead, *out), x.dtype)
    ix = empty(rt, (*lead, *out), dt.int64) if indices else None
    total = y.size
    if total:
        spatial: list[int] = []
        for d in range(nd):
            spatial += [xb.shape[1 + d], xb.estrides[1 + d], out[d], *words[4 * d:4 * d + 4]]
        prm = _params(rt, [total, nd, xb.offset, xb.estrides[0], int(count_include_pad), int(divisor_override or 0),
                           math.prod(out), *spatial])
        bufs = [xb.buf, y.buf] + ([ix.buf] if ix is not None else []) + [prm.buffer]
        rt.launch(pool_source(kind, x.dtype, adaptive, indices), bufs, -(-total // 256))
    return (y, ix) if indices else y


def supported(x: WArray, kind: str) -> bool:
    """Whether the kernels handle ``x`` (floating point for averages, and no bool; the rest uses the default
    compositions, which raise the contract's errors)."""
    if x.dtype is dt.bool_:
        return False
    return x.dtype.is_floating_point or kind == "max"


def max_pool(be: Any, x: WArray, ks: tuple[int, ...], stride: tuple[int, ...], pad: tuple[int, ...],
             dil: tuple[int, ...], ceil_mode: bool, return_indices: bool) -> Any:
    """Max pooling over the trailing ``len(ks)`` dims (indices flat per input plane, as PyTorch's)."""
    S = x.shape[x.ndim - len(ks):]
    out = tuple(pool_output_size(L, k, s, p, d, ceil_mode) for L, k, s, p, d in zip(S, ks, stride, pad, dil))
    words = [v for d in range(len(ks)) for v in (ks[d], stride[d], pad[d], dil[d])]
    return _pool(be, "max", x, out, words, False, return_indices)


def avg_pool(be: Any, x: WArray, ks: tuple[int, ...], stride: tuple[int, ...], pad: tuple[int, ...],
             ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> WArray:
    """Average pooling over the trailing ``len(ks)`` dims."""
    S = x.shape[x.ndim - len(ks):]
    out = tuple(pool_output_size(L, k, s, p, 1, ceil_mode) for L, k, s, p in zip(S, ks, stride, pad))
    words = [v for d in range(len(ks)) for v in (ks[d], stride[d], pad[d], 1)]
    return _pool(be, "avg", x, out, words, False, False, count_include_pad, divisor_override)


def adaptive_pool(be: Any, kind: str, x: WArray, out: tuple[int, ...], return_indices: bool) -> Any:
    """Adaptive max/avg pooling to ``out`` over the trailing ``len(out)`` dims."""
    words = [0, 1, 0, 1] * len(out)
    return _pool(be, kind, x, tuple(out), words, True, return_indices)


__all__ = ["adaptive_pool", "avg_pool", "max_pool", "pool_source", "supported"]
