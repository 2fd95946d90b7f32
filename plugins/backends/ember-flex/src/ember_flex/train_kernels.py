"""numpy kernels for core's training ops (``ember.ops.train_kernels``): cross-entropy at class-index targets and
its backward, training-mode batch norm and its backward, and the Adam/AdamW update of one parameter.

Each kernel replaces a chain of ten to twenty dispatched ops (and as many autodiff records) with one call that
makes the fewest numpy passes and arrays it can:

* cross-entropy forward: the row max, one ``exp`` in a kept scratch array and its row sums give each row's
  log-sum-exp; the loss reads only the target logits (and, with label smoothing, the rows' weighted sums as one
  mat-vec).
  Backward: ``exp(x - lse)`` in the output array, scaled per row in place, the target column adjusted by a scatter.
* batch norm forward: per-channel sums, then the centred input's squares' sums (two passes as the unfused path, no
  cancellation), then the output, each block's centring, scaling and shift done while it is in cache.
  Backward: the two per-channel reductions, then ``dx = k1 * dy + k2 * (x - mean) + k3`` block by block; blocks
  of :data:`BN_BLOCK` elements keep the traffic near five passes over the data, and the sums run at most
  :data:`BN_RUN` elements per channel in the dtype, then in float64 across blocks.
* Adam: torch's single-tensor arithmetic in its order, as in-place ufuncs on the param and its moments (the op's
  in-place contract) with temporaries in per-thread scratch arrays, so the results are bit-identical to the
  unfused path and a step allocates nothing for parameters up to :data:`SCRATCH_MAX` elements.

float32 and float64 compute in their own dtype; other floating dtypes in float32, cast back.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

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


def cross_entropy_index(backend: Any, x: np.ndarray, target: np.ndarray, weight: np.ndarray | None, *,
                        ignore_index: int = -100, reduction: str = "mean",
                        label_smoothing: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Loss and per-row log-sum-exp in one pass over the logits (see the module docstring)."""
    dt = x.dtype
    work, (x, weight) = _work(x, weight)
    xb, t = _rows(x, target)
    rows, c = xb.shape
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = xb.max(axis=1)
        e = np.subtract(xb, m[:, None], out=_scratch_arrays(1, xb.shape, work)[0])
        np.exp(e, out=e)
        lse = np.log(e.sum(axis=1))
        lse += m
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


def cross_entropy_index_backward(backend: Any, x: np.ndarray, target: np.ndarray, weight: np.ndarray | None,
                                 lse: np.ndarray, grad: np.ndarray, *, ignore_index: int = -100,
                                 reduction: str = "mean", label_smoothing: float = 0.0) -> np.ndarray:
    """dx = softmax * (a + b * sum(w)) - b * w - a * onehot, built in one output-sized array."""
    dt = x.dtype
    work, (x, weight, lse, grad) = _work(x, weight, lse, grad)
    xb, t = _rows(x, target)
    rows, c = xb.shape
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        p = np.subtract(xb, lse.reshape(rows, 1))
        np.exp(p, out=p)
        valid = t != ignore_index
        safe = np.where(valid, t, 0)
        wt = _row_weights(weight, safe, valid, work)
        scale = grad.reshape(rows) if reduction == "none" else grad.reshape(())
        if reduction == "mean":
            scale = scale / wt.sum()
        a = np.where(valid, scale * wt * work.type(1.0 - label_smoothing), 0).astype(work, copy=False)
        if label_smoothing > 0:
            b = np.where(valid, scale * work.type(label_smoothing / c), 0).astype(work, copy=False)
            wsum = weight.sum() if weight is not None else work.type(c)
            p *= (a + b * wsum)[:, None]
            p -= b[:, None] * weight[None, :] if weight is not None else b[:, None]
        else:
            p *= a[:, None]
        p[np.arange(rows), safe] -= a
    if x.ndim > 2:
        n, c = x.shape[:2]
        p = np.ascontiguousarray(np.moveaxis(p.reshape(n, -1, c), 2, 1)).reshape(x.shape)
    else:
        p = p.reshape(x.shape)
    return p if p.dtype == dt else p.astype(dt)


# -- batch norm ----------------------------------------------------------------------------------------------------
#: elements per block of the batch-norm loops (128 KiB of float32): a block's centred values are computed, reduced
#: and reused while they are in cache
BN_BLOCK = 1 << 15
#: at most this many elements of one channel per block: einsum's sums run sequentially within a block (the blocks'
#: sums are added in float64), so this bounds their rounding error
BN_RUN = 1 << 12

