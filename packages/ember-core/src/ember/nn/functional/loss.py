"""Loss functions and distances (``torch.nn.functional`` names, defaults and reductions)."""

from __future__ import annotations

from typing import Any

from ... import dtypes as dt
from ..._bridge import broadcast_shapes2, norm_dim
from ...errors import DeviceError, DTypeError, IndexOutOfRangeError, ShapeError, UnsupportedError, ValueRangeError
from ...ops.elementwise import keep_graph, tracks_grad
from ...tensor import Tensor
from ._util import (
    check_float,
    check_like,
    check_reduction,
    check_tensor,
    host_minmax,
    like,
    prod,
    reduce_loss,
    vector_norm,
    wrap,
)


def _pair(op: str, input: Any, target: Any, same_shape: bool = False,
          promote: bool = False) -> tuple[Any, Any, Any, dt.DType, Any]:
    """(stack, input handle, target handle, dtype, device): promoted to one dtype, broadcast. Both must be
    floating, or with ``promote`` (mse_loss, cosine_similarity, as torch) their promoted dtype must be."""
    if promote:
        check_tensor(input, op)
        check_tensor(target, op, "target")
        common = dt.promote_types(input._dtype, target._dtype)
        if not common.is_floating_point:
            raise DTypeError(f"{op}: expected the common dtype of the inputs to be floating point, yet common dtype "
                             f"is {common.name} (dtypes {input._dtype.name} and {target._dtype.name})")
    else:
        check_float(input, op)
        check_float(target, op, "target")
    if target._device is not input._device:
        from ...errors import DeviceError

        raise DeviceError(f"{op}: input is on {input._device} but target is on {target._device}")
    if same_shape:
        if target.shape != input.shape:
            raise ShapeError(f"{op}: target size {target.shape} must be the same as input size {input.shape}")
    else:
        broadcast_shapes2(input.shape, target.shape, op)
    d = dt.promote_types(input._dtype, target._dtype)
    s = input._device.stack
    a = input._h if input._dtype is d else s.cast(input._h, d)
    b = target._h if target._dtype is d else s.cast(target._h, d)
    shape = broadcast_shapes2(input.shape, target.shape, op)
    if tuple(a.shape) != shape:
        a = s.expand(a, shape)
    if tuple(b.shape) != shape:
        b = s.expand(b, shape)
    return s, a, b, d, input._device


def _check_bcast(op: str, name: str, t: Tensor, shape: tuple[int, ...]) -> None:
    """t's shape must broadcast to shape (the input's) without growing it."""
    try:
        ok = broadcast_shapes2(t.shape, shape, op) == shape
    except ShapeError:
        ok = False
    if not ok:
        raise ShapeError(f"{op}: {name} of shape {t.shape} does not broadcast to input shape {shape}")


def _weighted(op: str, s: Any, loss: Any, weight: Tensor | None, d: dt.DType, reduction: str,
              mean_by_weight: bool) -> Any:
    """Apply an optional elementwise weight (same shape as the loss, as torch requires) and the reduction."""
    if weight is None:
        return reduce_loss(s, loss, reduction)
    check_tensor(weight, op, "weight")
    if weight.shape != tuple(loss.shape):
        raise ShapeError(f"{op}: weights and input must have the same size, got weight shape {weight.shape} "
                         f"and input shape {tuple(loss.shape)}")
    w = weight._h if weight._dtype is d else s.cast(weight._h, d)
    loss = s.binary("mul", loss, w)
    if reduction == "mean" and mean_by_weight:
        dims = tuple(range(len(loss.shape)))
        if not dims:
            return s.binary("div", loss, w)
        return s.binary("div", s.reduce("sum", loss, dims, False), s.reduce("sum", w, dims, False))
    return reduce_loss(s, loss, reduction)


def mse_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
             weight: Tensor | None = None) -> Tensor:
    """(input - target)^2, reduced."""
    check_reduction(reduction, "mse_loss")
    s, a, b, d, dev = _pair("mse_loss", input, target, promote=True)
    diff = s.binary("sub", a, b)
    return wrap(_weighted("mse_loss", s, s.binary("mul", diff, diff), weight, d, reduction, True), d, dev)


def l1_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
            weight: Tensor | None = None) -> Tensor:
    """``|input - target|``, reduced."""
    check_reduction(reduction, "l1_loss")
    s, a, b, d, dev = _pair("l1_loss", input, target)
    return wrap(_weighted("l1_loss", s, s.unary("abs", s.binary("sub", a, b)), weight, d, reduction, True), d, dev)


