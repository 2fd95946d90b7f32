"""numpy kernels for core's training ops (``ember.ops.train_kernels``): cross-entropy at class-index targets and
its backward, training-mode batch norm and its backward, and the Adam/AdamW update of one parameter.

Each kernel replaces a chain of ten to twenty dispatched ops (and as many autodiff records) with one call that
makes the fewest numpy passes and arrays it can:

* cross-entropy forward: per block of whole rows (:data:`CE_BLOCK` elements), ``exp`` into a scratch block and its
  row sums give each row's log-sum-exp in two passes that stay in cache; only rows whose sum over- or underflows
  (a logit above ~88 in float32, a row of very negative logits, NaN) are redone as ``max + log(sum(exp(x - max)))``.
  The loss reads only the target logits (and, with label smoothing, the rows' weighted sums as one mat-vec).
  Backward: ``softmax * f`` with the row factor f folded into the exponent, ``exp(x - (lse - log f))``, written
  straight into the output block (two passes, not three), the target column adjusted by a scatter; a negative or
  extreme factor takes ``exp(x - lse) * f``.
* batch norm forward: one sweep of blocks sums x and x**2 per channel (each block's per-channel partial sums in its
  own row of a table, added in float64 in block order, so the result does not depend on the thread count); then
  ``y = x * k + (bias - mean * k)`` with ``k = invstd * weight`` (torch's CPU form), two ufuncs per block. The
  variance ``E[x**2] - mean**2`` is used only where every channel has ``mean**2 <= var``: then at most one bit
  cancels, and its error stays within twice the two-pass one. Elsewhere (a channel whose mean is large against its
  spread, or NaN) the exact two passes run instead -- the centred values' squares' sums -- and y is formed centred,
  ``(x - mean) * k + bias``.
  Backward: one sweep for sum(dy) and sum(dy * x), whence ``sum(dy * (x - mean)) = sum(dy * x) - mean * sum(dy)``
  under the same condition (``|mean| * invstd <= 1``; else the centred sums), then
  ``dx = k1 * dy + k2 * x + (k3 - k2 * mean)`` block by block (centred: ``k2 * (x - mean) + k3``).
  Every per-channel operand is spread over a (C, S) plane: numpy runs a same-shape operand in its contiguous SIMD
  loop, a broadcast (C, 1) column in its strided one (2-3x slower; measured). Blocks hold about :data:`BN_BLOCK`
  elements, at most :data:`BN_RUN` per channel (the in-block float32 sums: BLAS row dots on one BLAS thread for
  one-sample blocks, einsum for several samples); large tensors' blocks run on
  flex's thread pool (:mod:`ember_flex.threads`).
* Adam: torch's single-tensor arithmetic in its order, as in-place ufuncs on the param and its moments (the op's
  in-place contract) with temporaries in per-thread scratch arrays, so the results are bit-identical to the
  unfused path and a step allocates nothing for parameters up to :data:`SCRATCH_MAX` elements. Elementwise, so
  large parameters run in blocks of :data:`ADAM_BLOCK` on flex's pool with the same bits (blocking alone measured
  no faster: a dozen ufunc calls per parameter, not memory, are its cost).

Large inputs' blocks run on flex's thread pool (:mod:`ember_flex.threads`, from ``threads.min_elems`` elements);
every element and every per-block partial sum is computed alike whatever the number of threads, and partial sums
are added in block order, so results do not depend on it.

float32 and float64 compute in their own dtype; other floating dtypes in float32, cast back.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from . import threads
from .attention_kernels import _serial_blas
from .kernel_dtypes import cast_back as _cast
from .kernel_dtypes import work_arrays as _work

__all__ = ["register"]


#: scratch arrays up to this many elements are kept per thread for the next update (a fresh large array costs its
#: page faults on every step); larger parameters allocate theirs per call, so idle memory stays bounded
SCRATCH_MAX = 1 << 22
_scratch = threading.local()


def _scratch_arrays(k: int, shape: tuple[int, ...], dtype: np.dtype) -> list[np.ndarray]:
    """k (at most 3) scratch arrays of ``shape``: views of this thread's kept buffers, or fresh ones for large
    shapes. A kernel's scratch never outlives its call (the next kernel on this thread reuses it)."""
    n = 1
    for d in shape:
        n *= d
    if n > SCRATCH_MAX:
        return [np.empty(shape, dtype) for _ in range(k)]
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None:
        bufs = _scratch.bufs = {}
    kept = bufs.get(dtype)
    if kept is None or kept.shape[1] < n:
        kept = bufs[dtype] = np.empty((3, max(n, 1 << 12)), dtype)
    return [kept[i, :n].reshape(shape) for i in range(k)]


