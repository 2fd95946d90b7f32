"""Pure-numpy neural-network kernels for the ember-flex CPU backend.

All functions follow PyTorch semantics and layouts (``N, C, *spatial``;
conv weight ``(C_out, C_in/groups, *k)``).  Parameters are expected to be
normalised by the caller to per-spatial-dim tuples; plain ints are accepted
too for convenience.  The number of spatial dims (1, 2 or 3) is inferred from
the weight rank (convolutions) or from the length of ``kernel_size`` /
``output_size`` / ``size`` (pooling, interpolation).

Computation is done in float32 (float64 stays float64; float16 and friends are
computed in float32 and cast back), and every function returns a fresh
C-contiguous array whose dtype equals the input dtype.

Convolutions use an im2col (``as_strided`` view + one copy) followed by a
BLAS matmul; transposed convolution and the input gradient use matmul + col2im
(a loop over the kernel taps that adds strided slices; with 2+ channels per
group one GEMM per tap, so the adds read contiguous scratch). A 1x1 convolution
with stride 1, no padding and one group is a plain GEMM per sample on the NCHW
planes as they are (forward and input gradient write the result in place; the
weight gradient copies runs of whole planes): no im2col, no transposes. The
channels-last forward, both gradients and col2im work on a chunk of the batch at a time (about
``_CHUNK_BYTES`` of scratch, reused across chunks) so the im2col rows and the
GEMM's output stay in cache; several chunks run in ranges on
flex's thread pool, each GEMM on one BLAS thread (``_run_chunks``). Chunks depend
on shapes only, the weight gradient adds the chunks' sums in chunk order, and
long GEMM reductions run as a multiple-of-64 head plus a short tail (``_gemm``:
OpenBLAS's threaded and serial drivers block other lengths differently), so
results are the same for any pool or BLAS thread count (measured for float32;
float64 GEMMs with some edge shapes still differ inside OpenBLAS).

Max pooling with indices over non-overlapping windows works on blocks of whole
planes (``_POOL_BLOCK``) whose temporaries stay in cache, 2x2 windows in two
pairwise passes (rows over whole plane rows, then columns as one strided loop:
numpy's per-row loop overhead, not memory, is what short output rows cost);
``max_pool_backward`` writes the gradient at the forward's indices block by
block, into calloc'd zeros. Both run large inputs' blocks on flex's pool, and
both are elementwise per plane, so any split gives the same bits.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import threads
from .attention_kernels import _serial_blas

__all__ = [
    "conv",
    "conv_transpose",
    "conv_weight_grad",
    "conv_input_grad",
    "max_pool",
    "max_pool_backward",
    "avg_pool",
    "adaptive_avg_pool",
    "adaptive_max_pool",
    "interpolate",
    "pad",
    "unfold",
    "fold",
]

IntOrTuple = int | Sequence[int]

# Below this many reduction elements (C_in/groups * prod(k)) the NC-spatial
# ("channels-first") im2col layout is used; above it a channels-last layout
# whose inner copy runs are long and contiguous.
_CL_MIN_REDUCTION = 32

#: scratch a chunked convolution kernel works in per chunk of the batch (im2col rows, the GEMM's output): about
#: a core's L2, so the copy that fills it and the GEMM that reads it stay in cache. Measured on the seed CNN's
#: 64->64 3x3 convolution (batch 64, one thread, CPU time, alternating): 1 MB chunks made forward + both gradients
#: 15-25 % faster than whole-batch scratch, which streams tens of MB through memory
_CHUNK_BYTES = 2 << 20
#: at most this many chunks (larger chunks for large batches) where a chunk's GEMM may run on BLAS's threads (the
#: first layer's weight gradient, :func:`_batch_chunk`): a multi-threaded BLAS call costs a wake-up and a join of
#: BLAS's threads -- on cores busy with other work, milliseconds each (two threads on two loaded cores, wall time:
#: 22 chunks of the input gradient's 9 per-tap GEMMs took 5x the whole-batch kernel; 8 chunks 1.5x; 4 chunks
#: 0.85x). The channels-last kernels instead run cache-sized chunks on flex's pool with one BLAS thread each
#: (:func:`_cache_chunk`, :func:`_run_chunks`): seed CNN's 64->64 3x3 convolution at batch 256, one thread, CPU
#: time, alternating: forward 0.79x, weight gradient 0.90x, input gradient 0.84x the four-chunk kernels' time
_MAX_CHUNKS = 4
#: reductions (GEMM K) up to this length run as one BLAS call; longer ones as a multiple of _K_ALIGN plus a tail
#: (see _gemm): OpenBLAS's block lengths are multiples of 64 and at least this long, its unrolls at most 32
_K_SAFE = 256
_K_ALIGN = 64


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def _work_dtype(dt: np.dtype) -> np.dtype:
    """Dtype used for arithmetic: float64 stays float64, all else float32."""
    dt = np.dtype(dt)
    if dt == np.float64:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _tup(v, nd: int, name: str = "value") -> tuple[int, ...]:
    if isinstance(v, (int, np.integer)):
        return (int(v),) * nd
    t = tuple(int(e) for e in v)
    if len(t) == 1 and nd > 1:
        t = t * nd
    if len(t) != nd:
        raise ValueError(f"{name} must have {nd} elements, got {t}")
    return t


def _pairs(p, nd: int) -> tuple[tuple[int, int], ...]:
    """Normalise padding to per-dim (lo, hi) pairs."""
    if isinstance(p, (int, np.integer)):
        return ((int(p), int(p)),) * nd
    p = tuple(p)
    out = []
    for e in p:
        if isinstance(e, (int, np.integer)):
            out.append((int(e), int(e)))
        else:
            lo, hi = e
            out.append((int(lo), int(hi)))
    if len(out) == 1 and nd > 1:
        out = out * nd
    if len(out) != nd:
        raise ValueError(f"padding must have {nd} entries, got {p}")
    return tuple(out)


def _finish(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast to ``dtype`` and make C-contiguous (copying only if needed)."""
    if y.dtype != dtype:
        return np.ascontiguousarray(y.astype(dtype, copy=False))
    return np.ascontiguousarray(y)


def _pad_zero(x: np.ndarray, pads, lead: int, value=0.0,
              trailing: int = 0) -> np.ndarray:
    """Pad the spatial dims of ``x`` (starting at axis ``lead``) with a constant.

    ``pads`` is a sequence of (lo, hi) pairs; negative entries crop.  Returns
    ``x`` unchanged (no copy) when nothing has to be done.
    """
    # cropping first
    sl = [slice(None)] * x.ndim
    crop = False
    for i, (lo, hi) in enumerate(pads):
        if lo < 0 or hi < 0:
            n = x.shape[lead + i]
            sl[lead + i] = slice(max(-lo, 0), n - max(-hi, 0))
            crop = True
    if crop:
        x = x[tuple(sl)]
    pp = [(max(lo, 0), max(hi, 0)) for lo, hi in pads]
    if not any(lo or hi for lo, hi in pp):
        return x
    shape = list(x.shape)
    for i, (lo, hi) in enumerate(pp):
        shape[lead + i] += lo + hi
    if value == 0:
        buf = np.zeros(shape, dtype=x.dtype)
    else:
        buf = np.full(shape, value, dtype=x.dtype)
    inner = [slice(None)] * x.ndim
    for i, (lo, _hi) in enumerate(pp):
        inner[lead + i] = slice(lo, lo + x.shape[lead + i])
    buf[tuple(inner)] = x
    return buf


def _conv_out_size(size, lo, hi, k, s, d) -> int:
    return (size + lo + hi - d * (k - 1) - 1) // s + 1


def _pool_out_size(size, pad, k, s, d, ceil_mode) -> int:
    """torch pooling_output_shape (symmetric padding)."""
    num = size + 2 * pad - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    o = num // s + 1
    if ceil_mode and (o - 1) * s >= size + pad:
        o -= 1
    return o


def _unbatch(x: np.ndarray, nd: int):
    """Add a batch axis for unbatched (C, *spatial) input."""
    if x.ndim == nd + 1:
        return x[None], True
    if x.ndim != nd + 2:
        raise ValueError(f"expected {nd + 1}-D or {nd + 2}-D input, got {x.ndim}-D")
    return x, False


# --------------------------------------------------------------------------
# im2col / col2im
# --------------------------------------------------------------------------

def _windows_cf(xp: np.ndarray, groups: int, K, O, stride, dilation) -> np.ndarray:
    """Read-only view (N, G, Cg, *K, *O) of padded channels-first input."""
    N, C = xp.shape[:2]
    nd = len(K)
    sN, sC = xp.strides[:2]
    sS = xp.strides[2:]
    Cg = C // groups
    shape = (N, groups, Cg) + tuple(K) + tuple(O)
    strides = ((sN, Cg * sC, sC)
               + tuple(dilation[i] * sS[i] for i in range(nd))
               + tuple(stride[i] * sS[i] for i in range(nd)))
    return as_strided(xp, shape, strides, writeable=False)


def _windows_cl(xcl: np.ndarray, groups: int, K, O, stride, dilation) -> np.ndarray:
    """Read-only view (G, N, *O, *K, Cg) of padded channels-last input."""
    N = xcl.shape[0]
    C = xcl.shape[-1]
    nd = len(K)
    sN = xcl.strides[0]
    sS = xcl.strides[1:-1]
    sC = xcl.strides[-1]
    Cg = C // groups
    shape = (groups, N) + tuple(O) + tuple(K) + (Cg,)
    strides = ((Cg * sC, sN)
               + tuple(stride[i] * sS[i] for i in range(nd))
               + tuple(dilation[i] * sS[i] for i in range(nd))
               + (sC,))
    return as_strided(xcl, shape, strides, writeable=False)