def smooth_l1_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None,
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """``0.5 * d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 * beta``."""
    check_reduction(reduction, "smooth_l1_loss")
    if beta < 0:
        raise ValueRangeError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    s, a, b, d, dev = _pair("smooth_l1_loss", input, target)
    ad = s.unary("abs", s.binary("sub", a, b))
    if beta == 0:
        return wrap(reduce_loss(s, ad, reduction), d, dev)
    quad = s.binary("div", s.binary("mul", s.binary("mul", ad, ad), 0.5), float(beta))
    loss = s.where(s.binary("lt", ad, float(beta)), quad, s.binary("sub", ad, 0.5 * beta))
    return wrap(reduce_loss(s, loss, reduction), d, dev)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: Tensor | None = None) -> Tensor:
    """``0.5 * d^2`` where ``|d| < delta``, else ``delta * (|d| - 0.5 * delta)``."""
    check_reduction(reduction, "huber_loss")
    if not delta > 0:
        raise ValueRangeError(f"huber_loss: delta must be positive, got {delta}")
    s, a, b, d, dev = _pair("huber_loss", input, target)
    ad = s.unary("abs", s.binary("sub", a, b))
    quad = s.binary("mul", s.binary("mul", ad, ad), 0.5)
    lin = s.binary("mul", s.binary("sub", ad, 0.5 * delta), float(delta))
    loss = s.where(s.binary("lt", ad, float(delta)), quad, lin)
    return wrap(_weighted("huber_loss", s, loss, weight, d, reduction, False), d, dev)


def _check_range01(op: str, s: Any, h: Any) -> None:
    if prod(h.shape) == 0:
        return
    import numpy as np

    dims = tuple(range(len(h.shape)))
    lo = s.reduce("min", h, dims, False) if dims else h
    hi = s.reduce("max", h, dims, False) if dims else h
    lo_v, hi_v = float(np.asarray(s.to_numpy(lo))), float(np.asarray(s.to_numpy(hi)))
    if not (lo_v >= 0.0 and hi_v <= 1.0):  # NaN fails too
        raise ValueRangeError(f"{op}: all elements of input should be between 0 and 1 (got min {lo_v}, "
                              f"max {hi_v})")


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: Any = None,
                         reduce: Any = None, reduction: str = "mean") -> Tensor:
    """-(t * log(x) + (1 - t) * log(1 - x)) with each log clamped to >= -100, as torch."""
    op = "binary_cross_entropy"
    check_reduction(reduction, op)
    check_float(input, op)
    check_like(input, target, op, "target")
    if target.shape != input.shape:
        raise ShapeError(f"{op}: using a target size {target.shape} that is different to the input size "
                         f"{input.shape} is not supported; please ensure they have the same size")
    s = input._device.stack
    _check_range01(op, s, input._h)
    x, t = input._h, target._h
    lx = s.binary("maximum", s.unary("log", x), -100.0)
    l1x = s.binary("maximum", s.unary("log", s.binary("sub", 1.0, x)), -100.0)
    loss = s.unary("neg", s.binary("add", s.binary("mul", t, lx), s.binary("mul", s.binary("sub", 1.0, t), l1x)))
    if weight is not None:
        check_like(input, weight, op, "weight")
        _check_bcast(op, "weight", weight, input.shape)
        loss = s.binary("mul", loss, weight._h)
    return like(input, reduce_loss(s, loss, reduction))


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     size_average: Any = None, reduce: Any = None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    """Sigmoid + binary cross-entropy in one stable formula; pos_weight scales the positive term."""
    op = "binary_cross_entropy_with_logits"
    check_reduction(reduction, op)
    check_float(input, op)
    check_like(input, target, op, "target")
    if target.shape != input.shape:
        raise ShapeError(f"{op}: target size {target.shape} must be the same as input size {input.shape}")
    s = input._device.stack
    x, t = input._h, target._h
    # log1p(exp(-|x|)) + max(-x, 0) is -log(sigmoid(x)) without overflow
    sp = s.binary("add", s.unary("log1p", s.unary("exp", s.unary("neg", s.unary("abs", x)))),
                  s.binary("maximum", s.unary("neg", x), 0.0))
    if pos_weight is not None:
        check_like(input, pos_weight, op, "pos_weight")
        _check_bcast(op, "pos_weight", pos_weight, input.shape)
        lw = s.binary("add", s.binary("mul", s.binary("sub", pos_weight._h, 1.0), t), 1.0)
        sp = s.binary("mul", sp, lw)
    loss = s.binary("add", s.binary("mul", s.binary("sub", 1.0, t), x), sp)
    if weight is not None:
        check_like(input, weight, op, "weight")
        _check_bcast(op, "weight", weight, input.shape)
        loss = s.binary("mul", loss, weight._h)
    return like(input, reduce_loss(s, loss, reduction))