Block = tuple[slice, slice, slice]


def _channels(x: np.ndarray) -> np.ndarray:
    """(N, C, S) view (or copy, for a strided x) of (N, C, *) x."""
    return x.reshape(x.shape[0], x.shape[1], -1)


def _blocks(x3: np.ndarray) -> list[Block]:
    """Blocks of (N, C, S) x3: a few whole samples, or parts of one sample's rows when a sample is large; each about
    :data:`BN_BLOCK` elements and at most :data:`BN_RUN` per channel."""
    n, c, s = x3.shape
    every = slice(None)
    if s <= BN_RUN:
        step = max(1, min(BN_BLOCK // max(c * s, 1), BN_RUN // max(s, 1)))
        return [(slice(i, min(n, i + step)), every, every) for i in range(0, n, step)]
    return [(slice(i, i + 1), every, slice(j, min(s, j + BN_RUN))) for i in range(n) for j in range(0, s, BN_RUN)]


def _scratch_for(blocks: list[Block], x3: np.ndarray, work: np.dtype) -> np.ndarray:
    """A scratch array as large as the largest (the first) block."""
    nb, _, sb = blocks[0]
    return np.empty((nb.stop - nb.start, x3.shape[1], len(range(*sb.indices(x3.shape[2])))), work)


def _fit(scratch: np.ndarray, block: np.ndarray) -> np.ndarray:
    return scratch[:block.shape[0], :, :block.shape[2]]


def batch_norm_train(backend: Any, x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, *,
                     eps: float = 1e-5) -> tuple[np.ndarray, ...]:
    """(y, mean, invstd, var) in three sweeps of blocks: the channel sums; the centred values' squares' sums (in a
    block-sized scratch array); y = (x - mean) * invstd * weight + bias. x is read three times, y written once."""
    dt = x.dtype
    work, (x, weight, bias) = _work(x, weight, bias)
    x3 = _channels(x)
    c = x3.shape[1]
    count = x3.shape[0] * x3.shape[2]
    blocks = _blocks(x3)
    acc = np.zeros(c, np.float64)
    for b in blocks:
        acc += np.einsum("ncs->c", x3[b])
    mean = (acc / count).astype(work)
    mcol = mean[:, None]
    scratch = _scratch_for(blocks, x3, work)
    acc[:] = 0
    for b in blocks:
        xb = x3[b]
        xc = np.subtract(xb, mcol, out=_fit(scratch, xb))
        acc += np.einsum("ncs,ncs->c", xc, xc)  # centred (two passes as the unfused path): no cancellation
    var = (acc / count).astype(work)
    invstd = np.add(var, work.type(eps))
    np.sqrt(invstd, out=invstd)
    np.reciprocal(invstd, out=invstd)
    kcol = (invstd if weight is None else invstd * weight)[:, None]
    bcol = None if bias is None else bias[:, None]
    y = np.empty(x3.shape, work)
    for b in blocks:  # y = (x - mean) * k + bias, each block's three steps while it is in cache
        yb = np.subtract(x3[b], mcol, out=y[b])
        yb *= kcol
        if bcol is not None:
            yb += bcol
    return _cast(dt, (y.reshape(x.shape), mean, invstd, var))


def batch_norm_train_backward(backend: Any, x: np.ndarray, weight: np.ndarray | None, mean: np.ndarray,
                              invstd: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, ...]:
    """(dx, dweight, dbias): per block, sum(dy) and sum(dy * (x - mean)); then per block
    dx = k1 * dy + k2 * (x - mean) + k3, the centred block recomputed in a block-sized scratch array."""
    dt = x.dtype
    work, (x, weight, mean, invstd, dy) = _work(x, weight, mean, invstd, dy)
    x3, dy3 = _channels(x), _channels(dy)
    c = x3.shape[1]
    count = x3.shape[0] * x3.shape[2]
    blocks = _blocks(x3)
    mcol = mean[:, None]
    scratch = _scratch_for(blocks, x3, work)
    acc_b, acc_d = np.zeros(c, np.float64), np.zeros(c, np.float64)
    for b in blocks:
        xb = x3[b]
        xc = np.subtract(xb, mcol, out=_fit(scratch, xb))
        acc_b += np.einsum("ncs->c", dy3[b])
        acc_d += np.einsum("ncs,ncs->c", dy3[b], xc)
    dbias = acc_b.astype(work)
    dweight = acc_d.astype(work)
    dweight *= invstd  # sum(dy * xhat)
    k1 = invstd if weight is None else invstd * weight
    k2 = k1 * invstd * dweight
    k2 /= -count
    k3 = k1 * dbias
    k3 /= -count
    k1c, k2c, k3c = k1[:, None], k2[:, None], k3[:, None]
    dx = np.empty(x3.shape, work)
    for b in blocks:
        xb = x3[b]
        xc = np.subtract(xb, mcol, out=_fit(scratch, xb))
        xc *= k2c
        dxb = np.multiply(dy3[b], k1c, out=dx[b])
        dxb += xc
        dxb += k3c
    return _cast(dt, (dx.reshape(x.shape), dweight, dbias))


# -- Adam ----------------------------------------------------------------------------------------------------------
def adam_step(backend: Any, param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
              max_exp_avg_sq: np.ndarray | None, *, lr: float, beta1: float, beta2: float, eps: float,
              weight_decay: float = 0.0, decoupled_weight_decay: bool = False, amsgrad: bool = False,
              maximize: bool = False, step: float = 1.0) -> tuple[np.ndarray, ...]:
    """Update param, exp_avg, exp_avg_sq (and max_exp_avg_sq) in place and return them: the op's in-place
    contract (see ``ember.ops.train_kernels``). Each ufunc is one the unfused path runs, in its order (Python
    floats act in the array's dtype, NEP 50), so the results are bit-identical to it; temporaries live in
    per-thread scratch arrays."""
    kw = {"lr": lr, "beta1": beta1, "beta2": beta2, "eps": eps, "weight_decay": weight_decay,
          "decoupled_weight_decay": decoupled_weight_decay, "amsgrad": amsgrad, "maximize": maximize, "step": step}
    state = (param, exp_avg, exp_avg_sq) + ((max_exp_avg_sq,) if amsgrad else ())
    if param.ndim == 0:  # ufuncs on 0-d arrays return scalars, which take no out=: run on (1,) views
        adam_step(backend, param.reshape(1), grad.reshape(1), exp_avg.reshape(1), exp_avg_sq.reshape(1),
                  None if max_exp_avg_sq is None else max_exp_avg_sq.reshape(1), **kw)
        return state
    if param.dtype not in (np.float32, np.float64):  # half dtypes: in float32, rounded back once
        work = [a.astype(np.float32) for a in state]
        adam_step(backend, work[0], grad.astype(np.float32), work[1], work[2], work[3] if amsgrad else None, **kw)
        for dst, src in zip(state, work):
            np.copyto(dst, src, casting="unsafe")
        return state
    a, b, c = _scratch_arrays(3, param.shape, param.dtype)
    g = grad
    if maximize:
        g = np.negative(grad, out=c)
    if weight_decay != 0:
        if decoupled_weight_decay:
            param *= 1 - lr * weight_decay
        else:
            np.multiply(param, weight_decay, out=b)
            g = np.add(g, b, out=c)
    w = 1 - beta1
    np.subtract(g, exp_avg, out=a)  # torch's two-sided lerp, as optim.optimizer.lerp_
    if w < 0.5:
        a *= w
        exp_avg += a
    else:
        a *= 1 - w
        np.subtract(g, a, out=exp_avg)
    value = 1 - beta2
    exp_avg_sq *= beta2
    if value != 1:
        np.multiply(g, value, out=b)
        b *= g
    else:
        np.multiply(g, g, out=b)
    exp_avg_sq += b
    step_size = lr / (1 - beta1**step)  # ember.ops.train_kernels.adam_scalars
    bc2_sqrt = (1 - beta2**step) ** 0.5
    if amsgrad:
        assert max_exp_avg_sq is not None
        np.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        np.sqrt(max_exp_avg_sq, out=a)
    else:
        np.sqrt(exp_avg_sq, out=a)
    a /= bc2_sqrt
    a += eps
    if -step_size != 1:
        np.multiply(exp_avg, -step_size, out=b)
        b /= a
    else:
        np.divide(exp_avg, a, out=b)
    param += b
    return state


def register() -> None:
    """Register the kernels with core's training ops (called when the flex plugin is loaded)."""
    from ember.ops import train_kernels as T

    T.cross_entropy_index.kernel("flex")(cross_entropy_index)
    T.cross_entropy_index_backward.kernel("flex")(cross_entropy_index_backward)
    T.batch_norm_train.kernel("flex")(batch_norm_train)
    T.batch_norm_train_backward.kernel("flex")(batch_norm_train_backward)
    T.adam_step.kernel("flex")(adam_step)