def _to_cl_padded(x: np.ndarray, pads) -> np.ndarray:
    """Channels-last copy of ``x`` (N, C, *S) with zero spatial padding."""
    nd = x.ndim - 2
    # crop negative pads on the (cheap) view first
    sl = [slice(None)] * x.ndim
    for i, (lo, hi) in enumerate(pads):
        if lo < 0 or hi < 0:
            n = x.shape[2 + i]
            sl[2 + i] = slice(max(-lo, 0), n - max(-hi, 0))
    x = x[tuple(sl)]
    pp = [(max(lo, 0), max(hi, 0)) for lo, hi in pads]
    N, C = x.shape[:2]
    S = x.shape[2:]
    shape = (N,) + tuple(S[i] + pp[i][0] + pp[i][1] for i in range(nd)) + (C,)
    if any(lo or hi for lo, hi in pp):
        buf = np.zeros(shape, dtype=x.dtype)
    else:
        buf = np.empty(shape, dtype=x.dtype)
    inner = (slice(None),) + tuple(slice(pp[i][0], pp[i][0] + S[i]) for i in range(nd)) + (slice(None),)
    buf[inner] = np.moveaxis(x, 1, -1)
    return buf


def _gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a @ b`` (stacks as np.matmul), the same bits for any BLAS thread count.

    OpenBLAS cuts a reduction longer than its block length Q (a few hundred) into blocks, and its threaded and
    serial drivers round the last two blocks differently unless their length is a multiple of the kernel's unroll:
    measured here, sgemm results differ between 1 and 2 threads for K = 464..2096 not a multiple of 32. So a
    reduction longer than :data:`_K_SAFE` runs as a multiple-of-:data:`_K_ALIGN` head plus a short tail (below any
    Q), added in that order."""
    k = a.shape[-1]
    head = k - k % _K_ALIGN if k > _K_SAFE else k
    if head == k:
        np.matmul(a, b, out=out)
        return
    np.matmul(a[..., :head], b[..., :head, :], out=out)
    out += np.matmul(a[..., head:], b[..., head:, :])


def _batch_chunk(n: int, per_sample_bytes: int) -> int:
    """Samples per chunk of a chunked convolution: about :data:`_CHUNK_BYTES` of scratch (at least one sample),
    and no more than :data:`_MAX_CHUNKS` chunks.

    Depends on shapes only, so a chunked kernel sums in the same order for any thread count."""
    return max(1, min(n, max(_CHUNK_BYTES // max(per_sample_bytes, 1), -(-n // _MAX_CHUNKS))))


#: scratch (bytes) the pooled convolution ranges running at once may hold together (see _run_chunks)
_POOL_SCRATCH = 32 << 20


def _cache_chunk(n: int, per_sample_bytes: int) -> int:
    """Samples per chunk of a pooled convolution kernel: about :data:`_CHUNK_BYTES` of scratch (at least one
    sample), with no cap on the number of chunks -- their GEMMs run on one BLAS thread each (see
    :func:`_run_chunks`), so a chunk costs no BLAS wake-up. Depends on shapes only."""
    return max(1, min(n, _CHUNK_BYTES // max(per_sample_bytes, 1)))


def _run_chunks(count: int, body: Callable[[int, int], None], scratch: int) -> None:
    """``body(lo, hi)`` over the chunks ``range(lo, hi)`` of ``range(count)``: with several chunks, in ranges on
    flex's pool, each range's GEMMs on one BLAS thread (threaded BLAS under pool threads oversubscribes the cores,
    and a threaded BLAS call per small chunk costs a wake-up of its threads: on loaded cores, milliseconds each).
    A chunk holds about :data:`_CHUNK_BYTES` of im2col rows -- millions of multiply-adds -- so no size threshold:
    the pool's dispatch is small against any range. Every chunk is computed alike whatever the ranges and thread
    counts (:func:`_gemm` makes its GEMMs' bits independent of BLAS's thread count), so the results are too.
    ``scratch``: bytes of scratch one range allocates; ranges run at once hold at most :data:`_POOL_SCRATCH` of it
    (a sample larger than a chunk, e.g. a large image, gets fewer ranges: one runs with BLAS's threads)."""
    nt = threads.get_num_threads()
    parts = min(2 * nt, count, max(1, _POOL_SCRATCH // max(scratch, 1))) if nt > 1 else 1
    if parts < 2:
        body(0, count)
        return
    with _serial_blas:
        threads.run([(body, (i * count // parts, (i + 1) * count // parts)) for i in range(parts)])


def _pointwise(K, stride, pads, groups: int) -> bool:
    """Whether a convolution is a plain GEMM over the channels: 1x1 kernel, stride 1, no padding, one group (the
    input's (C_in, *S) planes are the GEMM's operand as they are: no im2col, no layout copies)."""
    return (groups == 1 and all(k == 1 for k in K) and all(s == 1 for s in stride)
            and all(lo == 0 and hi == 0 for lo, hi in pads))


def _samples(N: int, body: Callable[[int, int], None], per_sample_bytes: int) -> None:
    """``body(lo, hi)`` over ranges of the batch's samples on flex's pool (see :func:`_run_chunks`): a pointwise
    convolution's per-sample GEMMs, one BLAS thread each where the ranges run on the pool."""
    nb = _cache_chunk(N, per_sample_bytes)
    starts = range(0, N, nb)

    def ranges(lo: int, hi: int) -> None:
        body(starts[lo], min(N, starts[hi - 1] + nb))

    _run_chunks(len(starts), ranges, 0)


def _im2col_cl(xcl: np.ndarray, groups: int, K, O, stride, dilation, flat: np.ndarray) -> np.ndarray:
    """Channels-last im2col of ``xcl`` (n, *P, C), padded, into the front of the scratch ``flat``:
    (G, n*L, prod(K)*Cg), each row one output position's window ordered (*K, Cg)."""
    v = _windows_cl(xcl, groups, K, O, stride, dilation)  # (G, n, *O, *K, Cg)
    cols = flat[:v.size].reshape(v.shape)
    np.copyto(cols, v)
    G, n = v.shape[:2]
    return cols.reshape(G, n * math.prod(O), -1)


def _col2im_add(buf: np.ndarray, cols: np.ndarray, K, I, stride, dilation) -> None:
    """Scatter-add ``cols`` (..., *K, *I) into ``buf`` (..., *F) in place.

    Tap ``t`` of input position ``i`` lands at ``i*stride + t*dilation``.
    Loops over the prod(K) kernel taps only.
    """
    nd = len(K)
    lead = cols.ndim - 2 * nd
    for tap in itertools.product(*(range(k) for k in K)):
        dst = [slice(None)] * lead
        for i in range(nd):
            start = tap[i] * dilation[i]
            dst.append(slice(start, start + (I[i] - 1) * stride[i] + 1, stride[i]))
        src = (Ellipsis,) + tuple(tap) + (slice(None),) * nd
        buf[tuple(dst)] += cols[src]


# --------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------

def _prep_conv(x, w, stride, padding, dilation, groups):
    nd = w.ndim - 2
    if nd < 1:
        raise ValueError("weight must have at least 3 dims")
    stride = _tup(stride, nd, "stride")
    dilation = _tup(dilation, nd, "dilation")
    pads = _pairs(padding, nd)
    groups = int(groups)
    return nd, stride, pads, dilation, groups


def conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
         stride: IntOrTuple = 1, padding=0, dilation: IntOrTuple = 1,
         groups: int = 1) -> np.ndarray:
    """N-d convolution (cross-correlation), torch.nn.functional.convN semantics.

    x: (N, C_in, *S) (or unbatched (C_in, *S)); w: (C_out, C_in/groups, *k);
    b: (C_out,) or None; padding: per-dim (lo, hi) pairs (may be asymmetric;
    negative values crop).  Returns (N, C_out, *O) with x's dtype.
    """
    x = np.asarray(x)
    w = np.asarray(w)
    nd, stride, pads, dilation, groups = _prep_conv(x, w, stride, padding, dilation, groups)
    out_dtype = x.dtype
    wd = _work_dtype(x.dtype)
    x, unb = _unbatch(x, nd)
    x = x.astype(wd, copy=False)
    w = w.astype(wd, copy=False)

    N, C = x.shape[:2]
    S = x.shape[2:]
    Cout, Cg = w.shape[:2]
    K = w.shape[2:]
    G = groups
    if C != Cg * G:
        raise ValueError(f"expected input with {Cg * G} channels, got {C}")
    if Cout % G:
        raise ValueError("out_channels must be divisible by groups")
    Cog = Cout // G
    O = tuple(_conv_out_size(S[i], pads[i][0], pads[i][1], K[i], stride[i], dilation[i])
              for i in range(nd))
    if any(o <= 0 for o in O):
        raise ValueError(f"computed output size {O} is too small (input {S}, kernel {K})")
    L = math.prod(O)
    Kp = math.prod(K)
    R = Cg * Kp  # reduction length

    if N == 0 or L == 0 or R == 0:
        y = np.zeros((N, Cout) + O, dtype=wd)
    elif _pointwise(K, stride, pads, G) and R >= _CL_MIN_REDUCTION:
        # 1x1: y_n (Cout, L) = W (Cout, Cin) @ x_n (Cin, L), written in place, per sample (below
        # _CL_MIN_REDUCTION input channels the channels-first branch's one batched GEMM was faster)
        x3 = np.ascontiguousarray(x).reshape(N, C, L)
        w2 = np.ascontiguousarray(w.reshape(Cout, C))
        out = np.empty((N, Cout, L), dtype=wd)
        bb = None if b is None else np.asarray(b).astype(wd, copy=False).reshape(Cout, 1)
        b = None

        def samples(lo: int, hi: int) -> None:
            _gemm(w2, x3[lo:hi], out[lo:hi])
            if bb is not None:
                out[lo:hi] += bb

        _samples(N, samples, L * (C + Cout) * wd.itemsize)
        y = out.reshape((N, Cout) + O)
    elif R < _CL_MIN_REDUCTION:
        # channels-first: cols (N, G, Cg*K[+1], L); y = W_g @ cols -> (N, G, Cog, L)
        # The bias is folded into the GEMM as an extra row of ones.
        xp = _pad_zero(x, pads, 2)
        v = _windows_cf(xp, G, K, O, stride, dilation)
        wm = w.reshape(G, Cog, R)
        cols = None
        if b is not None:
            cols = np.empty((N, G, R + 1, L), dtype=wd)
            tgt = cols[:, :, :R].reshape(v.shape)
            if np.may_share_memory(tgt, cols):
                tgt[...] = v
                cols[:, :, R] = 1
                bw = np.asarray(b).astype(wd, copy=False).reshape(G, Cog, 1)
                wm = np.concatenate([wm, bw], axis=2)
                b = None
            else:  # pragma: no cover - reshape of a split view always works
                cols = None
        if cols is None:
            cols = v.reshape(N, G, R, L)
        y = np.matmul(wm, cols).reshape((N, Cout) + O)
    else:
        # channels-last, a chunk of the batch at a time: cols (G, n*L, K*Cg); y = cols @ W_g -> (G, n*L, Cog),
        # transposed (with the bias added in the same pass) into the (N, G, Cog, L) result
        wm = np.moveaxis(w.reshape((G, Cog, Cg) + K), 1, -1)
        wm = np.ascontiguousarray(np.moveaxis(wm, 1, 1 + nd)).reshape(G, R, Cog)  # (G, *K, Cg, Cog)
        bb = None if b is None else np.asarray(b).astype(wd, copy=False).reshape(G, Cog, 1)
        b = None
        out = np.empty((N, G, Cog, L), dtype=wd)
        nb = _cache_chunk(N, G * L * (R + Cog) * wd.itemsize)
        starts = range(0, N, nb)

        def chunks(lo: int, hi: int) -> None:
            cflat = np.empty(G * nb * L * R, dtype=wd)
            yflat = np.empty(G * nb * L * Cog, dtype=wd)
            for n0 in starts[lo:hi]:
                n = min(nb, N - n0)
                # the chunk's own channels-last copy: it stays in cache for the im2col, and runs on the chunk's
                # thread (a whole-batch copy first would be serial; measured neutral on one thread, 0.9x on two)
                cols = _im2col_cl(_to_cl_padded(x[n0:n0 + n], pads), G, K, O, stride, dilation, cflat)
                yb = yflat[:G * n * L * Cog].reshape(G, n * L, Cog)
                _gemm(cols, wm, yb)
                src = yb.reshape(G, n, L, Cog).transpose(1, 0, 3, 2)
                if bb is None:
                    np.copyto(out[n0:n0 + n], src)
                else:
                    np.add(src, bb, out=out[n0:n0 + n])

        _run_chunks(len(starts), chunks, G * nb * L * (R + Cog) * wd.itemsize)
        y = out.reshape((N, Cout) + O)
    if b is not None:
        bb = np.asarray(b).astype(wd, copy=False).reshape((1, Cout) + (1,) * nd)
        y += bb
    if unb:
        y = y[0]
    return _finish(y, out_dtype)


def conv_weight_grad(x: np.ndarray, grad_y: np.ndarray, w_shape: Sequence[int],
                     stride: IntOrTuple = 1, padding=0, dilation: IntOrTuple = 1,
                     groups: int = 1) -> np.ndarray:
    """Gradient of :func:`conv` w.r.t. the weight.

    x: (N, C_in, *S); grad_y: (N, C_out, *O); returns grad_w of shape
    ``w_shape`` = (C_out, C_in/groups, *k), dtype of x.
    """
    x = np.asarray(x)
    grad_y = np.asarray(grad_y)
    w_shape = tuple(int(s) for s in w_shape)
    nd = len(w_shape) - 2
    stride = _tup(stride, nd, "stride")
    dilation = _tup(dilation, nd, "dilation")
    pads = _pairs(padding, nd)
    G = int(groups)
    out_dtype = x.dtype
    wd = _work_dtype(x.dtype)
    x, unb = _unbatch(x, nd)
    if unb:
        grad_y = grad_y[None]
    x = x.astype(wd, copy=False)
    grad_y = grad_y.astype(wd, copy=False)

    N, C = x.shape[:2]
    Cout, Cg = w_shape[:2]
    K = w_shape[2:]
    Cog = Cout // G
    O = grad_y.shape[2:]
    L = math.prod(O)
    Kp = math.prod(K)
    R = Cg * Kp
    if N == 0 or L == 0 or R == 0 or Cout == 0:
        return np.zeros(w_shape, dtype=out_dtype)
    for i in range(nd):
        need = (O[i] - 1) * stride[i] + dilation[i] * (K[i] - 1) + 1
        if need > x.shape[2 + i] + pads[i][0] + pads[i][1]:
            raise ValueError("grad_y spatial size inconsistent with input/params")

    if _pointwise(K, stride, pads, G) and R >= _CL_MIN_REDUCTION:
        # 1x1: gw (Cout, Cin) += gy_chunk (Cout, n*L) @ x_chunk (Cin, n*L)^T, the chunks' (Cout, n, L) and
        # (Cin, n, L) copies runs of L elements; each chunk's sum kept, added in chunk order (as below)
        x3, gy3 = x.reshape(N, C, L), grad_y.reshape(N, Cout, L)
        nb = _cache_chunk(N, L * (C + Cout) * wd.itemsize)
        starts = range(0, N, nb)
        parts = np.empty((len(starts), Cout, C), dtype=wd)

        def chunks(lo: int, hi: int) -> None:
            xflat = np.empty(nb * L * C, dtype=wd)
            gflat = np.empty(nb * L * Cout, dtype=wd)
            for c in range(lo, hi):
                n0 = starts[c]
                n = min(nb, N - n0)
                xt = xflat[:C * n * L].reshape(C, n, L)
                np.copyto(xt, x3[n0:n0 + n].transpose(1, 0, 2))
                gt = gflat[:Cout * n * L].reshape(Cout, n, L)
                np.copyto(gt, gy3[n0:n0 + n].transpose(1, 0, 2))
                _gemm(gt.reshape(Cout, n * L), xt.reshape(C, n * L).T, parts[c])

        _run_chunks(len(starts), chunks, nb * L * (C + Cout) * wd.itemsize)
        gw = parts[0]
        for c in range(1, len(starts)):
            gw += parts[c]
        gw = gw.reshape(w_shape)
    elif R < _CL_MIN_REDUCTION:
        # short reduction (few input channels, the first layer): per sample gy_n (Cog, L) @ cols_n^T (L, R) with
        # the channels-first windows, batched over (n, G) -- no transposed copy of grad_y -- then summed over n
        xp = _pad_zero(x, pads, 2)
        gy4 = grad_y.reshape(N, G, Cog, L)
        gw = np.zeros((G, Cog, R), dtype=wd)
        nb = _batch_chunk(N, G * (R * L + Cog * R) * wd.itemsize)
        cflat = np.empty(G * nb * R * L, dtype=wd)
        pflat = np.empty(G * nb * Cog * R, dtype=wd)
        for n0 in range(0, N, nb):
            n = min(nb, N - n0)
            v = _windows_cf(xp[n0:n0 + n], G, K, O, stride, dilation)  # (n, G, Cg, *K, *O)
            cols = cflat[:v.size].reshape(v.shape)
            np.copyto(cols, v)
            part = pflat[:n * G * Cog * R].reshape(n, G, Cog, R)
            _gemm(gy4[n0:n0 + n], cols.reshape(n, G, R, L).swapaxes(-1, -2), part)
            gw += part.sum(axis=0)
        gw = gw.reshape(w_shape)  # R ordered (Cg, *K)
    else:
        # channels-last, a chunk of the batch at a time: gw (G, Cog, R) += gy_chunk (G, Cog, n*L) @ cols (G, n*L, R)
        gy5 = grad_y.reshape(N, G, Cog, L)
        nb = _cache_chunk(N, G * L * (R + Cog) * wd.itemsize)
        starts = range(0, N, nb)
        parts = np.empty((len(starts), G, Cog, R), dtype=wd)  # each chunk's sum, added in chunk order below

        def chunks(lo: int, hi: int) -> None:
            cflat = np.empty(G * nb * L * R, dtype=wd)
            gflat = np.empty(G * nb * L * Cog, dtype=wd)
            for c in range(lo, hi):
                n0 = starts[c]
                n = min(nb, N - n0)
                cols = _im2col_cl(_to_cl_padded(x[n0:n0 + n], pads), G, K, O, stride, dilation, cflat)
                gt = gflat[:G * Cog * n * L].reshape(G, Cog, n, L)
                np.copyto(gt, gy5[n0:n0 + n].transpose(1, 2, 0, 3))
                _gemm(gt.reshape(G, Cog, n * L), cols, parts[c])

        _run_chunks(len(starts), chunks, G * nb * L * (R + Cog) * wd.itemsize)
        gw = parts[0]
        for c in range(1, len(starts)):
            gw += parts[c]
        gw = gw.reshape((Cout,) + tuple(K) + (Cg,))  # R ordered (*K, Cg)
        gw = np.moveaxis(gw, -1, 1)
    return _finish(gw, out_dtype)


def conv_transpose(x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                   stride: IntOrTuple = 1, padding: IntOrTuple = 0,
                   output_padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                   groups: int = 1) -> np.ndarray:
    """Transposed N-d convolution, torch.nn.functional.conv_transposeN semantics.

    x: (N, C_in, *I); w: (C_in, C_out/groups, *k); padding: per-dim int
    (symmetric, as torch); returns (N, C_out, *O) with
    O = (I-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1.
    Implemented as matmul + col2im (gradient of conv w.r.t. its input).
    """
    x = np.asarray(x)
    w = np.asarray(w)
    nd = w.ndim - 2
    stride = _tup(stride, nd, "stride")
    dilation = _tup(dilation, nd, "dilation")
    pad_ = _tup(padding, nd, "padding")
    opad = _tup(output_padding, nd, "output_padding")
    G = int(groups)
    out_dtype = x.dtype
    wd = _work_dtype(x.dtype)
    x, unb = _unbatch(x, nd)
    x = x.astype(wd, copy=False)
    w = w.astype(wd, copy=False)

    N, Cin = x.shape[:2]
    I = x.shape[2:]
    Cog = w.shape[1]
    K = w.shape[2:]
    if w.shape[0] != Cin:
        raise ValueError(f"weight expects {w.shape[0]} input channels, got {Cin}")
    Cig = Cin // G
    Cout = Cog * G
    O = tuple((I[i] - 1) * stride[i] - 2 * pad_[i] + dilation[i] * (K[i] - 1) + opad[i] + 1
              for i in range(nd))
    if any(o <= 0 for o in O):
        raise ValueError(f"computed output size {O} is too small")
    if all(st == 1 for st in stride) and Cig * math.prod(K) < 256 and N and math.prod(I) and Cout:
        # stride 1: a plain convolution with the flipped, transposed weight
        # (one dense GEMM with a long reduction -- faster than col2im).
        wf = w.reshape((G, Cig, Cog) + tuple(K)).swapaxes(1, 2)
        wf = wf[(Ellipsis,) + (slice(None, None, -1),) * nd].reshape((Cout, Cig) + tuple(K))
        cp = tuple((dilation[i] * (K[i] - 1) - pad_[i],
                    dilation[i] * (K[i] - 1) - pad_[i] + opad[i]) for i in range(nd))
        y = conv(x, wf, b, (1,) * nd, cp, dilation, G)
        if unb:
            y = y[0]
        return _finish(y, out_dtype)
    y = _conv_input_grad_core(x, w, N, G, Cig, Cog, I, K, O, stride,
                              tuple((p, p) for p in pad_), dilation, wd)
    if b is not None:
        y += np.asarray(b).astype(wd, copy=False).reshape((1, Cout) + (1,) * nd)
    if unb:
        y = y[0]
    return _finish(y, out_dtype)


#: the input gradient runs one GEMM per kernel tap from this many output channels per group on (see
#: _conv_input_grad_core); with one (a single input channel, depthwise), one GEMM for all taps: per-tap GEMMs with
#: one column were 1.1-1.3x its time (one thread, CPU time, alternating); from 2 channels on, per tap 0.3-0.9x
_TAP_GEMM_MIN_COG = 2


def _conv_input_grad_core(gy, w, N, G, Cig, Cog, I, K, O, stride, pads, dilation, wd):
    """Shared core: gy (N, G*Cig, *I), w (G*Cig, Cog, *K) -> (N, G*Cog, *O).

    ``pads`` are the forward-conv (lo, hi) pads of the produced tensor.
    Channels-last, a chunk of the batch at a time. With at least :data:`_TAP_GEMM_MIN_COG` output channels per
    group, one GEMM per kernel tap, (G, n*Li, Cig) @ (G, Cig, Cog), into a contiguous scratch that is added into
    the tap's strided slice of the chunk's buffer (col2im): both sides of the add are runs of ``Cog`` (and more)
    contiguous elements. Otherwise one GEMM (G, n*Li, Cig) @ (G, Cig, prod(K)*Cog) for all taps, whose columns are
    scatter-added tap by tap, reading runs of ``Cog`` elements ``prod(K)*Cog`` apart. Both add the taps in the
    same order, each from a GEMM of the same reduction (measured: the same bits at the seed CNN's shapes). Seed
    CNN's 64->64 3x3 input gradient, one thread, CPU time, alternating: per tap 0.91-0.95x the one-GEMM kernel's
    time at batches 64 and 256 (whose strided adds took about 9 of 20 ms); 0.3-0.75x with 2-16 channels per group.
    """
    nd = len(K)
    Cout = G * Cog
    I = tuple(I)
    K = tuple(K)
    O = tuple(O)
    Li = math.prod(I)
    if N == 0 or Li == 0 or Cout == 0:
        return np.zeros((N, Cout) + O, dtype=wd)
    Kp = math.prod(K)
    per_tap = Cog >= _TAP_GEMM_MIN_COG and Kp > 1
    if per_tap:
        # w -> (Kp, G, Cig, Cog): each tap's (G, Cig, Cog) weight contiguous
        wt = np.ascontiguousarray(np.moveaxis(w.reshape((G, Cig, Cog, Kp)), -1, 0))
        cols_len = Li * Cog
    else:
        # w -> (G, Cig, *K, Cog) -> (G, Cig, Kp*Cog): one GEMM gives every tap's contribution
        wc = np.ascontiguousarray(np.moveaxis(w.reshape((G, Cig, Cog) + K), 2, -1)).reshape(G, Cig, Kp * Cog)
        cols_len = Li * Kp * Cog
    F = tuple(max((I[i] - 1) * stride[i] + dilation[i] * (K[i] - 1) + 1,
                  pads[i][0] + O[i]) for i in range(nd))
    lo_extra = tuple(max(-pads[i][0], 0) for i in range(nd))
    F = tuple(F[i] + lo_extra[i] for i in range(nd))
    Fp = math.prod(F)
    crop = (slice(None), slice(None)) + tuple(
        slice(pads[i][0] + lo_extra[i], pads[i][0] + lo_extra[i] + O[i]) for i in range(nd))
    dsts = []
    for tap in itertools.product(*(range(k) for k in K)):
        dst = [slice(None), slice(None)]
        for i in range(nd):
            st = lo_extra[i] + tap[i] * dilation[i]
            dst.append(slice(st, st + (I[i] - 1) * stride[i] + 1, stride[i]))
        dsts.append((tap, tuple(dst)))
    gy5 = gy.reshape((N, G, Cig) + I)
    to_cl = (1, 0) + tuple(range(3, 3 + nd)) + (2,)       # (n, G, Cig, *I) -> (G, n, *I, Cig)
    to_cf = (1, 0, 2 + nd) + tuple(range(2, 2 + nd))      # (G, n, *O, Cog) -> (n, G, Cog, *O)
    out = np.empty((N, G, Cog) + O, dtype=wd)
    # a chunk of the batch at a time, so gy's channels-last copy, the GEMMs' output and the col2im buffer stay in
    # cache (see _run_chunks)
    per_sample = G * (Li * Cig + cols_len + Fp * Cog) * wd.itemsize
    nb = _cache_chunk(N, per_sample)
    starts = range(0, N, nb)

    def chunks(lo: int, hi: int) -> None:
        gflat = np.empty(G * nb * Li * Cig, dtype=wd)
        cflat = np.empty(G * nb * cols_len, dtype=wd)
        bflat = np.empty(G * nb * Fp * Cog, dtype=wd)
        for n0 in starts[lo:hi]:
            n = min(nb, N - n0)
            xm = gflat[:G * n * Li * Cig].reshape((G, n) + I + (Cig,))
            np.copyto(xm, gy5[n0:n0 + n].transpose(to_cl))
            xm2 = xm.reshape(G, n * Li, Cig)
            buf = bflat[:G * n * Fp * Cog].reshape((G, n) + F + (Cog,))
            buf.fill(0)
            if per_tap:
                cols = cflat[:G * n * Li * Cog].reshape(G, n * Li, Cog)
                colv = cols.reshape((G, n) + I + (Cog,))
                for t, (_tap, dst) in enumerate(dsts):
                    _gemm(xm2, wt[t], cols)
                    buf[dst] += colv
            else:
                cols = cflat[:G * n * Li * Kp * Cog].reshape(G, n * Li, Kp * Cog)
                _gemm(xm2, wc, cols)
                colv = cols.reshape((G, n) + I + K + (Cog,))
                for tap, dst in dsts:
                    buf[dst] += colv[(slice(None),) * (2 + nd) + tap]
            np.copyto(out[n0:n0 + n], buf[crop].transpose(to_cf))

    _run_chunks(len(starts), chunks, nb * per_sample)
    return out.reshape((N, Cout) + O)


def conv_input_grad(grad_y: np.ndarray, w: np.ndarray, x_shape: Sequence[int],
                    stride: IntOrTuple = 1, padding=0, dilation: IntOrTuple = 1,
                    groups: int = 1) -> np.ndarray:
    """Gradient of :func:`conv` w.r.t. its input (x_shape = (N, C_in, *S)).

    padding: per-dim (lo, hi) pairs as for :func:`conv`.
    """
    grad_y = np.asarray(grad_y)
    w = np.asarray(w)
    nd = w.ndim - 2
    stride = _tup(stride, nd, "stride")
    dilation = _tup(dilation, nd, "dilation")
    pads = _pairs(padding, nd)
    G = int(groups)
    out_dtype = grad_y.dtype
    wd = _work_dtype(grad_y.dtype)
    x_shape = tuple(int(s) for s in x_shape)
    unb = len(x_shape) == nd + 1
    if unb:
        x_shape = (1,) + x_shape
        grad_y = grad_y[None]
    gy = grad_y.astype(wd, copy=False)
    w = w.astype(wd, copy=False)
    Cout, Cg = w.shape[:2]
    Cog = Cout // G
    N, L = x_shape[0], math.prod(x_shape[2:])
    if (_pointwise(w.shape[2:], stride, pads, G) and tuple(gy.shape[2:]) == x_shape[2:]
            and N and L and Cout and Cg):
        # 1x1: gx_n (Cin, L) = W^T (Cin, Cout) @ gy_n (Cout, L), written in place, per sample
        gy3 = np.ascontiguousarray(gy).reshape(N, Cout, L)
        wt = np.ascontiguousarray(w.reshape(Cout, Cg).T)
        out = np.empty((N, Cg, L), dtype=wd)
        _samples(N, lambda lo, hi: _gemm(wt, gy3[lo:hi], out[lo:hi]), L * (Cg + Cout) * wd.itemsize)
        y = out.reshape(x_shape)
        if unb:
            y = y[0]
        return _finish(y, out_dtype)
    # conv weight (Cout, Cg, *K) viewed as a transposed-conv weight (G*Cog, Cg, *K)
    y = _conv_input_grad_core(gy, w, x_shape[0], G, Cog, Cg, gy.shape[2:], w.shape[2:],
                              x_shape[2:], stride, pads, dilation, wd)
    if unb:
        y = y[0]
    return _finish(y, out_dtype)


# --------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------

def _pool_setup(x, kernel_size, stride, padding, dilation):
    x = np.asarray(x)
    if isinstance(kernel_size, (int, np.integer)):
        nd = x.ndim - 2
    else:
        nd = len(tuple(kernel_size))
    K = _tup(kernel_size, nd, "kernel_size")
    if stride is None or (not isinstance(stride, (int, np.integer)) and len(tuple(stride)) == 0):
        stride = K
    stride = _tup(stride, nd, "stride")
    padding = _tup(padding, nd, "padding")
    dilation = _tup(dilation, nd, "dilation")
    return x, nd, K, stride, padding, dilation


def _min_value(dt):
    if dt.kind == "f":
        return -np.inf
    if dt.kind in "iu":
        return np.iinfo(dt).min
    if dt.kind == "b":
        return False
    raise TypeError(f"unsupported dtype {dt}")


#: input elements per block of the tiled max pooling (512 KiB of float32): a block's temporaries (pair maxima,
#: comparison masks, tap numbers) stay in cache, and large inputs' blocks run on flex's pool
_POOL_BLOCK = 1 << 17


def _max_pool_tiled(x: np.ndarray, K: tuple[int, ...], O: tuple[int, ...], lead: int
                    ) -> tuple[np.ndarray, np.ndarray] | None:
    """Max pooling with indices for non-overlapping, unpadded windows (stride == kernel, the usual 2x2 pool), on
    blocks of whole planes (about :data:`_POOL_BLOCK` input elements each; on flex's pool for large inputs): each
    block's maxima and first-tap indices written straight into the outputs (:func:`_pool_2x2_into` for 2x2 windows,
    :func:`_pool_taps_into` otherwise). Elementwise per plane, so any split gives the same
    result. Returns None when the result holds NaN (torch keeps the last NaN there; the caller's tap loop does)."""
    S = x.shape[lead:]
    B = x.shape[:lead]
    planes = x.reshape((-1,) + S)
    n = planes.shape[0]
    v = np.empty((n,) + tuple(O), x.dtype)
    idx = np.empty((n,) + tuple(O), np.int64)
    kernel = _pool_2x2_into if tuple(K) == (2, 2) else _pool_taps_into
    per = max(1, _POOL_BLOCK // max(math.prod(S), 1))
    starts = range(0, n, per)
    nan: list[bool] = []

    def blocks(lo: int, hi: int) -> None:
        for p0 in starts[lo:hi]:
            p1 = min(n, p0 + per)
            if not kernel(planes[p0:p1], K, O, v[p0:p1], idx[p0:p1]):
                nan.append(True)
                return

    nt = threads.get_num_threads()
    parts = min(2 * nt, len(starts)) if nt > 1 and x.size >= threads.min_elems else 1
    if parts < 2:
        blocks(0, len(starts))
    else:
        threads.run([(blocks, (i * len(starts) // parts, (i + 1) * len(starts) // parts)) for i in range(parts)])
    if nan:
        return None
    return v.reshape(B + tuple(O)), idx.reshape(B + tuple(O))


def _pool_taps_into(x: np.ndarray, K: tuple[int, ...], O: tuple[int, ...], v: np.ndarray,
                    idx: np.ndarray) -> bool:
    """Tiled max pooling of planes x (n, *S) into v and idx (n, *O): the max over strided tap views, then the index
    of the first tap equal to it (as the tap loop: first maximum wins), on output-sized arrays only. False (v and
    idx unfinished) when a maximum is NaN."""
    nd = len(K)
    S = x.shape[1:]
    pstr = [math.prod(S[i + 1:]) for i in range(nd)]
    taps = list(itertools.product(*(range(k) for k in K)))
    views = [x[(Ellipsis,) + tuple(slice(t[i], t[i] + (O[i] - 1) * K[i] + 1, K[i]) for i in range(nd))]
             for t in taps]
    np.copyto(v, views[0])
    for w in views[1:]:
        np.maximum(v, w, out=v)
    if v.size and np.isnan(v.max()):  # max propagates NaN: one reduction instead of an isnan array
        return False
    offs = np.array([sum(t[i] * pstr[i] for i in range(nd)) for t in taps], dtype=np.int64)
    # walk the taps backwards so the earliest tap equal to the max wins: tid = k where tap k equals the max, as
    # branch-free arithmetic on small tap numbers (a masked assignment branches on every random comparison)
    tdt = np.uint8 if len(taps) <= 256 else np.int64
    tid = np.full(v.shape, len(taps) - 1, dtype=tdt)
    eq = np.empty(v.shape, np.bool_)
    step = np.empty(v.shape, tdt)
    for k in range(len(taps) - 2, -1, -1):
        np.equal(views[k], v, out=eq)
        np.subtract(tid, tdt(k), out=step)  # wraps modulo 256 for uint8; tid - step * eq is exact all the same
        step *= eq
        tid -= step
    np.take(offs, tid, out=idx, mode="clip")  # in range; "raise" would buffer the output
    base = np.zeros(O, dtype=np.int64)
    for i in range(nd):
        shp = [1] * nd
        shp[i] = O[i]
        base = base + (np.arange(O[i], dtype=np.int64) * (K[i] * pstr[i])).reshape(shp)
    idx += base
    return True


def _pool_2x2_into(x: np.ndarray, K: tuple[int, ...], O: tuple[int, ...], v: np.ndarray, idx: np.ndarray) -> bool:
    """:func:`_pool_taps_into` for 2x2 windows (planes x (n, H, W), the last odd row or column cropped): rows first,
    then columns. The max of each column's row pair over whole rows (numpy's inner loop runs along a plane's row)
    and which row won it; then, on that contiguous half-size array, the max of each column pair -- a single strided
    loop over the block, as are all the passes after it. The first tap in row-major order (torch's window loop)
    among those equal to the max: the right column's winner where its row maximum is larger, or equal with the
    left column's won by the bottom row (x10) and the right column's by the top row (x01, which comes first);
    else the left column's. Its offset is looked up in a 262-entry table by ``rl | rr << 8`` (the column pair's two
    row bits, one uint16 view) ``+ 2 * ((R >= L) + (R > L))``. Measured (one thread, CPU time) against the
    columns-first form, whose per-output passes run one output row at a time: 0.84-0.89x at 26x26 planes, 0.76-0.80x
    at 11x11 and 12x12, 0.79-0.91x at 6x6. False (v and idx unfinished) on NaN."""
    W = x.shape[-1]
    o0, o1 = O
    top, bottom = x[:, 0:2 * o0:2, 0:2 * o1], x[:, 1:2 * o0:2, 0:2 * o1]
    # C order whatever the input's strides (numpy's default output order follows them): the column pairs below
    # are then one strided loop, and the row bits' uint16 view needs contiguous rows
    rmax = np.maximum(top, bottom, out=np.empty(top.shape, x.dtype))
    rbit = np.greater(bottom, top, out=np.empty(top.shape, np.bool_))  # the bottom row won (ties keep the top)
    left, right = rmax[..., 0::2], rmax[..., 1::2]
    np.maximum(left, right, out=v)
    if v.size and np.isnan(v.max()):  # max propagates NaN: one reduction instead of an isnan array
        return False
    code = np.add(np.greater_equal(right, left), np.greater(right, left), dtype=np.uint16)
    code <<= 1
    code |= rbit.view(np.uint16)  # (n, o0, 2 * o1) bool, contiguous: rl | rr << 8 per column pair
    np.take(_pair_table(W), code, out=idx, mode="clip")  # in range; "raise" would buffer the output
    if idx.size <= _POOL_BLOCK // 4:  # a block of whole planes: the cached same-shape starts (at most 256 KiB)
        idx += _pair_base(x.shape[0], o0, o1, W)
    else:  # one plane larger than a block: its long rows run the broadcast add well, and nothing large is kept
        idx += np.arange(o0, dtype=np.int64)[:, None] * (2 * W) + np.arange(o1, dtype=np.int64) * 2
    return True


@functools.lru_cache(maxsize=32)
def _pair_table(W: int) -> np.ndarray:
    """Offset of the first maximal tap of a 2x2 window in planes W wide, at ``(rl | rr << 8) + 2 * cmp`` (rl, rr: the
    left and right columns' bottom row won; cmp: 0, 1, 2 as the right column's max is below, equal to, above the
    left's); on a big-endian machine the uint16 view holds rr in its low byte, and the table follows. Read only."""
    tab = np.zeros(262, np.int64)
    lo, hi = (0, 8) if np.little_endian else (8, 0)
    for rl in (0, 1):
        for rr in (0, 1):
            for cmp in (0, 1, 2):
                right = cmp == 2 or (cmp == 1 and rl == 1 and rr == 0)
                tab[(rl << lo) + (rr << hi) + 2 * cmp] = (W + 1 if rr else 1) if right else (W if rl else 0)
    tab.flags.writeable = False
    return tab


@functools.lru_cache(maxsize=8)  # two pool layers' full and last blocks
def _pair_base(k: int, o0: int, o1: int, W: int) -> np.ndarray:
    """(k, o0, o1) flat index of each 2x2 window's first tap, the same for every plane: a same-shape operand, so
    adding it runs numpy's contiguous loop rather than one short row at a time. Cached, read only."""
    base = np.empty((k, o0, o1), np.int64)
    base[...] = np.arange(o0, dtype=np.int64)[:, None] * (2 * W) + np.arange(o1, dtype=np.int64) * 2
    base.flags.writeable = False
    return base


def max_pool(x: np.ndarray, kernel_size: IntOrTuple, stride=None, padding: IntOrTuple = 0,
             dilation: IntOrTuple = 1, ceil_mode: bool = False,
             return_indices: bool = False):
    """N-d max pooling (torch max_poolNd).  Leading dims before the last
    ``len(kernel_size)`` are batch dims.  Returns y or (y, indices) where
    indices (int64) are flat indices into each input spatial plane/volume.
    """
    x, nd, K, stride, padding, dilation = _pool_setup(x, kernel_size, stride, padding, dilation)
    out_dtype = x.dtype
    if x.dtype.kind == "f" and x.dtype != np.float64 and x.dtype != np.float32:
        xw = x.astype(np.float32)
    else:
        xw = x
    lead = x.ndim - nd
    B = x.shape[:lead]
    S = x.shape[lead:]
    O = tuple(_pool_out_size(S[i], padding[i], K[i], stride[i], dilation[i], ceil_mode)
              for i in range(nd))
    if any(o <= 0 for o in O):
        raise ValueError(f"max_pool output size {O} is too small")
    # pad so every window fits: need (O-1)*s + d*(k-1) + 1 elements from -pad
    pads = []
    for i in range(nd):
        need = (O[i] - 1) * stride[i] + dilation[i] * (K[i] - 1) + 1
        hi = need - S[i] - padding[i]
        pads.append((padding[i], hi))
    xp = _pad_zero(xw, pads, lead, value=_min_value(xw.dtype))

    def tap_view(tap):
        sl = [slice(None)] * lead
        for i in range(nd):
            st = tap[i] * dilation[i]
            sl.append(slice(st, st + (O[i] - 1) * stride[i] + 1, stride[i]))
        return xp[tuple(sl)]

    taps = list(itertools.product(*(range(k) for k in K)))
    if not return_indices:
        if math.prod(B) == 0:
            return np.zeros(B + O, dtype=out_dtype)
        # separable max: one dim at a time (k_d taps per dim)
        cur = xp
        for i in range(nd):
            ax = lead + i
            res = None
            for t in range(K[i]):
                st = t * dilation[i]
                sl = [slice(None)] * cur.ndim
                sl[ax] = slice(st, st + (O[i] - 1) * stride[i] + 1, stride[i])
                v = cur[tuple(sl)]
                if res is None:
                    res = v.copy()
                else:
                    np.maximum(res, v, out=res)
            cur = res
        return _finish(cur, out_dtype)

    if math.prod(B) == 0:
        return np.zeros(B + O, dtype=out_dtype), np.zeros(B + O, dtype=np.int64)
    if (xw.dtype.kind == "f" and tuple(stride) == tuple(K) and not any(padding) and all(d == 1 for d in dilation)
            and all(O[i] * K[i] <= S[i] for i in range(nd))):
        fast = _max_pool_tiled(xw, K, O, lead)
        if fast is not None:
            v, idx = fast
            return _finish(v, out_dtype), idx
    # full tap loop tracking the argmax (first max wins, NaN propagates like torch)
    # flat index of tap t at output o: sum_d (o_d*s_d - p_d + t_d*d_d) * plane_stride_d
    pstr = [math.prod(S[i + 1:]) for i in range(nd)]
    base = np.zeros(O, dtype=np.int64)
    first = np.zeros(O, dtype=np.int64)
    for i in range(nd):
        shp = [1] * nd
        shp[i] = O[i]
        start = np.arange(O[i], dtype=np.int64) * stride[i] - padding[i]
        base = base + (start * pstr[i]).reshape(shp)
        # first valid position in the window (torch: while (start < 0) start += d)
        fv = np.where(start < 0, start + (-start + dilation[i] - 1) // dilation[i] * dilation[i], start)
        first = first + (fv * pstr[i]).reshape(shp)
    cur = np.full(B + O, _min_value(xw.dtype), dtype=xw.dtype)
    idx = np.broadcast_to(first, B + O).copy()
    isfloat = xw.dtype.kind == "f"
    for tap in taps:
        v = tap_view(tap)
        m = v > cur
        if isfloat:
            m |= np.isnan(v)
        off = sum(tap[i] * dilation[i] * pstr[i] for i in range(nd))
        np.copyto(cur, v, where=m)
        np.copyto(idx, base + off, where=m)
    return _finish(cur, out_dtype), idx


@functools.lru_cache(maxsize=8)  # k * outs <= _POOL_BLOCK: at most 1 MiB each
def _plane_offsets(k: int, outs: int, plane: int) -> np.ndarray:
    """(k, outs) int64 table, row i all ``i * plane``: the flat start of each of a block's k planes, spread over
    the outputs so that adding it to a block's indices is one contiguous same-shape loop. Cached, read only."""
    offs = np.empty((k, outs), np.int64)
    offs[...] = (np.arange(k, dtype=np.int64) * plane)[:, None]
    offs.flags.writeable = False
    return offs


_pool_scratch = threading.local()


def _index_scratch(size: int) -> np.ndarray:
    """This thread's int64 scratch of at least ``size`` elements (a block's flat indices): kept between calls,
    so a training step's pool backward allocates no index arrays. Never outlives the caller's use of it."""
    buf = getattr(_pool_scratch, "idx", None)
    if buf is None or buf.size < size:
        buf = _pool_scratch.idx = np.empty(size, np.int64)
    return buf


def max_pool_backward(grad: np.ndarray, indices: np.ndarray, x_shape: Sequence[int], nd: int,
                      overlap: bool = False) -> np.ndarray:
    """Gradient of max pooling w.r.t. its input: each output's gradient written at its window's argmax.

    grad, indices: (*B, *O), indices (from :func:`max_pool` / :func:`adaptive_max_pool`) flat into each input
    plane of the last ``nd`` dims of ``x_shape`` (*B, *S). Where windows overlap (``overlap``), gradients landing on
    one input add up, in row-major output order; otherwise each input receives at most one. Works on blocks of
    whole planes (about :data:`_POOL_BLOCK` input elements), on flex's pool for large inputs; every plane is
    computed alike whatever the blocks. The output starts as ``np.zeros`` (calloc: a large one comes as fresh zero
    pages, so no zeroing pass of our own), each block's flat indices are the indices plus a cached same-shape table
    of plane offsets (numpy's contiguous loop; a broadcast (k, 1) column runs its slower strided one) in a
    per-thread scratch array. Measured, one thread, CPU time, against the fill-and-broadcast form: 0.81x at
    (64, 64, 13, 13) outputs, 0.76x at (64, 64, 5, 5) and at (256, 64, 13, 13). The same values as scattering into
    a zero tensor (``scatter`` along the flattened plane, ``add`` where windows overlap), bit for bit."""
    grad = np.asarray(grad)
    idx = np.asarray(indices)
    x_shape = tuple(int(d) for d in x_shape)
    nb = len(x_shape) - nd
    if nd < 1 or nb < 0 or grad.shape != idx.shape or grad.shape[:nb] != x_shape[:nb] or grad.ndim != len(x_shape):
        raise ValueError(f"max_pool_backward: grad {grad.shape} and indices {idx.shape} must share the batch dims "
                         f"of the input shape {x_shape} ({nd} pooled dims)")
    n = math.prod(x_shape[:nb])
    plane = math.prod(x_shape[nb:])
    outs = math.prod(grad.shape[nb:])
    g2 = grad.reshape(n, outs)
    i2 = idx.reshape(n, outs)
    dx = np.zeros((n, plane), grad.dtype)
    per = max(1, _POOL_BLOCK // max(plane, 1))
    starts = range(0, n, per)
    # one plane per block (planes of more than _POOL_BLOCK elements): its indices are the flat ones already
    offs = _plane_offsets(min(per, n), outs, plane) if n and plane and per > 1 else None

    def blocks(lo: int, hi: int) -> None:
        buf = _index_scratch(min(per, n) * outs) if offs is not None else None
        for b0 in starts[lo:hi]:
            b1 = min(n, b0 + per)
            d = dx[b0:b1]
            k = b1 - b0
            if offs is None:
                flat = i2[b0:b1]
            else:
                flat = np.add(i2[b0:b1], offs[:k], out=buf[:k * outs].reshape(k, outs))
            if overlap:
                np.add.at(d.reshape(-1), flat.reshape(-1), g2[b0:b1].reshape(-1))
            else:
                d.reshape(-1)[flat.reshape(-1)] = g2[b0:b1].reshape(-1)

    if n and plane:
        nt = threads.get_num_threads()
        parts = min(2 * nt, len(starts)) if nt > 1 and n * plane >= threads.min_elems else 1
        if parts < 2:
            blocks(0, len(starts))
        else:
            threads.run([(blocks, (i * len(starts) // parts, (i + 1) * len(starts) // parts))
                         for i in range(parts)])
    return dx.reshape(x_shape)


def avg_pool(x: np.ndarray, kernel_size: IntOrTuple, stride=None, padding: IntOrTuple = 0,
             ceil_mode: bool = False, count_include_pad: bool = True,
             divisor_override: int | None = None) -> np.ndarray:
    """N-d average pooling (torch avg_poolNd)."""
    x, nd, K, stride, padding, _ = _pool_setup(x, kernel_size, stride, padding, 1)
    out_dtype = x.dtype
    wd = _work_dtype(x.dtype)
    xw = x.astype(wd, copy=False)
    lead = x.ndim - nd
    B = x.shape[:lead]
    S = x.shape[lead:]
    O = tuple(_pool_out_size(S[i], padding[i], K[i], stride[i], 1, ceil_mode) for i in range(nd))
    if any(o <= 0 for o in O):
        raise ValueError(f"avg_pool output size {O} is too small")
    if math.prod(B) == 0:
        return np.zeros(B + O, dtype=out_dtype)
    pads = []
    for i in range(nd):
        need = (O[i] - 1) * stride[i] + K[i]
        pads.append((padding[i], need - S[i] - padding[i]))
    cur = _pad_zero(xw, pads, lead)
    # separable window sums
    for i in range(nd):
        ax = lead + i
        res = None
        for t in range(K[i]):
            sl = [slice(None)] * cur.ndim
            sl[ax] = slice(t, t + (O[i] - 1) * stride[i] + 1, stride[i])
            v = cur[tuple(sl)]
            if res is None:
                res = v.copy()
            else:
                res += v
        cur = res
    if divisor_override:
        cur /= wd.type(divisor_override)
    else:
        div = np.ones(O, dtype=np.int64)
        for i in range(nd):
            start = np.arange(O[i], dtype=np.int64) * stride[i] - padding[i]
            end = np.minimum(start + K[i], S[i] + padding[i])
            if count_include_pad:
                cnt = end - start
            else:
                cnt = np.minimum(end, S[i]) - np.maximum(start, 0)
            shp = [1] * nd
            shp[i] = O[i]
            div = div * cnt.reshape(shp)
        cur /= div.astype(wd)
    return _finish(cur, out_dtype)


def _adaptive_windows(n_in: int, n_out: int):
    i = np.arange(n_out, dtype=np.int64)
    start = (i * n_in) // n_out
    end = -((-(i + 1) * n_in) // n_out)
    return start, end


def adaptive_avg_pool(x: np.ndarray, output_size: Sequence[int]) -> np.ndarray:
    """N-d adaptive average pooling (torch adaptive_avg_poolNd)."""
    x = np.asarray(x)
    output_size = tuple(int(o) for o in output_size)
    nd = len(output_size)
    out_dtype = x.dtype
    wd = _work_dtype(x.dtype)
    cur = x.astype(wd, copy=False)
    lead = x.ndim - nd
    S = x.shape[lead:]
    output_size = tuple(S[i] if output_size[i] is None else output_size[i] for i in range(nd))
    for i in range(nd):
        ax = lead + i
        n_in, n_out = S[i], output_size[i]
        if n_in == n_out:
            continue
        start, end = _adaptive_windows(n_in, n_out)
        ln = end - start
        kmax = int(ln.max()) if n_out else 0
        shp = [1] * cur.ndim
        shp[ax] = n_out
        res = None
        for j in range(kmax):
            idx = np.minimum(start + j, n_in - 1)
            v = np.take(cur, idx, axis=ax)
            if j > 0:
                valid = (j < ln)
                if not valid.all():
                    v *= valid.astype(wd).reshape(shp)
            if res is None:
                res = v
            else:
                res += v
        if res is None:
            res = np.zeros(cur.shape[:ax] + (n_out,) + cur.shape[ax + 1:], dtype=wd)
        else:
            res /= ln.astype(wd).reshape(shp)
        cur = res
    return _finish(cur, out_dtype)


def adaptive_max_pool(x: np.ndarray, output_size: Sequence[int],
                      return_indices: bool = False):
    """N-d adaptive max pooling (torch adaptive_max_poolNd); indices (int64)
    are flat indices into each input spatial plane/volume."""
    x = np.asarray(x)
    output_size = tuple(int(o) for o in output_size)
    nd = len(output_size)
    out_dtype = x.dtype
    if x.dtype.kind == "f" and x.dtype not in (np.float32, np.float64):
        cur = x.astype(np.float32)
    else:
        cur = x
    lead = x.ndim - nd
    S = x.shape[lead:]
    isfloat = cur.dtype.kind == "f"
    # reduce the last spatial dim first so that, combined with strict '>' on the
    # outer dims, the row-major first maximum (last NaN) wins -- as in torch.
    idx_acc = None  # flat index (within reduced dims) of the current maxima
    for i in reversed(range(nd)):
        ax = lead + i
        n_in, n_out = S[i], output_size[i]
        start, end = _adaptive_windows(n_in, n_out)
        ln = end - start
        kmax = int(ln.max()) if n_out else 0
        pstr = math.prod(S[i + 1:])
        shp = [1] * cur.ndim
        shp[ax] = n_out
        res = None
        ires = None
        for j in range(kmax):
            pos = np.minimum(start + j, end - 1)  # clamped: repeats last element
            v = np.take(cur, pos, axis=ax)
            if return_indices:
                iv = pos.reshape(shp) * pstr
                if idx_acc is not None:
                    iv = iv + np.take(idx_acc, pos, axis=ax)
            if res is None:
                res = v.copy()
                if return_indices:
                    ires = np.broadcast_to(iv, v.shape).copy()
            else:
                m = v > res
                if isfloat:
                    m |= np.isnan(v)
                np.copyto(res, v, where=m)
                if return_indices:
                    np.copyto(ires, np.broadcast_to(iv, v.shape), where=m)
        cur = res
        idx_acc = ires
    y = _finish(cur, out_dtype)
    if return_indices:
        return y, np.ascontiguousarray(idx_acc.astype(np.int64, copy=False))
    return y


# --------------------------------------------------------------------------
# interpolation
# --------------------------------------------------------------------------

def _cubic_coeffs(t: np.ndarray, A: float = -0.75):
    def cc1(v):
        return ((A + 2) * v - (A + 3)) * v * v + 1

    def cc2(v):
        return ((A * v - 5 * A) * v + 8 * A) * v - 4 * A

    return [cc2(t + 1), cc1(t), cc1(1 - t), cc2(2 - t)]


def _area_scale(n_in, n_out, align_corners, scale, wd):
    if align_corners:
        return wd.type((n_in - 1) / (n_out - 1)) if n_out > 1 else wd.type(0)
    if scale is not None and scale > 0:
        return wd.type(1.0 / scale)
    return wd.type(n_in) / wd.type(n_out)


def interpolate(x: np.ndarray, size: Sequence[int], mode: str = "nearest",
                align_corners: bool | None = None,
                scales: Sequence[float | None] | None = None) -> np.ndarray:
    """Resize spatial dims (torch.nn.functional.interpolate semantics).

    size: output spatial size (ints).  mode: 'nearest', 'nearest-exact',
    'linear', 'bilinear', 'bicubic', 'trilinear'.  scales: the user's
    per-dim scale_factor values (output/input), as torch passes them when
    scale_factor is given and recompute_scale_factor is not True; when
    present, 1/scale is used as the source step instead of in/out.
    """
    x = np.asarray(x)
    size = tuple(int(s) for s in size)
    nd = len(size)
    lead = x.ndim - nd
    S = x.shape[lead:]
    if scales is None:
        scales = (None,) * nd
    else:
        scales = tuple(None if s is None else float(s) for s in scales)
        if len(scales) == 1 and nd > 1:
            scales = scales * nd
    out_dtype = x.dtype
    mode = mode.lower()
    if mode in ("nearest", "nearest-exact"):
        if align_corners:
            raise ValueError("align_corners option can only be set with the interpolating modes")
        idxs = []
        for i in range(nd):
            n_in, n_out = S[i], size[i]
            dst = np.arange(n_out)
            # torch's 2-d nearest kernel short-cuts these two cases even when
            # an explicit scale is given (1-d and 3-d use the scale).
            short = mode == "nearest" and (nd == 2 or scales[i] is None)
            if short and n_out == n_in:
                src = dst
            elif short and n_out == 2 * n_in:
                src = dst >> 1
            else:
                sc = scales[i]
                s32 = np.float32(1.0 / sc) if (sc is not None and sc > 0) else np.float32(n_in) / np.float32(n_out)
                if mode == "nearest":
                    f = dst.astype(np.float32) * s32
                else:
                    f = ((dst + 0.5) * np.float64(s32)).astype(np.float32)
                src = np.minimum(np.floor(f).astype(np.int64), n_in - 1)
            idxs.append(src)
        ix = np.ix_(*idxs)
        return _finish(x[(Ellipsis,) + ix], out_dtype)

    if mode not in ("linear", "bilinear", "bicubic", "trilinear"):
        raise ValueError(f"unsupported interpolation mode {mode!r}")
    expected = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}[mode]
    if nd != expected:
        raise ValueError(f"mode {mode!r} expects {expected} spatial dims, got {nd}")
    align_corners = bool(align_corners)
    wd = _work_dtype(x.dtype)
    cur = x.astype(wd, copy=False)
    cubic = mode == "bicubic"
    for i in range(nd):
        ax = lead + i
        n_in, n_out = S[i], size[i]
        # torch's (bi/tri)linear kernels copy a dim whose size is unchanged even
        # when an explicit scale is given; bicubic still honours the scale.
        if n_in == n_out and (not cubic or align_corners or scales[i] is None
                              or scales[i] <= 0 or scales[i] == 1.0):
            continue
        scale = _area_scale(n_in, n_out, align_corners, scales[i], wd)
        dst = np.arange(n_out).astype(wd)
        if align_corners:
            src = scale * dst
        else:
            src = scale * (dst + wd.type(0.5)) - wd.type(0.5)
            if not cubic:
                src = np.maximum(src, wd.type(0))
        i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        lam = np.clip(src - i0.astype(wd), 0, 1).astype(wd)
        shp = [1] * cur.ndim
        shp[ax] = n_out
        if cubic:
            coeffs = _cubic_coeffs(lam)
            res = None
            for j in range(4):
                ij = np.clip(i0 - 1 + j, 0, n_in - 1)
                v = np.take(cur, ij, axis=ax)
                v *= coeffs[j].astype(wd).reshape(shp)
                if res is None:
                    res = v
                else:
                    res += v
        else:
            i1 = np.where(i0 < n_in - 1, i0 + 1, i0)
            v0 = np.take(cur, i0, axis=ax)
            v1 = np.take(cur, i1, axis=ax)
            v0 *= (wd.type(1) - lam).reshape(shp)
            v1 *= lam.reshape(shp)
            v0 += v1
            res = v0
        cur = res
    return _finish(cur, out_dtype)


# --------------------------------------------------------------------------
# padding
# --------------------------------------------------------------------------

_NP_PAD_MODES = {"constant": "constant", "reflect": "reflect",
                 "replicate": "edge", "edge": "edge", "circular": "wrap", "wrap": "wrap"}


def pad(x: np.ndarray, pads: Sequence[tuple[int, int]], mode: str = "constant",
        value: float = 0.0) -> np.ndarray:
    """Pad ``x``; ``pads`` holds (lo, hi) per dim in numpy order (one pair per
    dim of x, or per trailing dims if shorter).  Modes: 'constant', 'reflect',
    'replicate', 'circular'.  Negative pads crop.  Returns a new array."""
    x = np.asarray(x)
    pads = [tuple(int(v) for v in p) for p in pads]
    if len(pads) < x.ndim:
        pads = [(0, 0)] * (x.ndim - len(pads)) + pads
    if len(pads) != x.ndim:
        raise ValueError("too many pad entries")
    if mode not in _NP_PAD_MODES:
        raise ValueError(f"unsupported pad mode {mode!r}")
    npmode = _NP_PAD_MODES[mode]
    if npmode == "constant":
        if value is None:
            value = 0
        out = _pad_zero(x, pads, 0, value=value)
        if not any(lo > 0 or hi > 0 for lo, hi in pads):
            return np.array(out, copy=True, order="C")  # pure crop / no-op
        return out  # freshly allocated, contiguous
    # negative pads crop: circular wraps within the cropped extent (crop, then pad), reflect and replicate index
    # the whole input (pad, then crop), as PyTorch does
    crop = tuple(slice(max(-lo, 0), None if hi >= 0 else hi) for lo, hi in pads)
    if npmode == "wrap":
        x = x[crop]
    pp = [(max(lo, 0), max(hi, 0)) for lo, hi in pads]
    if npmode == "reflect":
        for i, (lo, hi) in enumerate(pp):
            if (lo or hi) and (lo >= x.shape[i] or hi >= x.shape[i]):
                raise ValueError("Padding size should be less than the corresponding input dimension")
    if npmode == "wrap":
        for i, (lo, hi) in enumerate(pp):
            if (lo or hi) and (lo > x.shape[i] or hi > x.shape[i]):
                raise ValueError("Padding value causes wrapping around more than once.")
    if not any(lo or hi for lo, hi in pp):
        return np.array(x[crop] if npmode != "wrap" else x, copy=True, order="C")
    out = np.pad(x, pp, mode=npmode)
    if npmode != "wrap":  # a side is either padded or cropped, so the same slices crop the padded array
        out = out[crop]
    return np.ascontiguousarray(out)


# --------------------------------------------------------------------------
# unfold / fold
# --------------------------------------------------------------------------

def unfold(x: np.ndarray, kernel_size: IntOrTuple, dilation: IntOrTuple = 1,
           padding: IntOrTuple = 0, stride: IntOrTuple = 1) -> np.ndarray:
    """torch.nn.functional.unfold (im2col): (N, C, H, W) -> (N, C*kh*kw, L).
    Unbatched (C, H, W) input gives (C*kh*kw, L)."""
    x = np.asarray(x)
    x, unb = _unbatch(x, 2)
    K = _tup(kernel_size, 2, "kernel_size")
    dilation = _tup(dilation, 2, "dilation")
    padding = _tup(padding, 2, "padding")
    stride = _tup(stride, 2, "stride")
    N, C, H, W = x.shape
    O = tuple(_conv_out_size(x.shape[2 + i], padding[i], padding[i], K[i], stride[i], dilation[i])
              for i in range(2))
    if any(o <= 0 for o in O):
        raise ValueError(f"unfold: computed output size {O} is too small")
    xp = _pad_zero(x, [(p, p) for p in padding], 2)
    cols = _windows_cf(xp, 1, K, O, stride, dilation).reshape(N, C * K[0] * K[1], O[0] * O[1])
    cols = np.ascontiguousarray(cols)
    if unb:
        cols = cols[0]
    return cols


def fold(x: np.ndarray, output_size: IntOrTuple, kernel_size: IntOrTuple,
         dilation: IntOrTuple = 1, padding: IntOrTuple = 0,
         stride: IntOrTuple = 1) -> np.ndarray:
    """torch.nn.functional.fold (col2im): (N, C*kh*kw, L) -> (N, C, H, W);
    overlapping values are summed.  Unbatched (C*kh*kw, L) input supported."""
    x = np.asarray(x)
    unb = x.ndim == 2
    if unb:
        x = x[None]
    out_size = _tup(output_size, 2, "output_size")
    K = _tup(kernel_size, 2, "kernel_size")
    dilation = _tup(dilation, 2, "dilation")
    padding = _tup(padding, 2, "padding")
    stride = _tup(stride, 2, "stride")
    N, CK, L = x.shape
    Kp = K[0] * K[1]
    if CK % Kp:
        raise ValueError("fold: input.size(1) must be divisible by prod(kernel_size)")
    C = CK // Kp
    O = tuple(_conv_out_size(out_size[i], padding[i], padding[i], K[i], stride[i], dilation[i])
              for i in range(2))
    if O[0] * O[1] != L:
        raise ValueError(f"fold: expected L={O[0] * O[1]} blocks, got {L}")
    out_dtype = x.dtype
    wd = _work_dtype(x.dtype) if x.dtype.kind == "f" else x.dtype
    xw = x.astype(wd, copy=False)
    cols = xw.reshape((N, C) + K + O)
    F = tuple(out_size[i] + 2 * padding[i] for i in range(2))
    buf = np.zeros((N, C) + F, dtype=wd)
    if N and C:
        _col2im_add(buf, cols, K, O, stride, dilation)
    y = buf[:, :, padding[0]:padding[0] + out_size[0], padding[1]:padding[1] + out_size[1]]
    y = _finish(y, out_dtype)
    if unb:
        y = y[0]
    return y