def kl_div(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
           log_target: bool = False) -> Tensor:
    """target * (log(target) - input) pointwise (0 where target is 0); reduction may also be 'batchmean'."""
    op = "kl_div"
    check_reduction(reduction, op, ("batchmean",))
    s, a, b, d, dev = _pair(op, input, target)
    if log_target:
        loss = s.binary("mul", s.unary("exp", b), s.binary("sub", b, a))
    else:
        # xlogy(t, t): 0 where t == 0, so zero targets contribute nothing (and NaN stays NaN)
        tlogt = s.where(s.binary("eq", b, 0.0), s.binary("mul", b, 0.0), s.binary("mul", b, s.unary("log", b)))
        loss = s.binary("sub", tlogt, s.binary("mul", b, a))
    if reduction == "batchmean":
        total = reduce_loss(s, loss, "sum")
        if len(input.shape) > 0:
            total = s.binary("div", total, float(input.shape[0]))
        return wrap(total, d, dev)
    return wrap(reduce_loss(s, loss, reduction), d, dev)


# ----------------------------------------------------------------------------------------------------------
# classification losses
# ----------------------------------------------------------------------------------------------------------
def _class_target(op: str, input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int) -> Tensor:
    """Validate a class-index target against (N, C, d1...) / (C,) input (typed errors); returns it as int64
    (torch takes int64 or uint8 class indices)."""
    if target._dtype is not dt.int64 and target._dtype is not dt.uint8:
        raise DTypeError(f"{op}: expected target of dtype int64 or uint8 (class indices) or a floating dtype "
                         f"(class probabilities), got {target._dtype.name}")
    if target._device is not input._device:
        raise DeviceError(f"{op}: input is on {input._device} but target is on {target._device}")
    if target._dtype is dt.uint8:  # compared with a negative ignore_index below
        target = wrap(input._device.stack.cast(target._h, dt.int64), dt.int64, input._device)
    c = input.shape[1] if input.ndim >= 2 else input.shape[0]
    expected = (input.shape[0],) + input.shape[2:] if input.ndim >= 2 else ()
    if target.shape != expected:
        raise ShapeError(f"{op}: expected target of shape {expected} for input of shape {input.shape}, "
                         f"got {target.shape}")
    if weight is not None:
        check_like(input, weight, op, "weight", (c,))
    if target.numel():
        s = input._device.stack
        valid = s.binary("ne", target._h, int(ignore_index))
        if c == 0:  # no class is in bounds: only ignored targets are allowed
            dims = tuple(range(target.ndim))
            if bool(s.to_numpy(s.reduce("max", valid, dims, False) if dims else valid)):
                raise IndexOutOfRangeError(f"{op}: target is out of bounds for 0 classes "
                                           f"(every target must be ignore_index={ignore_index})")
        else:
            lo, hi = host_minmax(s, s.where(valid, target._h, 0))
            bad = hi if hi >= c else lo if lo < 0 else None
            if bad is not None:
                raise IndexOutOfRangeError(f"{op}: target {bad} is out of bounds for {c} classes")
    return target


