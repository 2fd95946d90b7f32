"""The CuPy backend's own kernels for pooling, interpolate, pad, softmax/logsumexp and convolution.

Every kernel here is a program of the shared generators (:mod:`ember_kernels.pooling`, ``.indexing``,
``.reduction``, ``.conv``) -- the text ember-opencl runs on PoCL in CI -- emitted as CUDA/HIP by the dialect and
launched with ember-opencl's arguments, so the host logic below mirrors ember-opencl's (``pooling.py``,
``indexing.pad``, ``reduction.softmax``/``logsumexp``, ``conv.py``) with CuPy arrays: element strides are
``stride // itemsize``, buffers are passed as the arrays themselves (their data pointer) with element offset 0.

* pooling and interpolate: one work-item per output element (grid-stride), windows read through the input's
  strides; spatial ranks 1-3 run as rank 3, the batch dims merge into at most two.
* pad: one kernel per element width (raw bits), constant/reflect/replicate/circular, negative pads crop.
* softmax, log_softmax, logsumexp: one fused kernel per row (max, sum of exp, write): a work-group per row in a
  shared-memory tree for long rows, a work-item per row for short or column-strided rows.
* convolution: an im2col kernel writes the receptive fields as a column matrix and ``cupy.matmul`` (cuBLAS/rocBLAS
  for floats) multiplies the weight by it, images and groups as the batch dims; a bias is one more weight column
  times a row of ones. Its gradients: the transposed weight times the output gradient, then a col2im *gather* (no
  atomics: deterministic), and im2col + one GEMM per group for the weight. With CuPy's cuDNN module importable
  (``cupyx.cudnn``: CuPy <= 13 with the cudnn wheel; CuPy 14 dropped it) float convolutions with symmetric padding
  go to ``cudnn.convolution_forward`` instead (tensor cores off: TF32 would break float32 parity).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.errors import ShapeError, UnsupportedError, ValueRangeError
from ember.shapes import pool_output_size
from ember_kernels import conv as kconv
from ember_kernels import elementwise as ew
from ember_kernels import indexing as kindex
from ember_kernels import pooling as kpool
from ember_kernels import reduction as kred
from ember_kernels.ctypes_ import ctype

_RANK = 3  # pooling kernels see every input as (batch0, batch1, D, H, W)
_NARROW = 2**31  # below this many outputs the pooling kernels split the output index in 32 bits
_INTERP_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear", "bicubic", "area")
#: a column matrix chunk holds at most this many bytes (the batch is split to stay under it)
_COLS_BYTES = 256 << 20
_INT_MAX = 2**31 - 1  # the conv copy kernels index with 32-bit ints
#: the bit pattern of 1.0 per element width (float16, float32, float64): the bias row of the im2col columns
_ONE = {2: np.uint16(0x3C00), 4: np.uint32(0x3F800000), 8: np.uint64(0x3FF0000000000000)}
_NPWORD = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
#: threads per block of the row kernels (a power of two: the shared-memory tree halves it)
_ROW_BLOCK = 256
_MAX_GROUPS = 65535


def _est(h: Any) -> tuple[int, ...]:
    """h's strides in elements."""
    return tuple(s // h.itemsize for s in h.strides)


def _i64(*values: int) -> list[np.int64]:
    return [np.int64(v) for v in values]


# ----------------------------------------------------------------------------------------------------------------
# pooling and interpolate
# ----------------------------------------------------------------------------------------------------------------
def _layout(be: Any, op: str, x: Any, nd: int) -> tuple[Any, tuple[int, ...], list[np.int64], tuple[int, ...]]:
    """(x, lead shape, the common kernel arguments after n, padded input sizes) for op over nd trailing dims; the
    batch dims merge where their strides allow into (L0, L1), more than two that do not merge are copied."""
    if not 1 <= nd <= _RANK or x.ndim < nd:
        raise ShapeError(f"{op}: {nd} spatial dims over an input of shape {x.shape} (1 to {_RANK} supported on "
                         f"{be.platform})")
    lead = tuple(x.shape[: x.ndim - nd])
    merged: list[list[int]] = []
    for size, stride in zip(lead, _est(x)[: x.ndim - nd]):
        if size == 1:
            continue
        if merged and merged[-1][1] == stride * size:
            merged[-1] = [merged[-1][0] * size, stride]
        else:
            merged.append([size, stride])
    if len(merged) > 2:
        x = be.contiguous(x)
        merged = [[math.prod(lead), math.prod(x.shape[x.ndim - nd:])]]
    while len(merged) < 2:
        merged.insert(0, [1, 0])
    sizes = (1,) * (_RANK - nd) + tuple(x.shape[x.ndim - nd:])
    strides = (0,) * (_RANK - nd) + _est(x)[x.ndim - nd:]
    return x, lead, _i64(merged[1][0], merged[0][1], merged[1][1], *sizes, *strides), sizes


def _pad3(values: Sequence[int], fill: int) -> tuple[int, ...]:
    return (fill,) * (_RANK - len(values)) + tuple(int(v) for v in values)


def _pool_source(x: Any, n: int) -> str:
    return kpool._program(dt.from_numpy_dtype(x.dtype), True, n >= _NARROW, False)


def _max(be: Any, op: str, x: Any, nd: int, out_size: tuple[int, ...], window: list[np.int64], adaptive: bool,
         return_indices: bool) -> Any:
    x, lead, common, _ = _layout(be, op, x, nd)
    shape = lead + tuple(out_size)
    dtype = be.dtype_of(x)
    out = be.empty(shape, dtype)
    idx = be.empty(shape, dt.int64) if return_indices else None
    n = out.size
    if n:
        args: list[Any] = [out, np.int64(0)]
        args += [idx, np.int64(0), np.int32(1)] if idx is not None else [out, np.int64(0), np.int32(0)]
        args += [np.int32(adaptive), x, np.int64(0), np.int64(n), *common, *_i64(*_pad3(out_size, 1))]
        be._launch(_pool_source(x, n), "ember_max_pool", n, args + window)
    return (out, idx) if return_indices else out


def max_pool(be: Any, x: Any, kernel_size: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
             dilation: tuple[int, ...], ceil_mode: bool, return_indices: bool) -> Any:
    """Max pooling over the trailing len(kernel_size) dims (+ the int64 argmax, flat per input plane, as PyTorch).
    NaN wins over numbers; among equal maxima the first in row-major order."""
    nd = len(kernel_size)
    spatial = x.shape[x.ndim - nd:]
    out_size = tuple(pool_output_size(L, k, s, p, d, ceil_mode)
                     for L, k, s, p, d in zip(spatial, kernel_size, stride, padding, dilation))
    window = _i64(*_pad3(kernel_size, 1), *_pad3(stride, 1), *_pad3(padding, 0), *_pad3(dilation, 1))
    return _max(be, "max_pool", x, nd, out_size, window, False, return_indices)


def adaptive_max_pool(be: Any, x: Any, output_size: tuple[int, ...], return_indices: bool) -> Any:
    """Max over the windows [floor(o*I/O), ceil((o+1)*I/O)) of the trailing len(output_size) dims (+ indices)."""
    window = _i64(*(1,) * _RANK, *(1,) * _RANK, *(0,) * _RANK, *(1,) * _RANK)
    return _max(be, "adaptive_max_pool", x, len(output_size), tuple(int(o) for o in output_size), window, True,
                return_indices)


def _avg(be: Any, op: str, x: Any, nd: int, out_size: tuple[int, ...], tail: list[Any], adaptive: bool) -> Any:
    x, lead, common, _ = _layout(be, op, x, nd)
    out = be.empty(lead + tuple(out_size), be.dtype_of(x))
    n = out.size
    if n:
        args = [out, np.int64(0), np.int32(adaptive), x, np.int64(0), np.int64(n), *common,
                *_i64(*_pad3(out_size, 1))]
        be._launch(_pool_source(x, n), "ember_avg_pool", n, args + tail)
    return out


def avg_pool(be: Any, x: Any, kernel_size: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
             ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> Any:
    """Average pooling over the trailing len(kernel_size) dims (sums in float, double for float64)."""
    nd = len(kernel_size)
    spatial = x.shape[x.ndim - nd:]
    out_size = tuple(pool_output_size(L, k, s, p, 1, ceil_mode)
                     for L, k, s, p in zip(spatial, kernel_size, stride, padding))
    tail = [*_i64(*_pad3(kernel_size, 1), *_pad3(stride, 1), *_pad3(padding, 0)), np.int32(bool(count_include_pad)),
            np.int64(int(divisor_override) if divisor_override else 0)]
    return _avg(be, "avg_pool", x, nd, out_size, tail, False)


def adaptive_avg_pool(be: Any, x: Any, output_size: tuple[int, ...]) -> Any:
    """Mean over the windows [floor(o*I/O), ceil((o+1)*I/O)) of the trailing len(output_size) dims."""
    tail = [*_i64(*(1,) * _RANK, *(1,) * _RANK, *(0,) * _RANK), np.int32(1), np.int64(0)]
    return _avg(be, "adaptive_avg_pool", x, len(output_size), tuple(int(o) for o in output_size), tail, True)


def _user_scale(scales: Any, d: int) -> float | None:
    if scales is None:
        return None
    s = scales[d] if len(scales) > 1 else scales[0]
    return float(s) if s is not None and s > 0 else None


def interpolate(be: Any, x: Any, size: tuple[int, ...], mode: str, align_corners: bool | None,
                scales: tuple[float, ...] | None) -> Any:
    """Resize the trailing len(size) dims (torch.nn.functional.interpolate); scales are the user's scale factors
    when torch would hand them to its kernel, which then steps the source by 1 / scale."""
    if mode not in _INTERP_MODES:
        raise UnsupportedError(f"interpolate: mode {mode!r} is not supported on {be.platform} (one of "
                               f"{', '.join(_INTERP_MODES)}; input shape {x.shape}, dtype {x.dtype})")
    size = tuple(int(s) for s in size)
    if mode == "area":
        return adaptive_avg_pool(be, x, size)
    nd = len(size)
    x, lead, common, sizes = _layout(be, "interpolate", x, nd)
    dtype = be.dtype_of(x)
    out = be.empty(lead + size, dtype)
    n = out.size
    if not n:
        return out
    src = _pool_source(x, n)
    out_size = _pad3(size, 1)
    user = (None,) * (_RANK - nd) + tuple(_user_scale(scales, d) for d in range(nd))
    head = [out, np.int64(0), x, np.int64(0), np.int64(n), *common, *_i64(*out_size)]
    codes = []
    if mode in ("nearest", "nearest-exact"):
        factors = []
        for n_in, n_out, s in zip(sizes, out_size, user):
            # torch's nearest_idx short-cuts equal and doubled sizes; its 1-d and 3-d kernels only without a scale
            short = mode == "nearest" and (nd == 2 or s is None)
            codes.append(0 if short and n_in == n_out else 2 if short and n_out == 2 * n_in else 1)
            factors.append(np.float32(1.0 / s) if s is not None else np.float32(n_in) / np.float32(n_out))
        args = head + [np.float32(f) for f in factors] + [np.int32(c) for c in codes]
        be._launch(src, "ember_nearest", n, args + [np.int32(mode == "nearest-exact")])
        return out
    cubic = mode == "bicubic"
    ac = bool(align_corners)
    real = kpool._acc_ctype(ctype(dtype), True).scalar
    factors = []
    for n_in, n_out, s in zip(sizes, out_size, user):
        # linear modes copy a dim whose size is kept, whatever the scale; cubic honours a given scale there
        codes.append(0 if n_in == n_out and (not cubic or ac or s is None or s == 1.0) else 1)
        if ac:
            factors.append(real(n_in - 1) / real(n_out - 1) if n_out > 1 else real(0))
        else:
            factors.append(real(1.0 / s) if s is not None else real(n_in) / real(n_out))
    args = head + [real(f) for f in factors] + [np.int32(c) for c in codes] + [np.int32(ac)]
    be._launch(src, "ember_interp_cubic" if cubic else "ember_interp_linear", n, args)
    return out


# ----------------------------------------------------------------------------------------------------------------
# pad
# ----------------------------------------------------------------------------------------------------------------
def _fill_bits(value: Any, dtype: Any) -> np.generic:
    """value converted to dtype, as the raw storage word (one pad kernel serves every dtype of a width)."""
    if value is None:
        value = 0
    if dtype is dt.bool_:
        return np.uint8(bool(value))
    if dtype.is_integer and isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            raise ValueRangeError(f"pad: cannot fill an integer ({dtype.name}) tensor with NaN")
        info = np.iinfo(dtype.numpy)
        value = int(info.max if value > 0 else info.min)  # +-inf padding (max pooling) -> the dtype's extremes
    with np.errstate(all="ignore"):
        host = np.array(value).astype(dtype.numpy)
    return host.reshape(1).view(_NPWORD[dtype.itemsize])[0]


def pad_rank(ndim: int) -> int:
    """The pad program's rank for an ndim input: 1, 4 or 8 (leading size-1 dims added; the ranks the catalogue of
    ``ember kernels check`` compiles), else ndim itself."""
    return 1 if ndim <= 1 else 4 if ndim <= 4 else 8 if ndim <= 8 else ndim


def pad(be: Any, h: Any, pads: tuple[tuple[int, int], ...], mode: str, value: Any) -> Any:
    """Pad each dim by (lo, hi): constant fills value, reflect mirrors without repeating the edge, replicate repeats
    the edge, circular wraps; negative pads crop (as PyTorch: first for circular, after reflecting in the whole
    input for reflect)."""
    if mode not in kindex._PAD_MODES:
        raise UnsupportedError(f"pad: mode must be one of {', '.join(kindex._PAD_MODES)}, got {mode!r}")
    nd = h.ndim
    pads = tuple((0, 0) for _ in range(nd - len(pads))) + tuple((int(lo), int(hi)) for lo, hi in pads)
    if len(pads) != nd:
        raise ShapeError(f"pad: {len(pads)} (lo, hi) pairs for an input of shape {h.shape}")
    first = [max(-lo, 0) for lo, _ in pads]
    sizes = [n - f - max(-hi, 0) for n, f, (_, hi) in zip(h.shape, first, pads)]
    out_shape = tuple(sz + max(lo, 0) + max(hi, 0) for sz, (lo, hi) in zip(sizes, pads))
    if any(s < 0 for s in out_shape):
        raise ShapeError(f"pad: padding {pads} of input shape {h.shape} gives negative size {out_shape}")
    dtype = be.dtype_of(h)
    out = be.empty(out_shape, dtype)
    n = out.size
    if n == 0:
        return out
    if mode != "constant":
        for d, (sz, (lo, hi)) in enumerate(zip(sizes, pads)):
            if sz <= 0 and (lo > 0 or hi > 0):
                raise ShapeError(f"pad: cannot {mode}-pad the empty dimension {d} of input shape {h.shape}")
    rank = pad_rank(nd)
    strides = _est(h)
    args: list[Any] = [out, np.int64(0), h, np.int64(0), np.int64(n), np.int32(kindex._PAD_MODES[mode]),
                       _fill_bits(value if mode == "constant" else 0, dtype)]
    args += _i64(1, 0, 0, 0, 1) * (rank - nd)  # leading size-1 dims up to the program's rank
    for d in range(nd):
        if mode == "reflect":  # PyTorch reflects within the whole input, then crops (not crop, then reflect)
            args += _i64(out_shape[d], strides[d], pads[d][0], 0, h.shape[d])
        else:
            args += _i64(out_shape[d], strides[d], max(pads[d][0], 0), first[d], sizes[d])
    be._launch(kindex._pad_source(dtype.itemsize, rank), "ember_pad", n, args)
    return out


# ----------------------------------------------------------------------------------------------------------------
# softmax, log_softmax, logsumexp: one kernel per row
# ----------------------------------------------------------------------------------------------------------------
def _row_block(length: int) -> int:
    """A power-of-two block for rows of this length (the shared-memory tree needs a power of two)."""
    local = _ROW_BLOCK
    while local > 16 and local > length:
        local //= 2
    return local


def _acc_itemsize(dtype: Any) -> int:
    return kred._acc_dtype(dtype).itemsize


def _outer_args(osh: Sequence[int], *strides: Sequence[int]) -> list[np.int64]:
    pad = kred.OMAX - len(osh)
    args = _i64(*([1] * pad + list(osh)))
    for st in strides:
        args += _i64(*([0] * pad + list(st)))
    return args


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


def _few_long_rows(be: Any, rows: int, length: int) -> bool:
    """Few, very long rows: a block per row would leave most of the GPU idle; the composition's reductions split
    each row over the whole device."""
    return rows < be.multiprocessors() * 8 and length > 4096


def softmax(be: Any, h: Any, dim: int, log: bool) -> Any:
    """softmax (or log_softmax) of h along dim, one fused kernel per row (max, sum of exp, write)."""
    dtype = be.dtype_of(h)
    length = h.shape[dim]
    rows = h.size // length if length else 0
    if length and _few_long_rows(be, rows, length):
        return None  # the caller runs the default composition
    out = be.empty(h.shape, dtype)
    if out.size == 0:
        return out
    others = [d for d in range(h.ndim) if d != dim]
    shape = tuple(h.shape[d] for d in others)

    def joint(a: Any) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        sa, so = _est(a), _est(out)
        return ew.collapse(shape, [tuple(sa[d] for d in others), tuple(so[d] for d in others)])

    osh, (ist, pst) = joint(h)
    if len(osh) > kred.OMAX:
        h = be.contiguous(h)
        osh, (ist, pst) = joint(h)
    sx, so = _est(h)[dim], _est(out)[dim]
    src = kred._softmax_source(ctype(dtype))
    args = [out, np.int64(0), h, np.int64(0), np.int64(rows), np.int64(length), np.int64(sx), np.int64(so),
            np.int32(log)] + _outer_args(osh, ist, pst)
    if length <= kred._SHORT or (bool(ist) and abs(ist[-1]) < abs(sx)):
        be._launch(src, "ember_softmax_col", rows, args)
    else:
        local = _row_block(length)
        be._launch_groups(src, "ember_softmax_row", min(rows, _MAX_GROUPS), local, args,
                          local * _acc_itemsize(dtype))
    return out


def logsumexp(be: Any, h: Any, dims: tuple[int, ...], keepdim: bool) -> Any:
    """log(sum(exp(h))) over dims, stably (max shifted out; rows of -inf give -inf, NaN propagates)."""
    dtype = be.dtype_of(h)
    red = sorted(set(dims))
    out_shape = tuple(1 if d in red else n for d, n in enumerate(h.shape)) if keepdim else \
        tuple(n for d, n in enumerate(h.shape) if d not in red)
    if math.prod(out_shape) == 0:
        return be.empty(out_shape, dtype)
    kept = [d for d in range(h.ndim) if d not in red]
    st = _est(h)
    osh, ost = _collapse([h.shape[d] for d in kept], [st[d] for d in kept])
    rsh, rst = _collapse([h.shape[d] for d in red], [st[d] for d in red])
    if len(osh) > kred.OMAX or len(rsh) > kred.RMAX:
        # too scattered to decompose: a contiguous copy with the reduced dims last (logical order kept)
        h = be.contiguous(be.permute(h, tuple(kept + red)))
        rows_, n_ = math.prod(h.shape[: len(kept)]), math.prod(h.shape[len(kept):])
        osh, ost = ([rows_], [n_]) if rows_ != 1 else ([], [])
        rsh, rst = [n_], [1]
    if not rsh:
        rsh, rst = [1], [0]
    rows, length = math.prod(osh), math.prod(rsh)
    if length == 0:
        return be.full(out_shape, -math.inf, dtype)
    if _few_long_rows(be, rows, length):
        return None
    out = be.empty(out_shape, dtype)
    src = kred._lse_source(ctype(dtype), len(rsh))
    args = [out, np.int64(0), h, np.int64(0), np.int64(rows), np.int64(length)]
    args += _outer_args(osh, ost) + _i64(*rsh, *rst)
    if length <= kred._SHORT or (bool(ost) and abs(ost[-1]) < min(abs(s) for s in rst)):
        be._launch(src, "ember_lse_col", rows, args)
    else:
        local = _row_block(length)
        be._launch_groups(src, "ember_lse_row", min(rows, _MAX_GROUPS), local, args, local * _acc_itemsize(dtype))
    return out


# ----------------------------------------------------------------------------------------------------------------
# convolution: im2col + cupy.matmul, col2im gather; cuDNN where CuPy still has it
# ----------------------------------------------------------------------------------------------------------------
Pads = Sequence[tuple[int, int]]


def cudnn_module() -> Any:
    """CuPy's cuDNN wrapper (``cupyx.cudnn``) when it imports with a usable libcudnn, else None. CuPy 14 removed it;
    CuPy <= 13 has it with the ``nvidia-cudnn-cu12`` wheel."""
    try:
        mod = importlib.import_module("cupyx.cudnn")
        importlib.import_module("cupy_backends.cuda.libs.cudnn").getVersion()
    except Exception:  # ImportError, or the library missing at first use: the im2col path serves every conv
        return None
    return mod


def _out_size(sp: Sequence[int], ksize: Sequence[int], stride: Sequence[int], pads: Pads,
              dilation: Sequence[int]) -> tuple[int, ...]:
    return tuple((s + lo + hi - d * (k - 1) - 1) // st + 1
                 for s, k, st, (lo, hi), d in zip(sp, ksize, stride, pads, dilation))


def _chunk(per_item: int, itemsize: int, n: int) -> int:
    """Batch items per chunk: as many as keep a column matrix under the budget and every kernel index under 2**31."""
    return max(1, min(n, min(_COLS_BYTES // itemsize, _INT_MAX) // max(1, per_item)))


def _im2col(be: Any, x: Any, n0: int, nb: int, groups: int, ksize: Sequence[int], out_size: Sequence[int],
            stride: Sequence[int], dilation: Sequence[int], lows: Sequence[int], cols: Any, order: str,
            strides: dict[str, int], ones_row: bool = False) -> None:
    """Fill cols (strides ``{"g", "n", "r", "l"}`` in elements) with the windows of batch items n0 .. n0+nb, and
    with a row of ones after each group's rows when ones_row (the bias's row of the GEMM)."""
    nd = len(ksize)
    cg = x.shape[1] // groups
    kp = math.prod(ksize)
    rt_rows, lrow = cg * kp + int(ones_row), math.prod(out_size[:-1])
    rows = groups * nb * rt_rows * lrow
    if rows * out_size[-1] == 0:
        return
    xs = _est(x)
    xv = x[n0:n0 + nb] if (n0, nb) != (0, x.shape[0]) else x  # a view: the kernel gets its data pointer
    args: list[Any] = [cols, np.int64(0), xv, np.int64(0), np.int32(rows), np.int32(1)]
    args += [np.int32(v) for v in (groups, nb, rt_rows, lrow, cg, kp)]
    args += [_ONE.get(x.itemsize, np.uint8(1)), np.int64(xs[0]), np.int64(xs[1])]
    for d in range(nd):
        args += [np.int32(v) for v in (x.shape[2 + d], out_size[d], ksize[d], stride[d], dilation[d], lows[d])]
    args += [np.int64(xs[2 + d]) for d in range(nd)]
    args += [np.int64(strides[c]) for c in "gnrl"]
    be._launch(kconv._im2col_source(x.itemsize, nd, order), "ember_im2col", rows, args)


def _col2im(be: Any, out: Any, n0: int, nb: int, cols: Any, strides: dict[str, int], groups: int,
            ksize: Sequence[int], out_size: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
            lows: Sequence[int], bias: Any | None) -> None:
    """out[n0 : n0+nb] (out contiguous (N, C, *S)) = the gather of cols (+ bias)."""
    nd = len(ksize)
    c = out.shape[1]
    sp = out.shape[2:]
    per_item = c * math.prod(sp)
    total = nb * per_item
    if total == 0:
        return
    dst = out[n0:n0 + nb] if (n0, nb) != (0, out.shape[0]) else out
    args: list[Any] = [dst, np.int64(0), cols, np.int64(0)]
    if bias is not None:
        args += [bias, np.int64(0), np.int64(_est(bias)[0])]
    args += [np.int32(v) for v in (total, 1, c, c // groups, math.prod(ksize))]
    for d in range(nd):
        args += [np.int32(v) for v in (sp[d], out_size[d], ksize[d], stride[d], dilation[d], lows[d])]
    args += [np.int64(strides[k]) for k in "gnrl"]
    source = kconv._col2im_source(be.dtype_of(out), nd, bias is not None)
    be._launch(source, "ember_col2im", total, args)


def _zeros(be: Any, shape: tuple[int, ...], dtype: Any, bias: Any | None = None) -> Any:
    out = be.full(shape, 0, dtype)
    if bias is not None and out.size:
        be.inplace_binary("add", out, be.reshape(bias, (1, shape[1]) + (1,) * (len(shape) - 2)))
    return out


def conv(be: Any, x: Any, w: Any, b: Any | None, stride: tuple[int, ...], padding: Pads,
         dilation: tuple[int, ...], groups: int) -> Any:
    """N-d cross-correlation: x (N, C_in, *S), w (C_out, C_in/groups, *k), b (C_out,) or None; padding (lo, hi)
    per spatial dim (negative crops). A contiguous (N, C_out, *out) array of x's dtype."""
    n, c = x.shape[0], x.shape[1]
    cout, cg = w.shape[0], w.shape[1]
    ksize = tuple(w.shape[2:])
    g = int(groups)
    cog = cout // g
    dtype = be.dtype_of(x)
    out_size = _out_size(x.shape[2:], ksize, stride, padding, dilation)
    lsize = math.prod(out_size)
    r = cg * math.prod(ksize)
    shape = (n, cout) + out_size
    if n * cout * lsize == 0 or r == 0 or c == 0:
        return _zeros(be, shape, dtype, b)
    cudnn = be.cudnn() if dtype in (dt.float16, dt.float32, dt.float64) else None
    if cudnn is not None and all(lo == hi >= 0 for lo, hi in padding) and 1 <= len(ksize) <= 3:
        y = be.empty(shape, dtype)
        with be._on():
            # tensor_core="never": TF32 / half accumulation would break the float32 parity the kit checks
            bias = None if b is None else be.contiguous(b)
            cudnn.convolution_forward(be.contiguous(x), be.contiguous(w), bias, y, tuple(lo for lo, _ in padding),
                                      tuple(stride), tuple(dilation), g, auto_tune=False, tensor_core="never")
        return y
    kdim = r + int(b is not None)
    wm = be.reshape(w, (g, cog, r))
    if b is not None:
        # the bias is one more column of the weight matrix, multiplied by a row of ones in the columns: the GEMM
        # adds it in its accumulator, with no pass over the output
        wb = be.empty((g, cog, kdim), dtype)
        be.assign(wb[:, :, :r], wm)
        be.assign(wb[:, :, r:], be.reshape(b, (g, cog, 1)))
        wm = wb
    lows = tuple(lo for lo, _ in padding)
    nb_max = _chunk(max(g * kdim * lsize, cout * lsize), x.itemsize, n)
    if nb_max >= n:  # one chunk: the GEMM's (N, G, C_out/G, L) result is the output
        cols = be.empty((n, g, kdim, lsize), dtype)
        _im2col(be, x, 0, n, g, ksize, out_size, stride, dilation, lows, cols, "ngrl",
                {"n": g * kdim * lsize, "g": kdim * lsize, "r": lsize, "l": 1}, b is not None)
        return be.reshape(be.matmul(wm, cols), shape)
    y = be.empty(shape, dtype)
    for n0 in range(0, n, nb_max):
        nb = min(nb_max, n - n0)
        # (nb, G, R, L) columns: (C_out/G, R) x (R, L) per image and group is (nb, G, C_out/G, L), the output order
        cols = be.empty((nb, g, kdim, lsize), dtype)
        _im2col(be, x, n0, nb, g, ksize, out_size, stride, dilation, lows, cols, "ngrl",
                {"n": g * kdim * lsize, "g": kdim * lsize, "r": lsize, "l": 1}, b is not None)
        be.assign(y[n0:n0 + nb], be.reshape(be.matmul(wm, cols), (nb, cout) + out_size))
    return y


def _input_grad(be: Any, gy: Any, w: Any, x_shape: tuple[int, ...], stride: Sequence[int], lows: Sequence[int],
                dilation: Sequence[int], groups: int, bias: Any | None) -> Any:
    """The gradient of conv w.r.t. its input (x_shape), plus bias per input channel (for conv_transpose)."""
    n, cout = gy.shape[0], gy.shape[1]
    out_size = tuple(gy.shape[2:])
    cg = w.shape[1]
    ksize = tuple(w.shape[2:])
    g = int(groups)
    cog = cout // g
    lsize = math.prod(out_size)
    r = cg * math.prod(ksize)
    dtype = be.dtype_of(gy)
    if math.prod(x_shape) == 0:
        return be.empty(x_shape, dtype)
    if r == 0 or cout == 0 or lsize == 0:
        return _zeros(be, x_shape, dtype, bias)
    wt = be.permute(be.reshape(w, (g, cog, r)), (0, 2, 1))  # (G, R, C_out/G)
    gy = be.contiguous(gy)
    dx = be.empty(x_shape, dtype)
    nb_max = _chunk(max(g * r * lsize, math.prod(x_shape[1:])), gy.itemsize, n)
    for n0 in range(0, n, nb_max):
        nb = min(nb_max, n - n0)
        # (R, C_out/G) x (C_out/G, L) per image and group: columns (nb, G, R, L)
        dcols = be.contiguous(be.matmul(wt, be.reshape(gy[n0:n0 + nb], (nb, g, cog, lsize))))
        _col2im(be, dx, n0, nb, dcols, {"n": g * r * lsize, "g": r * lsize, "r": lsize, "l": 1}, g, ksize,
                out_size, stride, dilation, lows, bias)
    return dx


def conv_input_grad(be: Any, grad_y: Any, w: Any, x_shape: tuple[int, ...], stride: tuple[int, ...],
                    padding: Pads, dilation: tuple[int, ...], groups: int) -> Any:
    """Gradient of ``conv(x, w, ...)`` w.r.t. x (shape x_shape, batched) in grad_y's dtype."""
    return _input_grad(be, grad_y, w, tuple(x_shape), stride, tuple(lo for lo, _ in padding), dilation, groups,
                       None)


def conv_transpose(be: Any, x: Any, w: Any, b: Any | None, stride: tuple[int, ...], padding: tuple[int, ...],
                   output_padding: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> Any:
    """Transposed convolution (torch layouts): x (N, C_in, *S), w (C_in, C_out/groups, *k); the input gradient of
    the convolution with weight w, its bias added in the col2im pass."""
    n = x.shape[0]
    ksize = w.shape[2:]
    out_size = tuple((s - 1) * st - 2 * p + d * (k - 1) + op + 1
                     for s, st, p, d, k, op in zip(x.shape[2:], stride, padding, dilation, ksize, output_padding))
    cout = w.shape[1] * int(groups)
    return _input_grad(be, x, w, (n, cout) + out_size, stride, tuple(padding), dilation, groups, b)


def conv_weight_grad(be: Any, x: Any, grad_y: Any, w_shape: tuple[int, ...], stride: tuple[int, ...],
                     padding: Pads, dilation: tuple[int, ...], groups: int) -> Any:
    """Gradient of ``conv(x, w, ...)`` w.r.t. w (shape w_shape) in x's dtype."""
    w_shape = tuple(w_shape)
    n = x.shape[0]
    cout, cg = w_shape[0], w_shape[1]
    ksize = w_shape[2:]
    g = int(groups)
    cog = cout // g
    out_size = tuple(grad_y.shape[2:])
    lsize = math.prod(out_size)
    r = cg * math.prod(ksize)
    dtype = be.dtype_of(x)
    if math.prod(w_shape) == 0:
        return be.empty(w_shape, dtype)
    if n * lsize == 0:
        return be.full(w_shape, 0, dtype)
    lows = tuple(lo for lo, _ in padding)
    nb_max = _chunk(max(g * r * lsize, cout * lsize), x.itemsize, n)
    gw = None
    for n0 in range(0, n, nb_max):
        nb = min(nb_max, n - n0)
        kdim = nb * lsize
        # columns (G, R, nb*L); (C_out/G, nb*L) x (nb*L, R) reduces over images and positions in one GEMM per group
        cols = be.empty((g, r, kdim), dtype)
        _im2col(be, x, n0, nb, g, ksize, out_size, stride, dilation, lows, cols, "grnl",
                {"g": r * kdim, "r": kdim, "n": lsize, "l": 1})
        gy = be.reshape(grad_y[n0:n0 + nb], (nb, g, cog, lsize))
        gy2 = be.reshape(be.permute(gy, (1, 2, 0, 3)), (g, cog, kdim))  # (G, C_out/G, nb*L)
        part = be.matmul(gy2, be.permute(cols, (0, 2, 1)))
        if gw is None:
            gw = part
        else:
            be.inplace_binary("add", gw, part)
    assert gw is not None
    return be.reshape(gw, w_shape)


# ----------------------------------------------------------------------------------------------------------------
# gather / scatter
# ----------------------------------------------------------------------------------------------------------------
def _loop_rank(ndim: int) -> int:
    """The scatter-loop program's rank for an ndim destination: 3 or 6 (leading size-1 dims added; the ranks the
    catalogue compiles), else ndim itself."""
    return 3 if ndim <= 3 else 6 if ndim <= 6 else ndim


def gather(be: Any, h: Any, dim: int, index: Any) -> Any:
    """out[i...] = h[i... with i[dim] replaced by index[i...]] (index no larger than h outside dim): CuPy's
    ``take_along_axis`` over h cut to index's extent."""
    hv = h[tuple(slice(None) if d == dim else slice(0, index.shape[d]) for d in range(h.ndim))]
    with be._on():
        return be.cp.take_along_axis(hv, index, axis=dim)


def scatter(be: Any, h: Any, dim: int, index: Any, src: Any, reduce: str | None) -> Any:
    """A copy of h with src (an array no smaller than index, or a scalar) written / added / multiplied at index
    along dim. Replace is CuPy's advanced-index assignment (one of duplicate writes wins, as in PyTorch); add and
    multiply are the shared deterministic loop kernel (each destination combines its sources in index order: no
    atomics, the same float result on every run)."""
    if reduce not in (None, "add", "multiply"):
        raise UnsupportedError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
    dtype = be.dtype_of(h)
    out = be.copy(h)
    shape = tuple(index.shape)
    if math.prod(shape) == 0:
        return out
    cp = be.cp
    if isinstance(src, cp.ndarray):
        s = src if src.dtype == h.dtype else be.cast(src, dtype)
        s = s[tuple(slice(0, n) for n in shape)]
    else:
        s = be.full((), src, dtype)
    if reduce is None:
        with be._on():
            key = tuple(index if d == dim else cp.arange(n, dtype=np.int64).reshape((-1,) + (1,) * (len(shape) - d - 1))
                        for d, n in enumerate(shape))
            out[key] = s
        return out
    ndim = out.ndim
    rank = _loop_rank(ndim)
    lead = rank - ndim
    sstr = _est(s) if s.ndim else (0,) * ndim
    ist, ost = _est(index), _est(out)
    region = tuple(out.shape[d] if d == dim else shape[d] for d in range(ndim))
    n = math.prod(region)
    if n == 0:
        return out
    args: list[Any] = [out, np.int64(0), s, np.int64(0), index, np.int64(0), np.int64(n), np.int64(shape[dim]),
                       np.int64(sstr[dim]), np.int64(ist[dim]), np.int64(out.shape[dim]), np.int32(dim + lead)]
    args += _i64(1, 0, 0, 0) * lead
    for d in range(ndim):
        own = d != dim  # along dim the loop walks src/index; the destination coordinate is the target
        args += _i64(region[d], ost[d], sstr[d] if own else 0, ist[d] if own else 0)
    source = kindex._loop_source(ctype(dtype), reduce, rank)
    be._launch(source, "ember_scatter_loop", n, args)
    return out
