"""Convolutions on OpenCL: im2col + the tiled GEMM of :mod:`ember_opencl.matmul`, a gather col2im, a direct kernel.

* ``conv``: an im2col kernel (1/2/3-d by generic index math: stride, dilation, asymmetric and negative padding)
  copies the receptive fields into a column matrix, then GEMMs multiply the weight ``(G, C_out/G, C_in/G *
  prod(k))`` by it, groups and images as the GEMM's batch dims. With ``L >= 64`` output positions the columns are
  ``(N, G, R, L)`` and the GEMM writes ``(N, C_out, *out)`` directly; with fewer, ``(G, R, N*L)`` columns give one
  long GEMM per group and a copy reorders the result. A bias is one more column of the weight matrix times a row
  of ones in the columns (the GEMM adds it in its accumulator: no pass over the output). For grouped convs with
  few outputs per group (depthwise) and, on GPUs, short reductions, a direct kernel is timed against im2col + GEMM
  through the device's TuneStore (op ``conv.v1``) and the winner is kept per shape class.
* ``conv_input_grad`` (and ``conv_transpose``, the same computation): a GEMM of the transposed weight (read in
  place) with the output gradient gives the column gradients, then col2im *gathers*: every input element sums the
  column entries that read it, in window order (no atomics, deterministic); a transposed convolution's bias is
  added in that pass.
* ``conv_weight_grad``: im2col of x in ``(G, R, N*L)`` order and one GEMM per group with the output gradient
  (reordered to ``(G, C_out/G, N*L)``), reading the columns transposed in place; on GPUs a reduction long enough
  to leave compute units idle is split (split-K) and the slices summed.

The copy kernels move storage bits (one kernel per element width serves every dtype), index with 32-bit ints and,
on CPUs, step their indices as mixed-radix counters over a block of rows per work-item (integer division per
element made them 10x slower on PoCL). Column matrices are bounded: a quarter of the last-level cache on CPUs (so
the GEMM reads them from cache), 256 MiB on GPUs; larger batches run in chunks written into slices of the output.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ember_kernels.conv import (  # noqa: F401 (moved to ember-kernels; re-exported)
    _RAW,
    _advance,
    _carry,
    _col2im_source,
    _direct_source,
    _im2col_source,
    _sources,
    _sum_source,
)

from . import array as arr
from . import elementwise as ew
from .array import CLArray, empty

Pads = Sequence[tuple[int, int]]

#: a column matrix chunk on a GPU holds at most this many bytes (the batch is split to stay under it)
_COLS_BYTES = 256 << 20

#: kernels index with 32-bit ints (64-bit division is several times slower); chunks keep sizes below this
_INT_MAX = 2**31 - 1
#: below this many output positions per image the GEMMs run over the whole batch at once ((G, R, N*L) columns and
#: a reorder pass) instead of one product per image ((N, G, R, L) columns in the output's own order)
_BATCHED_MIN_L = 64
#: split-K slices of a weight gradient's GEMM are at least this long
_MIN_SLICE_K = 256

#: on GPUs, direct-kernel candidates are also timed for dense convs with reductions (C_in/groups * prod(k)) this short
_DIRECT_MAX_R = 64
#: the TuneStore op of the convolution's algorithm choice (bump when the candidates change meaning)
TUNE_OP = "conv.v1"
_GEMM: dict[str, Any] = {"kind": "gemm"}


# ----------------------------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------------------------


#: the bit pattern of 1.0 per element width (float16, float32, float64; bfloat16 handled in _one_bits)
_ONE = {2: np.uint16(0x3C00), 4: np.uint32(0x3F800000), 8: np.uint64(0x3FF0000000000000)}


def _one_bits(dtype: Any) -> np.generic:
    if dtype.name == "bfloat16":
        return np.uint16(0x3F80)
    return _ONE.get(dtype.itemsize, np.uint8(1))


def _grid(rt: Any, n: int) -> tuple[tuple[int], tuple[int], int]:
    """Global size, local size and items per work-item for n items: on CPUs one consecutive block per work-item
    (index arithmetic once per block), elsewhere one item per work-item per grid step (coalesced neighbours)."""
    gsize, lsize = rt.grid(n)
    per = -(-n // gsize[0]) if rt.is_cpu else 1
    return gsize, lsize, per


def _im2col(x: CLArray, n0: int, nb: int, groups: int, ksize: Sequence[int], out_size: Sequence[int],
            stride: Sequence[int], dilation: Sequence[int], lows: Sequence[int], cols: CLArray, order: str,
            strides: dict[str, int], ones_row: bool = False) -> None:
    """Fill cols (strides ``{"g", "n", "r", "l"}`` in elements) with the windows of batch items n0 .. n0+nb, and
    with a row of ones after each group's rows when ones_row (the bias's row of the GEMM)."""
    rt = x.rt
    nd = len(ksize)
    cg = x.shape[1] // groups
    kp = math.prod(ksize)
    rt_rows, lrow = cg * kp + int(ones_row), math.prod(out_size[:-1])
    rows = groups * nb * rt_rows * lrow
    if rows * out_size[-1] == 0:
        return
    kernel = rt.kernel(_im2col_source(x.dtype.itemsize, nd, order), "ember_im2col")
    gsize, lsz, per = _grid(rt, rows)
    args: list[Any] = [cols.buf, np.int64(cols.eoff), x.buf, np.int64(x.eoff + n0 * x.estrides[0]),
                       np.int32(rows), np.int32(per)]
    args += [np.int32(v) for v in (groups, nb, rt_rows, lrow, cg, kp)]
    args += [_one_bits(x.dtype), np.int64(x.estrides[0]), np.int64(x.estrides[1])]
    for d in range(nd):
        args += [np.int32(v) for v in (x.shape[2 + d], out_size[d], ksize[d], stride[d], dilation[d], lows[d])]
    args += [np.int64(x.estrides[2 + d]) for d in range(nd)]
    args += [np.int64(strides[c]) for c in "gnrl"]
    kernel(rt.queue, gsize, lsz, *args)


def _relayout(src: CLArray, dst: CLArray, groups: int, order: str, strides: dict[str, int]) -> None:
    """dst[g, n, c, l] (strides in elements) = src[n, g * C/groups + c, *l] for src (N, C, *S) of any strides: a
    1x1 im2col, i.e. a copy in runs of the last dim (the elementwise copy pays index math per element)."""
    nd = src.ndim - 2
    _im2col(src, 0, src.shape[0], groups, (1,) * nd, src.shape[2:], (1,) * nd, (1,) * nd, (0,) * nd, dst, order,
            strides)


def _dense(h: CLArray) -> CLArray:
    """h (N, C, *S) itself when contiguous, else a contiguous copy."""
    if h.is_contiguous:
        return h
    out = empty(h.rt, h.shape, h.dtype)
    lsize = math.prod(h.shape[2:])
    _relayout(h, out, 1, "ngrl", {"n": h.shape[1] * lsize, "g": 0, "r": lsize, "l": 1})
    return out


def _col2im(out: CLArray, n0: int, nb: int, cols: CLArray, strides: dict[str, int], groups: int,
            ksize: Sequence[int], out_size: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
            lows: Sequence[int], bias: CLArray | None) -> None:
    """out[n0 : n0+nb] (out contiguous (N, C, *S)) = the gather of cols (+ bias)."""
    rt = out.rt
    nd = len(ksize)
    c = out.shape[1]
    sp = out.shape[2:]
    per_item = c * math.prod(sp)
    total = nb * per_item
    if total == 0:
        return
    kernel = rt.kernel(_col2im_source(out.dtype, nd, bias is not None), "ember_col2im")
    args: list[Any] = [out.buf, np.int64(out.eoff + n0 * per_item), cols.buf, np.int64(cols.eoff)]
    if bias is not None:
        args += [bias.buf, np.int64(bias.eoff), np.int64(bias.estrides[0])]
    gsize, lsz, per = _grid(rt, total)
    args += [np.int32(v) for v in (total, per, c, c // groups, math.prod(ksize))]
    for d in range(nd):
        args += [np.int32(v) for v in (sp[d], out_size[d], ksize[d], stride[d], dilation[d], lows[d])]
    args += [np.int64(strides[k]) for k in "gnrl"]
    kernel(rt.queue, gsize, lsz, *args)


def _sum_slices(parts: CLArray, out: CLArray, accumulate: bool) -> None:
    """out (contiguous (G, M)) (+)= parts (contiguous (G, S, M)) summed over S."""
    rt = out.rt
    g, s, m = parts.shape
    kernel = rt.kernel(_sum_source(out.dtype), "ember_conv_sum")
    gsize, lsz = rt.grid(g * m)
    kernel(rt.queue, gsize, lsz, out.buf, np.int64(out.eoff), parts.buf, np.int64(parts.eoff), np.int64(g * m),
           np.int64(s), np.int64(m), np.int32(accumulate))


# ----------------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------------
def _reshape(h: CLArray, shape: tuple[int, ...]) -> CLArray:
    view = arr.reshape_view(h, shape)
    if view is None:
        view = arr.reshape_view(ew.copy(h), shape)
    assert view is not None  # a contiguous array always reshapes to a view
    return view


def _matmul(a: CLArray, b: CLArray) -> CLArray:
    from . import matmul

    return matmul.matmul(a, b)


def _gemm(a: CLArray, b: CLArray, out: CLArray, beta: int = 0, trans_b: bool = False) -> None:
    from . import matmul

    matmul.gemm(a, b, out, beta=beta, trans_b=trans_b)


def _budget(rt: Any) -> int:
    """Bytes of column matrix per chunk. CPUs: a quarter of the last-level cache, so the GEMM reads the columns
    im2col just wrote from cache (a larger matrix makes both passes memory-bound); GPUs: big chunks, few launches."""
    if rt.is_cpu:
        return max(1 << 20, int(rt.device.global_mem_cache_size) // 4)
    return min(_COLS_BYTES, int(rt.device.max_mem_alloc_size) // 2)


def _chunk(rt: Any, per_item: int, itemsize: int, n: int) -> int:
    """Batch items per chunk: as many as keep a column matrix (per_item elements per item) under the budget and
    every kernel index under 2**31 (at least one)."""
    return max(1, min(n, min(_budget(rt) // itemsize, _INT_MAX) // max(1, per_item)))


def _pow2(v: int) -> int:
    return 1 << max(0, int(v - 1).bit_length())


def _zeros(rt: Any, shape: tuple[int, ...], dtype: Any, bias: CLArray | None = None) -> CLArray:
    out = ew.full(rt, shape, 0, dtype)
    if bias is not None and out.size:
        ew.binary("add", out, _reshape(bias, (1, shape[1]) + (1,) * (len(shape) - 2)), out=out)
    return out


def _pointwise(ksize: Sequence[int], stride: Sequence[int], pads: Pads) -> bool:
    """A 1x1 convolution that reads every input position once: the input is its own column matrix."""
    return all(k == 1 for k in ksize) and all(s == 1 for s in stride) and all(lo == 0 and hi == 0 for lo, hi in pads)


def _out_size(sp: Sequence[int], ksize: Sequence[int], stride: Sequence[int], pads: Pads,
              dilation: Sequence[int]) -> tuple[int, ...]:
    return tuple((s + lo + hi - d * (k - 1) - 1) // st + 1
                 for s, k, st, (lo, hi), d in zip(sp, ksize, stride, pads, dilation))


# ----------------------------------------------------------------------------------------------------------------
# the ops
# ----------------------------------------------------------------------------------------------------------------
def conv(x: CLArray, w: CLArray, b: CLArray | None, stride: tuple[int, ...], padding: Pads,
         dilation: tuple[int, ...], groups: int) -> CLArray:
    """N-d cross-correlation: x (N, C_in, *S), w (C_out, C_in/groups, *k), b (C_out,) or None; padding (lo, hi)
    per spatial dim (negative crops). Returns a contiguous (N, C_out, *out) array of x's dtype."""
    rt = x.rt
    n, c = x.shape[0], x.shape[1]
    cout, cg = w.shape[0], w.shape[1]
    ksize = tuple(w.shape[2:])
    g = int(groups)
    cog = cout // g
    out_size = _out_size(x.shape[2:], ksize, stride, padding, dilation)
    lsize = math.prod(out_size)
    r = cg * math.prod(ksize)
    shape = (n, cout) + out_size
    if n * cout * lsize == 0 or r == 0 or c == 0:
        return _zeros(rt, shape, x.dtype, b)
    cands = _direct_candidates(rt, r, cog)
    if cands:
        args = (x, w, b, stride, padding, dilation, g, out_size)
        key = (f"{x.dtype.name}|{len(ksize)}d|r{_pow2(r)}|cog{_pow2(cog)}|nl{_pow2(n * lsize)}|"
               f"{'grouped' if g > 1 else 'dense'}")

        def run(cfg: dict[str, Any]) -> float:
            _conv_with(cfg, *args)  # build and warm up
            rt.queue.finish()
            best = math.inf
            for _ in range(2):
                t0 = time.perf_counter()
                _conv_with(cfg, *args)
                rt.queue.finish()
                best = min(best, time.perf_counter() - t0)
            return best

        return _conv_with(rt.tune.tune(TUNE_OP, key, cands + [dict(_GEMM)], run), *args)
    return _conv_gemm(x, w, b, stride, padding, dilation, g, out_size)