def _nll(s: Any, logp: Any, target: Any, weight: Tensor | None, ignore_index: int, reduction: str,
         d: dt.DType) -> tuple[Any, Any]:
    """(reduced loss, per-element weights) for batched logp (N, C, *) and target (N, *)."""
    valid = s.binary("ne", target, int(ignore_index))
    safe = s.where(valid, target, 0)
    tshape = tuple(target.shape)
    w = s.cast(valid, d)
    if logp.shape[1] == 0:  # no classes: every target is ignore_index (checked), nothing to pick; 'mean' is 0/0
        zeros = s.full(tshape, 0.0, d)
        out = zeros if reduction == "none" else reduce_loss(s, zeros, "sum") if reduction == "sum" \
            else s.full((), float("nan"), d)
        return keep_graph(s, out, logp), w
    idx = s.reshape(safe, (tshape[0], 1) + tshape[1:])
    picked = s.reshape(s.gather(logp, 1, idx), tshape)
    if weight is not None:
        wt = s.reshape(s.index_select(weight._h, 0, s.reshape(safe, (prod(tshape),))), tshape)
        w = s.binary("mul", wt, w)
    # ignored targets give exactly 0, even where their row's log-probabilities are NaN (inf logits), as torch
    loss = s.where(valid, s.unary("neg", s.binary("mul", picked, w)), 0.0)
    if reduction == "none":
        return loss, w
    dims = tuple(range(len(tshape)))
    total = s.reduce("sum", loss, dims, False)
    if reduction == "sum":
        return total, w
    return s.binary("div", total, s.reduce("sum", w, dims, False)), w


