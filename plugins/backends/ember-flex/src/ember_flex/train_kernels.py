"""numpy kernels for core's training ops (``ember.ops.train_kernels``): cross-entropy at class-index targets and
its backward, training-mode batch norm and its backward, and the Adam/AdamW update of one parameter.

Each kernel replaces a chain of ten to twenty dispatched ops (and as many autodiff records) with one call that
makes the fewest numpy passes and arrays it can:

* cross-entropy forward: the row max, one ``exp`` in a scratch array and its row sums give each row's log-sum-exp;
  the loss reads only the target logits (and, with label smoothing, the rows' weighted sums as one mat-vec).
  Backward: ``exp(x - lse)`` in the output array, scaled per row in place, the target column adjusted by a scatter.
* batch norm forward: per-channel mean, the centred input (which becomes the output, scaled and shifted in place)
  and the variance as one ``einsum`` over it (two passes as the unfused path, no cancellation). Backward: one
  centred copy, the two per-channel reductions, and ``dx = k1 * dy + k2 * (x - mean) + k3`` in place.
* Adam: torch's single-tensor arithmetic in its order with in-place ufuncs on three fresh arrays (the new param,
  exp_avg, exp_avg_sq; the caller writes them back), so the results are bit-identical to the unfused path.

float32 and float64 compute in their own dtype; other floating dtypes in float32, cast back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["register"]


def _work(*arrays: Any) -> tuple[np.dtype, list[Any]]:
    dt = arrays[0].dtype
    work = dt if dt in (np.float32, np.float64) else np.dtype(np.float32)
    return work, [a if a is None or a.dtype == work else a.astype(work) for a in arrays]


def _cast(dt: np.dtype, outs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    return tuple(o if o.dtype == dt else o.astype(dt) for o in outs)


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
        e = np.subtract(xb, m[:, None])
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
def _channels(x: np.ndarray) -> np.ndarray:
    """(N, C, S) view (or copy, for a strided x) of (N, C, *) x."""
    return x.reshape(x.shape[0], x.shape[1], -1)


def _channel_sum(a: np.ndarray) -> np.ndarray:
    """Sum of (N, C, S) over N and S: the contiguous S axis first (numpy's pairwise sum), then N."""
    return a.sum(axis=2).sum(axis=0) if a.shape[2] != 1 else a[:, :, 0].sum(axis=0)


def batch_norm_train(backend: Any, x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, *,
                     eps: float = 1e-5) -> tuple[np.ndarray, ...]:
    """(y, mean, invstd, var) with the centred input turned into y in place."""
    dt = x.dtype
    work, (x, weight, bias) = _work(x, weight, bias)
    x3 = _channels(x)
    count = x3.shape[0] * x3.shape[2]
    mean = _channel_sum(x3)
    mean /= count
    y = np.subtract(x3, mean[:, None])
    var = np.einsum("ncs,ncs->c", y, y)
    var /= count
    invstd = np.add(var, work.type(eps))
    np.sqrt(invstd, out=invstd)
    np.reciprocal(invstd, out=invstd)
    k = invstd if weight is None else invstd * weight
    y *= k[:, None]
    if bias is not None:
        y += bias[:, None]
    return _cast(dt, (y.reshape(x.shape), mean, invstd, var))


def batch_norm_train_backward(backend: Any, x: np.ndarray, weight: np.ndarray | None, mean: np.ndarray,
                              invstd: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, ...]:
    """(dx, dweight, dbias): two per-channel reductions, then dx = k1 * dy + k2 * (x - mean) + k3."""
    dt = x.dtype
    work, (x, weight, mean, invstd, dy) = _work(x, weight, mean, invstd, dy)
    x3, dy3 = _channels(x), _channels(dy)
    count = x3.shape[0] * x3.shape[2]
    xc = np.subtract(x3, mean[:, None])
    dbias = _channel_sum(dy3)
    dot = np.einsum("ncs,ncs->c", dy3, xc)  # sum(dy * (x - mean)) per channel
    dweight = dot * invstd
    k1 = invstd if weight is None else invstd * weight
    k2 = k1 * invstd * dweight
    k2 /= -count
    k3 = k1 * dbias
    k3 /= -count
    dx = np.multiply(dy3, k1[:, None])
    xc *= k2[:, None]
    dx += xc
    dx += k3[:, None]
    return _cast(dt, (dx.reshape(x.shape), dweight, dbias))


# -- Adam ----------------------------------------------------------------------------------------------------------
def adam_step(backend: Any, param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
              max_exp_avg_sq: np.ndarray | None, *, lr: float, beta1: float, beta2: float, eps: float,
              weight_decay: float = 0.0, decoupled_weight_decay: bool = False, amsgrad: bool = False,
              maximize: bool = False, step: float = 1.0) -> tuple[np.ndarray, ...]:
    """New (param, exp_avg, exp_avg_sq[, max_exp_avg_sq]), each op as the unfused path does it (Python floats
    act in the array's dtype, NEP 50), so the results are bit-identical to it."""
    from ember.ops.train_kernels import adam_scalars

    dt = param.dtype
    if param.ndim == 0:  # ufuncs on 0-d arrays return scalars, which take no out=: run on (1,) views
        arrs = [a if a is None else a.reshape(1) for a in (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)]
        out = adam_step(backend, *arrs, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                        decoupled_weight_decay=decoupled_weight_decay, amsgrad=amsgrad, maximize=maximize, step=step)
        return tuple(o.reshape(()) for o in out)
    if dt not in (np.float32, np.float64):
        work, arrs = _work(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)
        out = adam_step(backend, *arrs, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                        decoupled_weight_decay=decoupled_weight_decay, amsgrad=amsgrad, maximize=maximize, step=step)
        return _cast(dt, out)
    g = np.negative(grad) if maximize else grad
    p = param
    if weight_decay != 0:
        if decoupled_weight_decay:
            p = np.multiply(param, 1 - lr * weight_decay)
        else:
            t = np.multiply(param, weight_decay)
            g = np.add(g, t, out=t)
    w = 1 - beta1
    m = np.subtract(g, exp_avg)
    if w < 0.5:
        m *= w
        m += exp_avg
    else:
        m *= 1 - w
        np.subtract(g, m, out=m)
    value = 1 - beta2
    v = np.multiply(exp_avg_sq, beta2)
    if value != 1:
        tmp = np.multiply(g, value)
        tmp *= g
    else:
        tmp = np.multiply(g, g)
    v += tmp
    step_size, bc2_sqrt = adam_scalars(lr, beta1, beta2, step)
    mx = None
    if amsgrad:
        mx = np.maximum(max_exp_avg_sq, v)
        np.sqrt(mx, out=tmp)
    else:
        np.sqrt(v, out=tmp)
    tmp /= bc2_sqrt
    tmp += eps
    denom = tmp
    if -step_size != 1:
        upd = np.multiply(m, -step_size)
        upd /= denom
    else:
        upd = np.divide(m, denom, out=denom)
    if p is param:
        p = np.add(param, upd, out=upd)
    else:
        p += upd
    return (p, m, v) if mx is None else (p, m, v, mx)


def register() -> None:
    """Register the kernels with core's training ops (called when the flex plugin is loaded)."""
    from ember.ops import train_kernels as T

    T.cross_entropy_index.kernel("flex")(cross_entropy_index)
    T.cross_entropy_index_backward.kernel("flex")(cross_entropy_index_backward)
    T.batch_norm_train.kernel("flex")(batch_norm_train)
    T.batch_norm_train_backward.kernel("flex")(batch_norm_train_backward)
    T.adam_step.kernel("flex")(adam_step)