def _direct_candidates(rt: Any, r: int, cog: int) -> list[dict[str, Any]]:
    """Direct-kernel configurations worth timing against im2col + GEMM: for few outputs per group (depthwise) and,
    on GPUs, short reductions. None otherwise: the GEMM's data reuse wins outright there (PoCL does not vectorise
    the direct kernel's tap loops: it loses to the GEMM by 3-4x on a 1->64 3x3 conv, so it is not even timed)."""
    if cog > 4 and (rt.is_cpu or r > _DIRECT_MAX_R):
        return []
    tiles = [c for c in (1, 2, 4, 8, 16) if c <= _pow2(cog)][-3:]  # output channels per work-item
    return [{"kind": "direct", "cot": c} for c in tiles]


def _conv_with(cfg: dict[str, Any], x: CLArray, w: CLArray, b: CLArray | None, stride: Sequence[int],
               padding: Pads, dilation: Sequence[int], g: int, out_size: tuple[int, ...]) -> CLArray:
    if cfg["kind"] == "direct":
        return _conv_direct(x, w, b, stride, padding, dilation, g, out_size, int(cfg["cot"]))
    return _conv_gemm(x, w, b, stride, padding, dilation, g, out_size)


def _conv_direct(x: CLArray, w: CLArray, b: CLArray | None, stride: Sequence[int], padding: Pads,
                 dilation: Sequence[int], g: int, out_size: tuple[int, ...], cot: int) -> CLArray:
    rt = x.rt
    n = x.shape[0]
    cout, cg = w.shape[0], w.shape[1]
    nd = w.ndim - 2
    cog = cout // g
    lsize = math.prod(out_size)
    ct = -(-cog // cot)
    total = n * g * ct * lsize
    y = empty(rt, (n, cout) + out_size, x.dtype)
    # split the batch so every index stays a 32-bit int, with headroom for the grid-stride step past the end
    if total > _INT_MAX // 2:
        nb = max(1, (_INT_MAX // 2) // (g * ct * lsize))
        for n0 in range(0, n, nb):
            part = _conv_direct(arr.basic_index(x, (slice(n0, n0 + nb),)), w, b, stride, padding, dilation, g,
                                out_size, cot)
            _relayout(part, arr.basic_index(y, (slice(n0, n0 + nb),)), 1, "ngrl",
                      {"n": cout * lsize, "g": 0, "r": lsize, "l": 1})
        return y
    kernel = rt.kernel(_direct_source(x.dtype, nd, cot, b is not None), "ember_conv_direct")
    args: list[Any] = [y.buf, np.int64(y.eoff), x.buf, np.int64(x.eoff), w.buf, np.int64(w.eoff)]
    if b is not None:
        args += [b.buf, np.int64(b.eoff), np.int64(b.estrides[0])]
    gsize, lsz, per = _grid(rt, total)
    args += [np.int32(v) for v in (total, per, n, lsize, ct, g, cg, cog)]
    args += [np.int64(v) for v in (x.estrides[0], x.estrides[1], w.estrides[0], w.estrides[1])]
    for d in range(nd):
        args += [np.int32(v) for v in (x.shape[2 + d], out_size[d], w.shape[2 + d], stride[d], dilation[d],
                                       padding[d][0])]
    args += [np.int64(x.estrides[2 + d]) for d in range(nd)] + [np.int64(w.estrides[2 + d]) for d in range(nd)]
    kernel(rt.queue, gsize, lsz, *args)
    return y


def _conv_gemm(x: CLArray, w: CLArray, b: CLArray | None, stride: Sequence[int], padding: Pads,
               dilation: Sequence[int], g: int, out_size: tuple[int, ...]) -> CLArray:
    """im2col + GEMM (see the module docstring)."""
    rt = x.rt
    n = x.shape[0]
    cout, cg = w.shape[0], w.shape[1]
    ksize = tuple(w.shape[2:])
    cog = cout // g
    lsize = math.prod(out_size)
    r = cg * math.prod(ksize)
    shape = (n, cout) + out_size
    wm = _reshape(w, (g, cog, r))
    if b is None and _pointwise(ksize, stride, padding):
        # (N, G, C_out/G, L) = W (G, C_out/G, C_in/G) x X (N, G, C_in/G, L): the input is its own column matrix
        return _reshape(_matmul(wm, _reshape(_dense(x), (n, g, cg, lsize))), shape)
    if b is not None:
        # the bias is one more column of the weight matrix, multiplied by a row of ones in the columns: the GEMM
        # adds it in its accumulator, with no pass over the output
        wb = empty(rt, (g, cog, r + 1), x.dtype)
        ew.assign(arr.basic_index(wb, (slice(None), slice(None), slice(0, r))), wm)
        ew.assign(arr.basic_index(wb, (slice(None), slice(None), slice(r, r + 1))), _reshape(b, (g, cog, 1)))
        wm, kdim = wb, r + 1
    else:
        kdim = r
    lows = tuple(lo for lo, _ in padding)
    nb_max = _chunk(rt, max(g * kdim * lsize, cout * lsize), x.dtype.itemsize, n)
    per_image = lsize >= _BATCHED_MIN_L or n == 1
    y = empty(rt, shape, x.dtype) if g == 1 or nb_max < n else None  # else the GEMM's result is the output
    for n0 in range(0, n, nb_max):
        nb = min(nb_max, n - n0)
        dst = y if y is None or nb == n else arr.basic_index(y, (slice(n0, n0 + nb),))
        if per_image:
            # (nb, G, R, L): (C_out/G, R) x (R, L) per image and group gives (nb, G, C_out/G, L), the output order
            cols = empty(rt, (nb, g, kdim, lsize), x.dtype)
            _im2col(x, n0, nb, g, ksize, out_size, stride, dilation, lows, cols, "ngrl",
                    {"n": g * kdim * lsize, "g": kdim * lsize, "r": lsize, "l": 1}, b is not None)
            if dst is not None and g == 1:  # written straight into the output
                _gemm(_reshape(wm, (cout, kdim)), _reshape(cols, (nb, kdim, lsize)), _reshape(dst, (nb, cout, lsize)))
                continue
            yc = _matmul(wm, cols)
            if dst is None:
                return _reshape(yc, shape)
            src = yc.view((nb, cout) + out_size, (cout * lsize, lsize) + arr.contiguous_strides(out_size), yc.offset)
        else:
            # (G, R, nb*L): one long GEMM per group, then a copy into (nb, G, C_out/G, L) order
            cols = empty(rt, (g, kdim, nb * lsize), x.dtype)
            _im2col(x, n0, nb, g, ksize, out_size, stride, dilation, lows, cols, "grnl",
                    {"g": kdim * nb * lsize, "r": nb * lsize, "n": lsize, "l": 1}, b is not None)
            yc = _matmul(wm, cols)  # (G, C_out/G, nb*L)
            src = yc.view((nb, cout) + out_size, (lsize, nb * lsize) + arr.contiguous_strides(out_size), yc.offset)
        if dst is None:
            y = dst = empty(rt, shape, x.dtype)
        _relayout(src, dst, 1, "ngrl", {"n": cout * lsize, "g": 0, "r": lsize, "l": 1})
    assert y is not None
    return y


def _input_grad(gy: CLArray, w: CLArray, x_shape: tuple[int, ...], stride: Sequence[int], lows: Sequence[int],
                dilation: Sequence[int], groups: int, bias: CLArray | None) -> CLArray:
    """The gradient of conv w.r.t. its input (x_shape), plus bias per input channel (for conv_transpose)."""
    rt = gy.rt
    n, cout = gy.shape[0], gy.shape[1]
    out_size = tuple(gy.shape[2:])
    cg = w.shape[1]
    ksize = tuple(w.shape[2:])
    g = int(groups)
    cog = cout // g
    lsize = math.prod(out_size)
    r = cg * math.prod(ksize)
    if math.prod(x_shape) == 0:
        return empty(rt, x_shape, gy.dtype)
    if r == 0 or cout == 0 or lsize == 0:
        return _zeros(rt, x_shape, gy.dtype, bias)
    wt = arr.permute(_reshape(w, (g, cog, r)), (0, 2, 1))  # (G, R, C_out/G), read in place by the GEMM
    pads = tuple((lo, 0) for lo in lows)
    gy = _dense(gy)
    if bias is None and _pointwise(ksize, stride, pads) and tuple(x_shape[2:]) == out_size:
        return _reshape(_matmul(wt, _reshape(gy, (n, g, cog, lsize))), x_shape)  # (N, G, C_in/G, L): x's layout
    dx = empty(rt, x_shape, gy.dtype)
    nb_max = _chunk(rt, max(g * r * lsize, math.prod(x_shape[1:])), gy.dtype.itemsize, n)
    per_image = lsize >= _BATCHED_MIN_L or n == 1
    for n0 in range(0, n, nb_max):
        nb = min(nb_max, n - n0)
        gyc = gy if nb == n else arr.basic_index(gy, (slice(n0, n0 + nb),))
        if per_image:
            # (R, C_out/G) x (C_out/G, L) per image and group reads grad_y in place; columns are (nb, G, R, L)
            dcols = _matmul(wt, _reshape(gyc, (nb, g, cog, lsize)))
            strides = {"n": g * r * lsize, "g": r * lsize, "r": lsize, "l": 1}
        else:
            # grad_y reordered to (G, C_out/G, nb*L) for one long GEMM per group; columns are (G, R, nb*L)
            gy2 = empty(rt, (g, cog, nb * lsize), gy.dtype)
            _relayout(gyc, gy2, g, "grnl", {"g": cog * nb * lsize, "r": nb * lsize, "n": lsize, "l": 1})
            dcols = _matmul(wt, gy2)
            strides = {"g": r * nb * lsize, "r": nb * lsize, "n": lsize, "l": 1}
        _col2im(dx, n0, nb, dcols, strides, g, ksize, out_size, stride, dilation, lows, bias)
    return dx


def conv_input_grad(grad_y: CLArray, w: CLArray, x_shape: tuple[int, ...], stride: tuple[int, ...],
                    padding: Pads, dilation: tuple[int, ...], groups: int) -> CLArray:
    """Gradient of ``conv(x, w, ...)`` w.r.t. x (shape x_shape, batched) in grad_y's dtype."""
    return _input_grad(grad_y, w, tuple(x_shape), stride, tuple(lo for lo, _ in padding), dilation, groups, None)


def conv_transpose(x: CLArray, w: CLArray, b: CLArray | None, stride: tuple[int, ...], padding: tuple[int, ...],
                   output_padding: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> CLArray:
    """Transposed convolution (torch layouts): x (N, C_in, *S), w (C_in, C_out/groups, *k); the input gradient
    of the convolution with weight w, its bias added in the col2im pass."""
    n = x.shape[0]
    ksize = w.shape[2:]
    out_size = tuple((s - 1) * st - 2 * p + d * (k - 1) + op + 1
                     for s, st, p, d, k, op in zip(x.shape[2:], stride, padding, dilation, ksize, output_padding))
    cout = w.shape[1] * int(groups)
    return _input_grad(x, w, (n, cout) + out_size, stride, tuple(padding), dilation, groups, b)


def _splits(rt: Any, k: int, tiles: int) -> int:
    """How many slices to cut a GEMM's reduction of length k into (a divisor of k): enough independent tiles to
    keep every compute unit busy when the output alone has few (a weight gradient is small, its k is N*L)."""
    if rt.is_cpu:  # a few cores are kept busy by the GEMM's own tiles (measured: splitting only adds the sum)
        return 1
    want = max(1, (2 * rt.compute_units) // max(1, tiles))
    best = 1
    for s in range(2, min(want, k // _MIN_SLICE_K) + 1):
        if k % s == 0:
            best = s
    return best


def conv_weight_grad(x: CLArray, grad_y: CLArray, w_shape: tuple[int, ...], stride: tuple[int, ...],
                     padding: Pads, dilation: tuple[int, ...], groups: int) -> CLArray:
    """Gradient of ``conv(x, w, ...)`` w.r.t. w (shape w_shape) in x's dtype."""
    rt = x.rt
    w_shape = tuple(w_shape)
    n = x.shape[0]
    cout, cg = w_shape[0], w_shape[1]
    ksize = w_shape[2:]
    g = int(groups)
    cog = cout // g
    out_size = tuple(grad_y.shape[2:])
    lsize = math.prod(out_size)
    r = cg * math.prod(ksize)
    if math.prod(w_shape) == 0:
        return empty(rt, w_shape, x.dtype)
    if n * lsize == 0:
        return ew.full(rt, w_shape, 0, x.dtype)
    lows = tuple(lo for lo, _ in padding)
    nb_max = _chunk(rt, max(g * r * lsize, cout * lsize), x.dtype.itemsize, n)
    gw = empty(rt, (g, cog, r), x.dtype)
    for n0 in range(0, n, nb_max):
        nb = min(nb_max, n - n0)
        kdim = nb * lsize
        # columns (G, R, nb*L) (rows written whole); the GEMM (C_out/G, nb*L) x (R, nb*L)^T reduces over images and
        # positions at once, reading the columns transposed in place
        cols = empty(rt, (g, r, kdim), x.dtype)
        _im2col(x, n0, nb, g, ksize, out_size, stride, dilation, lows, cols, "grnl",
                {"g": r * kdim, "r": kdim, "n": lsize, "l": 1})
        gyc = grad_y if nb == n else arr.basic_index(grad_y, (slice(n0, n0 + nb),))
        gy2 = None
        if nb == 1:
            gy2 = arr.reshape_view(gyc, (g, cog, kdim))
        if gy2 is None:  # (nb, G, C_out/G, L) -> (G, C_out/G, nb, L)
            gy2 = empty(rt, (g, cog, kdim), x.dtype)
            _relayout(gyc, gy2, g, "grnl", {"g": cog * kdim, "r": kdim, "n": lsize, "l": 1})
        # split-K: a weight gradient has few output tiles; slices of the reduction run side by side, then add up
        s = _splits(rt, kdim, g * -(-cog // 64) * -(-r // 64))
        if s == 1:  # later chunks accumulate into gw (beta = 1)
            _gemm(gy2, cols, gw, beta=0 if n0 == 0 else 1, trans_b=True)
        else:
            a4 = gy2.view((g, s, cog, kdim // s), (gy2.estrides[0], kdim // s * gy2.estrides[2], gy2.estrides[1],
                                                  gy2.estrides[2]), gy2.offset)
            b4 = cols.view((g, s, kdim // s, r), (r * kdim, kdim // s, 1, kdim), cols.offset)
            _sum_slices(_reshape(_matmul(a4, b4), (g, s, cog * r)), _reshape(gw, (g, cog * r)), n0 > 0)
    return _reshape(gw, w_shape)
