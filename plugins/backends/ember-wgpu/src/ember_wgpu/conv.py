"""Convolutions on WebGPU: an im2col kernel + the tuned matmul, and a gather col2im for the input gradient.

* ``conv``: :func:`im2col` copies the receptive fields of a strided ``(N, C, *S)`` input (1/2/3-d, stride,
  dilation, asymmetric and negative padding by index math: no padded copy of the input) into columns ``(N, G,
  C/G*K, L)`` (``K`` taps, ``L`` output positions); one batched product of the weight ``(G, C_out/G, C/G*K)``
  (broadcast over N) with them writes ``(N, C_out, *out)`` directly.
* ``conv_input_grad`` (and ``conv_transpose``, the same computation): the product of the transposed weight (read
  in place through its strides) with the output gradient gives the column gradients, then :func:`col2im`
  *gathers*: every input element sums, in tap order, the column entries that read it -- deterministic, no atomics.
* ``conv_weight_grad``: im2col of x written straight into the ``(G, N*L, C/G*K)`` layout (the kernel takes the
  destination strides), and one product per group with the output gradient reordered to ``(G, C_out/G, N*L)``.

Column matrices are bounded by :data:`COLS_ELEMS` elements: a larger batch runs in chunks of images.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from ember.dtypes import DType

from . import array as arr
from . import wgsl
from .array import WArray, empty

#: a column matrix holds at most this many elements (the batch is chunked to stay below it)
COLS_ELEMS = 1 << 24

Pads = tuple[tuple[int, int], ...]


def _spatial_params(nd: int, S: tuple[int, ...], xs: tuple[int, ...], out: tuple[int, ...], ks: tuple[int, ...],
                    stride: tuple[int, ...], pads: Pads, dil: tuple[int, ...]) -> list[int]:
    """Seven words per spatial dim: input length and stride, output length, taps, stride, low padding, dilation."""
    words: list[int] = []
    for d in range(nd):
        words += [S[d], xs[d], out[d], ks[d], stride[d], pads[d][0], dil[d]]
    return words


# params: [total, nd, C, Cg, K, L, x offset, x batch stride, x channel stride,
#          dst strides of (n, g, cg, tap, l) (5 words), spatial dims (7 words each)]
@functools.cache
def im2col_source(dtype: DType) -> str:
    st = wgsl.stype(dtype)
    zero = "0u" if st == "u32" else f"{st}(0)"
    body = (f"@group(0) @binding(0) var<storage, read> x: array<{st}>;\n"
            f"@group(0) @binding(1) var<storage, read_write> cols: array<{st}>;\n"
            "@group(0) @binding(2) var<storage, read> p: array<i32>;\n"
            "@compute @workgroup_size(256)\n"
            "fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {\n"
            "  let i = i32(gid.x + gid.y * nwg.x * 256u);\n"
            "  if (i >= p[0]) { return; }\n"
            "  let nd = p[1]; let C = p[2]; let Cg = p[3]; let K = p[4]; let L = p[5];\n"
            "  let l = i % L; let r1 = i / L; let tap = r1 % K; let r2 = r1 / K; let c = r2 % C; let n = r2 / C;\n"
            "  var off = p[6] + n * p[7] + c * p[8];\n"
            "  var ok = true;\n  var lr = l; var tr = tap;\n"
            "  for (var d = nd - 1; d >= 0; d = d - 1) {\n"
            "    let q = 14 + 7 * d;\n"
            "    let o = lr % p[q + 2]; lr = lr / p[q + 2];\n"
            "    let t = tr % p[q + 3]; tr = tr / p[q + 3];\n"
            "    let pos = o * p[q + 4] - p[q + 5] + t * p[q + 6];\n"
            "    ok = ok && pos >= 0 && pos < p[q];\n"
            "    off = off + pos * p[q + 1];\n  }\n"
            "  let g = c / Cg; let cg = c % Cg;\n"
            "  let dst = n * p[9] + g * p[10] + cg * p[11] + tap * p[12] + l * p[13];\n"
            f"  var v = {zero};\n"
            "  if (ok) { v = x[off]; }\n"
            "  cols[dst] = v;\n}\n")
    from .kernels import _with_library

    return _with_library(body, [dtype])


def im2col(x: WArray, ks: tuple[int, ...], stride: tuple[int, ...], pads: Pads, dil: tuple[int, ...],
           out: tuple[int, ...], groups: int, dst: WArray, dst_strides: tuple[int, int, int, int, int]) -> None:
    """Write the columns of the batched input view ``x`` into ``dst`` at element strides ``dst_strides`` of
    (image, group, channel in group, tap, output position)."""
    from .kernels import _params

    rt = x.rt
    nd = len(ks)
    n, c = x.shape[0], x.shape[1]
    K, L = math.prod(ks), math.prod(out)
    total = n * c * K * L
    if total == 0:
        return
    prm = _params(rt, [total, nd, c, c // groups, K, L, x.offset, x.estrides[0], x.estrides[1], *dst_strides,
                       *_spatial_params(nd, x.shape[2:], x.estrides[2:], out, ks, stride, pads, dil)])
    rt.launch(im2col_source(x.dtype), [x.buf, dst.buf, prm.buffer], -(-total // 256))


# params: [total, nd, C, K, L, cols offset, spatial dims (7 words each: here S is the input's, xs unused)]
@functools.cache
def col2im_source(dtype: DType) -> str:
    ct = wgsl.ctype(dtype)
    body = (f"@group(0) @binding(0) var<storage, read> cols: array<{wgsl.stype(dtype)}>;\n"
            f"@group(0) @binding(1) var<storage, read_write> out: array<{wgsl.stype(dtype)}>;\n"
            "@group(0) @binding(2) var<storage, read> p: array<i32>;\n"
            "@compute @workgroup_size(256)\n"
            "fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {\n"
            "  let i = i32(gid.x + gid.y * nwg.x * 256u);\n"
            "  if (i >= p[0]) { return; }\n"
            "  let nd = p[1]; let C = p[2]; let K = p[3]; let L = p[4];\n"
            "  var npos = 1;\n"
            "  for (var d = 0; d < nd; d = d + 1) { npos = npos * p[6 + 7 * d]; }\n"
            "  let sp = i % npos; let nc = i / npos;\n"
            f"  var acc = {wgsl.convert('i32(0)', 'i32', ct)};\n"
            "  for (var tap = 0; tap < K; tap = tap + 1) {\n"
            "    var ok = true; var l = 0; var tr = tap; var sr = sp; var lmul = 1;\n"
            "    for (var d = nd - 1; d >= 0; d = d - 1) {\n"
            "      let q = 6 + 7 * d;\n"
            "      let s = sr % p[q]; sr = sr / p[q];\n"
            "      let t = tr % p[q + 3]; tr = tr / p[q + 3];\n"
            "      let num = s + p[q + 5] - t * p[q + 6];\n"
            "      let o = num / p[q + 4];\n"
            "      ok = ok && num >= 0 && o * p[q + 4] == num && o < p[q + 2];\n"
            "      l = l + o * lmul; lmul = lmul * p[q + 2];\n    }\n"
            "    if (ok) {\n"
            f"      acc = acc + {wgsl.load(dtype, 'cols[p[5] + (nc * K + tap) * L + l]')};\n    }}\n  }}\n"
            f"  out[i] = {wgsl.store(dtype, 'acc')};\n}}\n")
    from .kernels import _with_library

    return _with_library(body, [dtype])


def col2im(cols: WArray, x_shape: tuple[int, ...], ks: tuple[int, ...], stride: tuple[int, ...], pads: Pads,
           dil: tuple[int, ...], out: tuple[int, ...], dst: WArray) -> None:
    """``dst`` (contiguous, ``x_shape`` = (n, C, *S)) := the sum over taps of the contiguous columns ``cols``
    (n, C*K, L) that read each input element."""
    from .kernels import _params

    rt = cols.rt
    nd = len(ks)
    total = math.prod(x_shape)
    if total == 0:
        return
    prm = _params(rt, [total, nd, x_shape[1], math.prod(ks), math.prod(out), cols.offset,
                       *_spatial_params(nd, x_shape[2:], (0,) * nd, out, ks, stride, pads, dil)])
    rt.launch(col2im_source(cols.dtype), [cols.buf, dst.buf, prm.buffer], -(-total // 256))


def _out_size(S: tuple[int, ...], ks: tuple[int, ...], stride: tuple[int, ...], pads: Pads,
              dil: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(max((L + lo + hi - d * (k - 1) - 1) // s + 1, 0)
                 for L, k, s, (lo, hi), d in zip(S, ks, stride, pads, dil))


def _chunk(n: int, per_image: int) -> int:
    return max(1, min(n, COLS_ELEMS // max(per_image, 1)))


def conv(be: Any, x: WArray, w: WArray, b: WArray | None, stride: tuple[int, ...], pads: Pads,
         dil: tuple[int, ...], groups: int) -> WArray:
    """N-d cross-correlation, torch layouts: x (N, C, *S) or unbatched (C, *S), w (C_out, C/groups, *k)."""
    nd = w.ndim - 2
    unbatched = x.ndim == nd + 1
    if unbatched:
        x = arr.reshape_view(x, (1, *x.shape)) or be.reshape(x, (1, *x.shape))
    n, c = x.shape[0], x.shape[1]
    cout, cg = w.shape[0], w.shape[1]
    ks = tuple(w.shape[2:])
    G = int(groups)
    out = _out_size(x.shape[2:], ks, stride, pads, dil)
    K, L = math.prod(ks), math.prod(out)
    R = cg * K
    wm = be.reshape(w, (G, cout // G, R))
    w4 = arr.reshape_view(wm, (1, G, cout // G, R)) or be.reshape(wm, (1, G, cout // G, R))
    step = _chunk(n, c * K * L)
    # one chunk (the usual case): the product is the output; several: each is written into a slice of it
    y = empty(x.rt, (n, cout, *out), x.dtype) if step < n or n == 0 else None
    for n0 in range(0, n, step):
        nn = min(step, n - n0)
        xs = arr.basic_index(x, (slice(n0, n0 + nn),))
        cols = empty(x.rt, (nn, G, R, L), x.dtype)
        if cols.size:
            im2col(xs, ks, stride, pads, dil, out, G, cols, (G * R * L, R * L, K * L, L, 1))
        prod = be.reshape(be.matmul(arr.expand(w4, (nn, G, cout // G, R)), cols), (nn, cout, *out))
        if y is None:
            y = prod
        else:
            be.assign(arr.basic_index(y, (slice(n0, n0 + nn),)), prod)
    assert y is not None
    if b is not None:
        y = be.binary("add", y, arr.reshape_view(b, (1, cout) + (1,) * nd) or be.reshape(b, (1, cout) + (1,) * nd))
    return be.reshape(y, (cout, *out)) if unbatched else y


def conv_input_grad(be: Any, gy: WArray, w: WArray, x_shape: tuple[int, ...], stride: tuple[int, ...],
                    pads: Pads, dil: tuple[int, ...], groups: int) -> WArray:
    """d conv / d x (batched ``x_shape``): columns = w^T @ gy per group, then the col2im gather."""
    n, c = x_shape[0], x_shape[1]
    cout, cg = w.shape[0], w.shape[1]
    ks = tuple(w.shape[2:])
    G = int(groups)
    out = tuple(gy.shape[2:])
    K, L = math.prod(ks), math.prod(out)
    R = cg * K
    dx = empty(gy.rt, tuple(x_shape), gy.dtype)
    wt = arr.permute(be.reshape(w, (G, cout // G, R)), (0, 2, 1))  # (G, R, C_out/G), read in place
    wt4 = arr.reshape_view(wt, (1, G, R, cout // G)) or be.reshape(wt, (1, G, R, cout // G))
    step = _chunk(n, c * K * L)
    for n0 in range(0, n, step):
        nn = min(step, n - n0)
        g = be.reshape(arr.basic_index(gy, (slice(n0, n0 + nn),)), (nn, G, cout // G, L))
        cols = be.matmul(arr.expand(wt4, (nn, G, R, cout // G)), g)  # (nn, G, R, L): contiguous (nn, C*K, L)
        target = dx if step == n else empty(gy.rt, (nn, *x_shape[1:]), gy.dtype)
        col2im(cols, (nn, *x_shape[1:]), ks, stride, pads, dil, out, target)
        if step != n:
            be.assign(arr.basic_index(dx, (slice(n0, n0 + nn),)), target)
    return dx


def conv_weight_grad(be: Any, x: WArray, gy: WArray, w_shape: tuple[int, ...], stride: tuple[int, ...],
                     pads: Pads, dil: tuple[int, ...], groups: int) -> WArray:
    """d conv / d w: per group, gy (C_out/G, N*L) @ im2col(x) (N*L, C/G*K)."""
    n, c = x.shape[0], x.shape[1]
    cout, cg = w_shape[0], w_shape[1]
    ks = tuple(w_shape[2:])
    G = int(groups)
    out = tuple(gy.shape[2:])
    K, L = math.prod(ks), math.prod(out)
    R = cg * K
    dw: WArray | None = None
    step = _chunk(n, c * K * L)
    for n0 in range(0, n, step):
        nn = min(step, n - n0)
        xs = arr.basic_index(x, (slice(n0, n0 + nn),))
        cols = empty(x.rt, (G, nn * L, R), x.dtype)
        if cols.size:
            im2col(xs, ks, stride, pads, dil, out, G, cols, (L * R, nn * L * R, K, 1, R))
        g = be.reshape(arr.basic_index(gy, (slice(n0, n0 + nn),)), (nn, G, cout // G, L))
        g = be.reshape(be.copy(arr.permute(g, (1, 2, 0, 3))), (G, cout // G, nn * L))
        part = be.matmul(g, cols)  # (G, C_out/G, R)
        dw = part if dw is None else be.binary("add", dw, part)
    assert dw is not None  # n >= 1: core refuses an empty batch before the kernels
    return be.reshape(dw, tuple(w_shape))


def conv_transpose(be: Any, x: WArray, w: WArray, b: WArray | None, stride: tuple[int, ...],
                   padding: tuple[int, ...], output_padding: tuple[int, ...], dil: tuple[int, ...],
                   groups: int) -> WArray:
    """Transposed convolution (the input gradient of a convolution): x (N, C_in, *S), w (C_in, C_out/G, *k)."""
    nd = w.ndim - 2
    unbatched = x.ndim == nd + 1
    if unbatched:
        x = be.reshape(x, (1, *x.shape))
    n = x.shape[0]
    cout = w.shape[1] * int(groups)
    ks = tuple(w.shape[2:])
    lout = tuple((L - 1) * s - 2 * p + d * (k - 1) + op + 1
                 for L, s, p, d, k, op in zip(x.shape[2:], stride, padding, dil, ks, output_padding))
    y = conv_input_grad(be, x, w, (n, cout, *lout), stride, tuple((p, p) for p in padding), dil, groups)
    if b is not None:
        y = be.binary("add", y, be.reshape(b, (1, cout) + (1,) * nd))
    return be.reshape(y, (cout, *lout)) if unbatched else y


__all__ = ["COLS_ELEMS", "col2im", "conv", "conv_input_grad", "conv_transpose", "conv_weight_grad", "im2col"]