def _batched(s: Any, input: Tensor, target: Tensor) -> tuple[Any, Any, bool]:
    if input.ndim == 1:
        return s.reshape(input._h, (1,) + input.shape), s.reshape(target._h, (1,)), True
    return input._h, target._h, False


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: Any = None,
             ignore_index: int = -100, reduce: Any = None, reduction: str = "mean") -> Tensor:
    """-input[n, target[n]] (weighted); 'mean' divides by the total weight of non-ignored targets."""
    op = "nll_loss"
    check_reduction(reduction, op)
    check_float(input, op)
    check_tensor(target, op, "target")
    if input.ndim == 0:
        raise ShapeError(f"{op}: expected input with 1 or more dims (C,) or (N, C, *), got shape {input.shape}")
    target = _class_target(op, input, target, weight, ignore_index)
    s = input._device.stack
    x, t, unb = _batched(s, input, target)
    loss, _ = _nll(s, x, t, weight, ignore_index, reduction, input._dtype)
    if unb and reduction == "none":
        loss = s.reshape(loss, ())
    return like(input, loss)


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: Any = None,
                  ignore_index: int = -100, reduce: Any = None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """log_softmax over dim 1 (dim 0 for unbatched (C,) input) + nll_loss; target holds class indices (int64)
    or class probabilities (the input's shape and dtype)."""
    op = "cross_entropy"
    check_reduction(reduction, op)
    check_float(input, op)
    check_tensor(target, op, "target")
    if input.ndim == 0:
        raise ShapeError(f"{op}: expected input with 1 or more dims (C,) or (N, C, *), got shape {input.shape}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueRangeError(f"{op}: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")
    s = input._device.stack
    cdim = 1 if input.ndim >= 2 else 0
    c = input.shape[cdim]
    wview = (1, c) + (1,) * (input.ndim - 2) if input.ndim >= 2 else (c,)
    if target._dtype.is_floating_point:
        if target.shape != input.shape:
            raise ShapeError(f"{op}: class-probability target must have the input's shape {input.shape}, "
                             f"got {target.shape}")
        if target._device is not input._device:
            raise DeviceError(f"{op}: input is on {input._device} but target is on {target._device}")
        if ignore_index >= 0:  # torch: a negative ignore_index (the default -100) is simply unused here
            raise UnsupportedError(f"{op}: ignore_index is not supported for class-probability (floating point) "
                                   f"targets, got ignore_index={ignore_index}")
        # torch takes log_softmax in the input's dtype, then the product with the target (and the weight) in their
        # promoted dtype (float16 logits, float32 target -> float32; a float64 weight -> float64)
        d = dt.promote_types(input._dtype, target._dtype)
        if weight is not None:
            check_tensor(weight, op, "weight")
            if weight._device is not input._device:
                raise DeviceError(f"{op}: expected 'weight' on device {input._device}, got {weight._device}")
            if weight.shape != (c,):
                raise ShapeError(f"{op}: expected 'weight' of shape {(c,)}, got shape {weight.shape}")
            d = dt.promote_types(d, weight._dtype)
        if input.numel() == 0:
            if c == 0 and reduction == "mean":  # torch divides by numel / C: 0 / 0
                return wrap(keep_graph(s, s.full((), float("nan"), d), input), d, input._device)
            xh = input._h if input._dtype is d else s.cast(input._h, d)
            return wrap(reduce_loss(s, s.reduce("sum", xh, (cdim,), False), reduction), d, input._device)
        t = target._h if target._dtype is d else s.cast(target._h, d)
        if label_smoothing > 0:
            t = s.binary("add", s.binary("mul", t, 1.0 - label_smoothing), label_smoothing / c)
        logp = s.softmax(input._h, cdim, True)
        prodh = s.binary("mul", logp if input._dtype is d else s.cast(logp, d), t)
        if weight is not None:
            wh = weight._h if weight._dtype is d else s.cast(weight._h, d)
            prodh = s.binary("mul", prodh, s.reshape(wh, wview))
        loss = s.unary("neg", s.reduce("sum", prodh, (cdim,), False))
        return wrap(reduce_loss(s, loss, reduction), d, input._device)
    target = _class_target(op, input, target, weight, ignore_index)
    x, t, unb = _batched(s, input, target)
    logp = s.softmax(x, 1, True) if c else x  # no classes: nothing to normalise (a backend may not reduce empty)
    loss, w = _nll(s, logp, t, weight, ignore_index, reduction, input._dtype)
    if label_smoothing > 0:
        lw = s.binary("mul", logp, s.reshape(weight._h, (1, c) + (1,) * (len(x.shape) - 2))) \
            if weight is not None else logp
        smooth = s.unary("neg", s.reduce("sum", lw, (1,), False))
        valid = s.binary("ne", t, int(ignore_index))
        smooth = s.where(valid, smooth, 0.0)
        if reduction != "none":
            dims = tuple(range(len(smooth.shape)))
            smooth = s.reduce("sum", smooth, dims, False)
            if reduction == "mean":
                # torch normalises by the summed weight of the non-ignored targets (their count without weight)
                smooth = s.binary("div", smooth, s.reduce("sum", w, dims, False))
        loss = s.binary("add", s.binary("mul", loss, 1.0 - label_smoothing),
                        s.binary("mul", smooth, label_smoothing / c if c else float("nan")))  # torch: 0 classes, NaN
    if unb and reduction == "none":
        loss = s.reshape(loss, ())
    return like(input, loss)


# ----------------------------------------------------------------------------------------------------------
# distances
# ----------------------------------------------------------------------------------------------------------
def _clamped_norm_for_grad(s: Any, h: Any, dim: int, eps: float) -> Any:
    """torch's cosine_similarity norm: its value clamped to eps, but the clamp is invisible to the gradient (torch
    clamps in place without grad), and the norm's gradient at a zero vector is 0 (not sqrt's 0 * inf)."""
    ss = s.reduce("sum", s.binary("mul", h, h), (dim,), True)
    pos = s.binary("gt", ss, 0.0)
    n = s.where(pos, s.unary("sqrt", s.where(pos, ss, 1.0)), 0.0)
    return s.binary("add", n, s.detach(s.binary("sub", s.binary("maximum", n, eps), n)))


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """sum(x1 * x2) / (max(||x1||, eps) * max(||x2||, eps)) along dim (inputs broadcast)."""
    op = "cosine_similarity"
    s, a, b, d, dev = _pair(op, x1, x2, promote=True)
    nd = len(a.shape)
    dd = norm_dim(dim, nd, op)
    if nd == 0:
        raise ShapeError(f"{op}: inputs must have at least 1 dim, got shapes {x1.shape} and {x2.shape}")
    if tracks_grad(s, a) or tracks_grad(s, b):
        n1, n2 = _clamped_norm_for_grad(s, a, dd, float(eps)), _clamped_norm_for_grad(s, b, dd, float(eps))
    else:
        n1 = s.binary("maximum", vector_norm(s, a, 2.0, (dd,), True), float(eps))
        n2 = s.binary("maximum", vector_norm(s, b, 2.0, (dd,), True), float(eps))
    r = s.reduce("sum", s.binary("mul", s.binary("div", a, n1), s.binary("div", b, n2)), (dd,), False)
    return wrap(r, d, dev)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """||x1 - x2 + eps||_p over the last dim."""
    op = "pairwise_distance"
    s, a, b, d, dev = _pair(op, x1, x2)
    if not a.shape:
        raise ShapeError(f"{op}: inputs must have at least 1 dim, got shapes {x1.shape} and {x2.shape}")
    diff = s.binary("add", s.binary("sub", a, b), float(eps))
    return wrap(vector_norm(s, diff, float(p), (len(a.shape) - 1,), bool(keepdim)), d, dev)


__all__ = [
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div", "nll_loss", "cross_entropy", "cosine_similarity",
    "pairwise_distance",
]