# -- cross-entropy -------------------------------------------------------------------------------------------------
def _rows(x: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(R, C) logits and (R,) targets: (C,) is one row, (N, C, *) has its class dim moved last."""
    if x.ndim == 1:
        return x.reshape(1, -1), target.reshape(1)
    if x.ndim == 2:
        return x, target
    n, c = x.shape[:2]
    return np.moveaxis(x.reshape(n, c, -1), 1, 2).reshape(-1, c), target.reshape(-1)


def _row_weights(weight: np.ndarray | None, safe: np.ndarray, valid: np.ndarray, work: np.dtype) -> np.ndarray:
    """Each row's target weight, zero at ignored targets."""
    if weight is None:
        return valid.astype(work)
    wt = weight[safe]
    wt *= valid
    return wt


#: elements per block of whole rows in the cross-entropy kernels (256 KiB of float32): a block's shifted logits are
#: exponentiated and summed while they are in cache; large inputs' blocks run on flex's thread pool
CE_BLOCK = 1 << 16
#: longest row summed with einsum (sequential SIMD lanes, fast); longer rows use numpy's pairwise sum
CE_EINSUM_MAX = 1 << 12


def _row_blocks(rows: int, c: int, body: Callable[[int, int], None]) -> None:
    """``body(lo, hi)`` over row ranges of whole :data:`CE_BLOCK`-element blocks covering range(rows): on flex's pool
    when the logits are large. Each row is computed by the same ufuncs whatever the ranges."""
    rb = max(1, CE_BLOCK // max(c, 1))
    nblocks = -(-rows // rb)
    nt = threads.get_num_threads()
    parts = min(2 * nt, nblocks) if nt > 1 and rows * c >= threads.min_elems else 1
    if parts < 2:
        body(0, rows)
        return
    cuts = [min(rows, i * nblocks // parts * rb) for i in range(parts + 1)]
    threads.run([(_quietly, (body, cuts[i], cuts[i + 1])) for i in range(parts)])


def _quietly(body: Callable[[int, int], None], lo: int, hi: int) -> None:
    """``body(lo, hi)`` with numpy's floating-point warnings off, as on the calling thread (numpy's error state is
    per thread: a pool worker starts from the default)."""
    with np.errstate(all="ignore"):
        body(lo, hi)


def _logsumexp_rows(xb: np.ndarray, work: np.dtype) -> np.ndarray:
    """Each row's log-sum-exp, ``log(sum(exp(x)))``: per block of rows, ``exp`` into a scratch block and its row
    sums, two passes that never leave the cache. A row whose sum is not a normal number well inside the dtype's
    range -- an exp that overflowed (a logit above ~88 in float32), a row whose largest term is so small that
    underflowed terms would matter, NaN -- is done again as ``max + log(sum(exp(x - max)))``, which is exact there."""
    rows, c = xb.shape
    ssum = np.empty(rows, work)
    rb = max(1, CE_BLOCK // max(c, 1))

    def body(lo: int, hi: int) -> None:
        (scratch,) = _scratch_arrays(1, (rb * c,), work)
        for i in range(lo, hi, rb):
            j = min(hi, i + rb)
            e = np.exp(xb[i:j], out=scratch[:(j - i) * c].reshape(j - i, c))
            _row_sums(e, ssum[i:j])

    _row_blocks(rows, c, body)
    info = np.finfo(work)
    ok = ssum >= work.type(np.sqrt(info.tiny))  # NaN fails both tests
    ok &= ssum <= info.max
    lse = np.log(ssum, out=ssum)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        xs = xb[bad]
        m = xs.max(axis=1)
        e = np.subtract(xs, m[:, None])
        np.exp(e, out=e)
        s = np.log(_row_sums(e, np.empty(len(bad), work)))
        s += m
        lse[bad] = s
    return lse


def _row_sums(e: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Row sums of (R, C) e into out: einsum's SIMD lanes for rows up to :data:`CE_EINSUM_MAX`, numpy's pairwise
    sum for longer ones (its rounding error grows with log C, not C)."""
    if e.shape[1] <= CE_EINSUM_MAX:
        return np.einsum("rc->r", e, out=out)
    return np.add.reduce(e, axis=1, out=out)


def cross_entropy_index(backend: Any, x: np.ndarray, target: np.ndarray, weight: np.ndarray | None, *,
                        ignore_index: int = -100, reduction: str = "mean",
                        label_smoothing: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Loss and per-row log-sum-exp in one pass over the logits (see the module docstring)."""
    dt = x.dtype
    work, (x, weight) = _work(x, weight)
    xb, t = _rows(x, target)
    rows, c = xb.shape
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        lse = _logsumexp_rows(xb, work)
        valid = t != ignore_index
        safe = np.where(valid, t, 0)
        wt = _row_weights(weight, safe, valid, work)
        logp_t = xb[np.arange(rows), safe] - lse
        # ignored targets give exactly 0, even where their row's log-probabilities are NaN (inf logits), as torch
        nll = np.where(valid, -(logp_t * wt), 0).astype(work, copy=False)
        smooth = None
        if label_smoothing > 0:
            # -sum_c w_c * logp_c = -(x @ w - lse * sum(w)); unweighted, w = 1
            wsum = weight.sum() if weight is not None else work.type(c)
            rowsum = xb @ weight if weight is not None else xb.sum(axis=1)
            smooth = np.where(valid, -(rowsum - lse * wsum), 0).astype(work, copy=False)
        if reduction == "none":
            loss = nll if smooth is None else nll * (1.0 - label_smoothing) + smooth * (label_smoothing / c)
            loss = loss.reshape(target.shape)
        else:
            total = nll.sum()
            den = wt.sum() if reduction == "mean" else None
            if den is not None:
                total = total / den
            if smooth is not None:
                s = smooth.sum()
                if den is not None:
                    s = s / den
                total = total * (1.0 - label_smoothing) + s * (label_smoothing / c)
            loss = np.asarray(total, dtype=work)
    lse_shape = (1,) if x.ndim == 1 else (x.shape[0],) + x.shape[2:]
    return _cast(dt, (loss, lse.reshape(lse_shape)))


#: largest |log(row factor)| folded into the exponent of the cross-entropy backward: each unit adds about half an ulp
#: times the exponent's size to p's relative error (16: at most 1e-6 in float32)
CE_FOLD_MAX = 16.0
#: smallest logits (elements) for which folding pays: it costs a few small ops per call and saves one pass
CE_FOLD_MIN = 1 << 14


def cross_entropy_index_backward(backend: Any, x: np.ndarray, target: np.ndarray, weight: np.ndarray | None,
                                 lse: np.ndarray, grad: np.ndarray, *, ignore_index: int = -100,
                                 reduction: str = "mean", label_smoothing: float = 0.0) -> np.ndarray:
    """dx = softmax * f - b * w - a * onehot with f = a + b * sum(w), built block by block in one output-sized
    array. Where every row's factor f is positive and not far from 1 (``|log f| <= CE_FOLD_MAX``), it is folded
    into the exponent, ``softmax * f = exp(x - (lse - log f))``: two passes (subtract, exp) instead of three; rows
    with f == 0 (ignored targets) come out as exp(-inf) = 0. Elsewhere (a negative or extreme gradient)
    ``exp(x - lse) * f``."""
    dt = x.dtype
    work, (x, weight, lse, grad) = _work(x, weight, lse, grad)
    xb, t = _rows(x, target)
    rows, c = xb.shape
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        valid = t != ignore_index
        safe = np.where(valid, t, 0)
        wt = _row_weights(weight, safe, valid, work)
        scale = grad.reshape(rows) if reduction == "none" else grad.reshape(())
        if reduction == "mean":
            scale = scale / wt.sum()
        a = np.where(valid, scale * wt * work.type(1.0 - label_smoothing), 0).astype(work, copy=False)
        b = None
        f = a
        if label_smoothing > 0:
            b = np.where(valid, scale * work.type(label_smoothing / c), 0).astype(work, copy=False)
            wsum = weight.sum() if weight is not None else work.type(c)
            f = a + b * wsum
        fold = False
        if rows * c >= CE_FOLD_MIN:
            f64 = f.astype(np.float64)
            logf = np.log(f64)
            fold = bool(((f64 == 0) | (np.abs(logf) <= CE_FOLD_MAX)).all())
        lse_r = lse.reshape(rows)
        shift = (lse_r - logf).astype(work) if fold else lse_r
        fcol = None if fold else f[:, None]
        p = np.empty((rows, c), work)
        rb = max(1, CE_BLOCK // max(c, 1))

        def body(lo: int, hi: int) -> None:
            scratch = _scratch_arrays(1, (rb * c,), work)[0] if weight is not None and b is not None else None
            for i in range(lo, hi, rb):
                j = min(hi, i + rb)
                pb = np.subtract(xb[i:j], shift[i:j, None], out=p[i:j])
                np.exp(pb, out=pb)
                if fcol is not None:
                    pb *= fcol[i:j]
                if b is not None:
                    if weight is None:
                        pb -= b[i:j, None]
                    else:
                        pb -= np.multiply(b[i:j, None], weight, out=scratch[:(j - i) * c].reshape(j - i, c))

        _row_blocks(rows, c, body)
        p[np.arange(rows), safe] -= a
    if x.ndim > 2:
        n, c = x.shape[:2]
        p = np.ascontiguousarray(np.moveaxis(p.reshape(n, -1, c), 2, 1)).reshape(x.shape)
    else:
        p = p.reshape(x.shape)
    return p if p.dtype == dt else p.astype(dt)


# -- batch norm ----------------------------------------------------------------------------------------------------
#: elements per block of the batch-norm loops (256 KiB of float32): a block's centred values are computed, reduced
#: and reused while they are in cache
BN_BLOCK = 1 << 16
#: at most this many elements of one channel per block: the in-block sums run in float32 (the blocks'
#: sums are added in float64), so this bounds their rounding error
BN_RUN = 1 << 12

Block = tuple[slice, slice, slice]


def _channels(x: np.ndarray) -> np.ndarray:
    """(N, C, S) view (or copy, for a strided x) of (N, C, *) x."""
    return x.reshape(x.shape[0], x.shape[1], -1)


def _bn_blocks(n: int, c: int, s: int) -> tuple[list[Block], list[int]]:
    """Blocks of (N, C, S): samples x channels x positions, about :data:`BN_BLOCK` elements and at most
    :data:`BN_RUN` per channel each; with the row of the per-block partial-sum table each writes (one row per
    sample/position range, its channel range's columns). Shared between calls: read only."""
    return _bn_blocks_cached(n, c, s, BN_BLOCK, BN_RUN)


@functools.lru_cache(maxsize=64)
def _bn_blocks_cached(n: int, c: int, s: int, block: int, run: int) -> tuple[list[Block], list[int]]:
    sb = min(s, run)
    cb = max(1, min(c, block // sb))
    nb = max(1, min(n, block // (cb * sb), run // sb))
    blocks, rows = [], []
    row = 0
    for i in range(0, n, nb):
        for k in range(0, s, sb):
            for j in range(0, c, cb):
                blocks.append((slice(i, min(n, i + nb)), slice(j, min(c, j + cb)), slice(k, min(s, k + sb))))
                rows.append(row)
            row += 1
    return blocks, rows


#: largest (C, S) plane (elements) built per per-channel operand; beyond, a (C, 1) column is broadcast instead
PLANE_MAX = 1 << 20
#: smallest input (elements) whose per-channel operands are planes: below, building them costs more than they save
PLANE_MIN = 1 << 15


def _plane(col: np.ndarray, s: int, size: int) -> np.ndarray:
    """(C,) per-channel values spread over (C, s): an operand of the same shape as a block's channel rows, which
    numpy's contiguous SIMD loops take (a broadcast (C, 1) column runs its strided loop, 2-3x slower); the column
    itself where the plane would be larger than :data:`PLANE_MAX` (many channels of long rows) or the input of
    ``size`` elements smaller than :data:`PLANE_MIN`. Either gives the same bits."""
    if col.shape[0] * s > PLANE_MAX or size < PLANE_MIN:
        return col[:, None]
    plane = np.empty((col.shape[0], s), col.dtype)
    plane[...] = col[:, None]
    return plane


def _fit(plane: np.ndarray, b: Block, s: int) -> np.ndarray:
    """The part of a (C, sb) plane that block b's (n, c, s) slice broadcasts against."""
    return plane[b[1], :len(range(*b[2].indices(s)))]


def _run_blocks(blocks: list[Block], size: int, body: Callable[[int, int], None]) -> None:
    """``body(lo, hi)`` over the blocks ``blocks[lo:hi]``: in ranges on flex's pool when the tensor is large. Every
    block is computed alike (and writes its own rows) whatever the number of threads."""
    nt = threads.get_num_threads()
    parts = min(2 * nt, len(blocks)) if nt > 1 and size >= threads.min_elems else 1
    if parts < 2:
        body(0, len(blocks))
        return
    k = len(blocks)
    threads.run([(_quietly, (body, i * k // parts, (i + 1) * k // parts)) for i in range(parts)])


#: the channel sums of one-sample blocks as BLAS row dots (numpy's vecdot, and matmul against ones), on one BLAS
#: thread (the same bits for any BLAS thread count): measured (one thread, CPU time, (N, 64, 26, 26)) 0.88x einsum's
#: time for the sums alone at N = 64, 0.76x at 256; the whole forward 0.88-0.92x, backward 0.91-0.93x. Blocks of
#: several samples keep einsum (its one call over (n, c, s) beats a dot per sample and a sum: 1.21x at 11x11)
BN_ROW_DOTS = True


@functools.lru_cache(maxsize=8)
def _ones(dtype: np.dtype, n: int) -> np.ndarray:
    """n ones of ``dtype`` (a block's row length: a few per call), read only."""
    ones = np.ones(n, dtype)
    ones.flags.writeable = False
    return ones


def _channel_sums(a: np.ndarray, out: np.ndarray) -> None:
    """Per-channel sums of an (n, c, s) block into out (c,)."""
    if BN_ROW_DOTS and a.shape[0] == 1:
        np.matmul(a[0], _ones(a.dtype, a.shape[2]), out=out)
    else:
        np.einsum("ncs->c", a, out=out)


def _channel_dots(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """Per-channel sums of a * b over an (n, c, s) block into out (c,)."""
    if BN_ROW_DOTS and a.shape[0] == 1:
        np.vecdot(a[0], b[0], out=out)
    else:
        np.einsum("ncs,ncs->c", a, b, out=out)


def _sum_rows(parts: np.ndarray) -> np.ndarray:
    """The per-block partial sums added in float64, in block order (the same on any number of threads)."""
    if parts.shape[0] == 1:
        return parts[0].astype(np.float64)
    return np.add.reduce(parts, axis=0, dtype=np.float64)


def batch_norm_train(backend: Any, x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, *,
                     eps: float = 1e-5) -> tuple[np.ndarray, ...]:
    """(y, mean, invstd, var): one sweep of blocks for the channels' sums of x and x**2, then
    y = x * (invstd * weight) + (bias - mean * invstd * weight); where a channel's mean**2 exceeds its variance
    (where sum(x**2) / n - mean**2 could cancel), the exact two-pass statistics and the centred
    y = (x - mean) * invstd * weight + bias instead (see the module docstring)."""
    dt = x.dtype
    work, (x, weight, bias) = _work(x, weight, bias)
    x3 = _channels(x)
    n, c, s = x3.shape
    count = n * s
    blocks, rows = _bn_blocks(n, c, s)
    sb = blocks[0][2].stop
    nrows = rows[-1] + 1
    sums, squares = np.empty((nrows, c), work), np.empty((nrows, c), work)

    def moments(lo: int, hi: int) -> None:
        for b, r in zip(blocks[lo:hi], rows[lo:hi]):
            xb = x3[b]
            _channel_sums(xb, sums[r, b[1]])
            _channel_dots(xb, xb, squares[r, b[1]])

    with np.errstate(all="ignore"):
        with _serial_blas:
            _run_blocks(blocks, x3.size, moments)
        mean64 = _sum_rows(sums) / count
        var64 = _sum_rows(squares) / count
        var64 -= mean64 * mean64
        centred = not bool((mean64 * mean64 <= var64).all())  # NaN or a large mean: the exact two passes
        mean = mean64.astype(work)
        mplane = _plane(mean, sb, x3.size) if centred else None
        if centred:
            def centred_squares(lo: int, hi: int) -> None:
                (scratch,) = _scratch_arrays(1, (BN_BLOCK,), work)
                for b, r in zip(blocks[lo:hi], rows[lo:hi]):
                    xb = x3[b]
                    xc = np.subtract(xb, _fit(mplane, b, s), out=scratch[:xb.size].reshape(xb.shape))
                    np.einsum("ncs,ncs->c", xc, xc, out=squares[r, b[1]])

            _run_blocks(blocks, x3.size, centred_squares)
            var = (_sum_rows(squares) / count).astype(work)
        else:
            var = var64.astype(work)
        invstd = np.add(var, work.type(eps))
        np.sqrt(invstd, out=invstd)
        np.reciprocal(invstd, out=invstd)
        k = invstd if weight is None else invstd * weight
        kplane = _plane(k, sb, x3.size)
        if centred:
            bplane = None if bias is None else _plane(bias, sb, x3.size)
        else:  # torch's form: y = x * k + (bias - mean * k)
            shift = -(mean64 * k)
            if bias is not None:
                shift += bias
            bplane = _plane(shift.astype(work), sb, x3.size)
        y = np.empty(x3.shape, work)

        def normalise(lo: int, hi: int) -> None:
            for b in blocks[lo:hi]:  # each block's two or three steps while it is in cache
                if mplane is not None:
                    yb = np.subtract(x3[b], _fit(mplane, b, s), out=y[b])
                    yb *= _fit(kplane, b, s)
                else:
                    yb = np.multiply(x3[b], _fit(kplane, b, s), out=y[b])
                if bplane is not None:
                    yb += _fit(bplane, b, s)

        _run_blocks(blocks, x3.size, normalise)
    return _cast(dt, (y.reshape(x.shape), mean, invstd, var))


def batch_norm_train_backward(backend: Any, x: np.ndarray, weight: np.ndarray | None, mean: np.ndarray,
                              invstd: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, ...]:
    """(dx, dweight, dbias): one sweep of blocks for sum(dy) and sum(dy * x), whence sum(dy * (x - mean)), then
    dx = k1 * dy + k2 * x + (k3 - k2 * mean) per block; where a channel's |mean| exceeds sqrt(var + eps), the
    centred sum(dy * (x - mean)) and dx = k1 * dy + k2 * (x - mean) + k3 instead (see the module docstring)."""
    dt = x.dtype
    work, (x, weight, mean, invstd, dy) = _work(x, weight, mean, invstd, dy)
    x3, dy3 = _channels(x), _channels(dy)
    n, c, s = x3.shape
    count = n * s
    blocks, rows = _bn_blocks(n, c, s)
    sb = blocks[0][2].stop
    nrows = rows[-1] + 1
    sum_dy, sum_dot = np.empty((nrows, c), work), np.empty((nrows, c), work)
    with np.errstate(all="ignore"):
        m64 = mean.astype(np.float64)
        centred = not bool((np.abs(m64 * invstd) <= 1.0).all())
        mplane = _plane(mean, sb, x3.size) if centred else None

        def reductions(lo: int, hi: int) -> None:
            scratch = _scratch_arrays(1, (BN_BLOCK,), work)[0] if mplane is not None else None
            for b, r in zip(blocks[lo:hi], rows[lo:hi]):
                xb, dyb = x3[b], dy3[b]
                if mplane is not None:
                    xb = np.subtract(xb, _fit(mplane, b, s), out=scratch[:xb.size].reshape(xb.shape))
                _channel_sums(dyb, sum_dy[r, b[1]])
                _channel_dots(dyb, xb, sum_dot[r, b[1]])

        with _serial_blas:
            _run_blocks(blocks, x3.size, reductions)
        sdy = _sum_rows(sum_dy)
        dot = _sum_rows(sum_dot)
        if not centred:
            dot -= m64 * sdy  # sum(dy * (x - mean)) = sum(dy * x) - mean * sum(dy)
        dbias = sdy.astype(work)
        dweight = dot.astype(work)
        dweight *= invstd  # sum(dy * xhat)
        k1 = invstd if weight is None else invstd * weight
        k2 = k1 * invstd * dweight
        k2 /= -count
        k3 = k1 * dbias
        k3 /= -count
        if not centred:  # k2 * (x - mean) + k3 = k2 * x + (k3 - k2 * mean)
            k3 = (k3 - k2.astype(np.float64) * m64).astype(work)
        k1p, k2p, k3p = _plane(k1, sb, x3.size), _plane(k2, sb, x3.size), _plane(k3, sb, x3.size)
        dx = np.empty(x3.shape, work)

        def gradient(lo: int, hi: int) -> None:
            (scratch,) = _scratch_arrays(1, (BN_BLOCK,), work)
            for b in blocks[lo:hi]:
                xb = x3[b]
                t = scratch[:xb.size].reshape(xb.shape)
                if mplane is not None:
                    np.subtract(xb, _fit(mplane, b, s), out=t)
                    t *= _fit(k2p, b, s)
                else:
                    np.multiply(xb, _fit(k2p, b, s), out=t)
                dxb = np.multiply(dy3[b], _fit(k1p, b, s), out=dx[b])
                dxb += t
                dxb += _fit(k3p, b, s)

        _run_blocks(blocks, x3.size, gradient)
    return _cast(dt, (dx.reshape(x.shape), dweight, dbias))


# -- Adam ----------------------------------------------------------------------------------------------------------
#: elements per block of the Adam update: the param, its grad and moments and three scratch blocks (6 x 64 KiB of
#: float32) stay in L2 across the update's dozen ufuncs, where whole large parameters would stream each pass from
#: memory
ADAM_BLOCK = 1 << 15


def _adam_update(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, vmax: np.ndarray | None,
                 a: np.ndarray, b: np.ndarray, c: np.ndarray, h: dict[str, Any]) -> None:
    """One block of the update (every array the same shape; a, b, c scratch): torch's single-tensor arithmetic,
    each ufunc one the unfused path runs, in its order. Elementwise, so any split gives the same bits."""
    if h["maximize"]:
        g = np.negative(g, out=c)
    wd = h["weight_decay"]
    if wd != 0:
        if h["decoupled"]:
            p *= h["decay"]
        else:
            np.multiply(p, wd, out=b)
            g = np.add(g, b, out=c)
    w = h["w"]
    np.subtract(g, m, out=a)  # torch's two-sided lerp, as optim.optimizer.lerp_
    if w < 0.5:
        a *= w
        m += a
    else:
        a *= 1 - w
        np.subtract(g, a, out=m)
    value = h["value"]
    v *= h["beta2"]
    if value != 1:
        np.multiply(g, value, out=b)
        b *= g
    else:
        np.multiply(g, g, out=b)
    v += b
    if vmax is not None:
        np.maximum(vmax, v, out=vmax)
        np.sqrt(vmax, out=a)
    else:
        np.sqrt(v, out=a)
    a /= h["bc2_sqrt"]
    a += h["eps"]
    neg = h["neg_step"]
    if neg != 1:
        np.multiply(m, neg, out=b)
        b /= a
    else:
        np.divide(m, a, out=b)
    p += b


def adam_step(backend: Any, param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
              max_exp_avg_sq: np.ndarray | None, *, lr: float, beta1: float, beta2: float, eps: float,
              weight_decay: float = 0.0, decoupled_weight_decay: bool = False, amsgrad: bool = False,
              maximize: bool = False, step: float = 1.0) -> tuple[np.ndarray, ...]:
    """Update param, exp_avg, exp_avg_sq (and max_exp_avg_sq) in place and return them: the op's in-place
    contract (see ``ember.ops.train_kernels``). Each ufunc is one the unfused path runs, in its order (Python
    floats act in the array's dtype, NEP 50), so the results are bit-identical to it; temporaries live in
    per-thread scratch arrays. Parameters larger than :data:`ADAM_BLOCK` run block by block (on flex's thread
    pool when large)."""
    state = (param, exp_avg, exp_avg_sq) + ((max_exp_avg_sq,) if amsgrad else ())
    if param.ndim == 0 or param.dtype not in (np.float32, np.float64):
        return _adam_other(backend, param, grad, state, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                           weight_decay=weight_decay, decoupled_weight_decay=decoupled_weight_decay, amsgrad=amsgrad,
                           maximize=maximize, step=step)
    step_size = lr / (1 - beta1**step)  # ember.ops.train_kernels.adam_scalars
    h = {"maximize": maximize, "weight_decay": weight_decay, "decoupled": decoupled_weight_decay,
         "decay": 1 - lr * weight_decay, "w": 1 - beta1, "value": 1 - beta2, "beta2": beta2,
         "bc2_sqrt": (1 - beta2**step) ** 0.5, "eps": eps, "neg_step": -step_size}
    vmax = max_exp_avg_sq if amsgrad else None
    n = param.size
    arrays = (param, grad, exp_avg, exp_avg_sq) + ((vmax,) if vmax is not None else ())
    if n <= ADAM_BLOCK or not all(x.flags.c_contiguous for x in arrays):
        a, b, c = _scratch_arrays(3, param.shape, param.dtype)
        _adam_update(param, grad, exp_avg, exp_avg_sq, vmax, a, b, c, h)
        return state
    flat = [x.reshape(-1) for x in arrays] + ([None] if vmax is None else [])
    dtype = param.dtype

    def blocks(lo: int, hi: int) -> None:
        a, b, c = _scratch_arrays(3, (ADAM_BLOCK,), dtype)
        for i in range(lo, hi, ADAM_BLOCK):
            j = min(hi, i + ADAM_BLOCK)
            k = j - i
            p, g, m, v, mx = (None if x is None else x[i:j] for x in flat)
            _adam_update(p, g, m, v, mx, a[:k], b[:k], c[:k], h)

    nblocks = -(-n // ADAM_BLOCK)
    nt = threads.get_num_threads()
    parts = min(2 * nt, nblocks) if nt > 1 and n >= threads.min_elems else 1
    if parts < 2:
        blocks(0, n)
    else:
        cuts = [min(n, i * nblocks // parts * ADAM_BLOCK) for i in range(parts + 1)]
        threads.run([(blocks, (cuts[i], cuts[i + 1])) for i in range(parts)])
    return state


def _adam_other(backend: Any, param: np.ndarray, grad: np.ndarray, state: tuple[np.ndarray, ...],
                **kw: Any) -> tuple[np.ndarray, ...]:
    """0-d parameters (ufuncs on 0-d arrays return scalars, which take no out=: run on (1,) views) and half dtypes
    (in float32, rounded back once)."""
    amsgrad = kw["amsgrad"]
    if param.ndim == 0:
        views = [x.reshape(1) for x in state]
        adam_step(backend, views[0], grad.reshape(1), views[1], views[2], views[3] if amsgrad else None, **kw)
        return state
    work = [x.astype(np.float32) for x in state]
    adam_step(backend, work[0], grad.astype(np.float32), work[1], work[2], work[3] if amsgrad else None, **kw)
    for dst, src in zip(state, work):
        np.copyto(dst, src, casting="unsafe")
    return state


def register() -> None:
    """Register the kernels with core's training ops (called when the flex plugin is loaded)."""
    from ember.ops import train_kernels as T

    T.cross_entropy_index.kernel("flex")(cross_entropy_index)
    T.cross_entropy_index_backward.kernel("flex")(cross_entropy_index_backward)
    T.batch_norm_train.kernel("flex")(batch_norm_train)
    T.batch_norm_train_backward.kernel("flex")(batch_norm_train_backward)
    T.adam_step.kernel("flex")(adam_step)
