"""Loss functions and distances (``torch.nn.functional`` names, defaults and reductions)."""

from __future__ import annotations

from typing import Any

from ... import dtypes as dt
from ...amp.autocast_mode import STATE as _AMP
from ...amp.autocast_mode import run as _amp_run
from ...errors import DTypeError, IndexOutOfRangeError, ShapeError, UnsupportedError, ValueRangeError
from ...ops import nn as _nn
from ...ops import train_kernels as _tk
from ...shapes import broadcast_shapes, norm_dim
from ...tensor import Tensor
from ._util import check_float, check_like, check_reduction, check_tensor, device_mismatch

#: input dtypes cross_entropy sends to the fused op (kernels compute these in their own dtype)
_FUSED_DTYPES = (dt.float32, dt.float64)


def _pair(op: str, input: Any, target: Any, same_shape: bool = False,
          promote: bool = False) -> tuple[dt.DType, tuple[int, ...]]:
    """(promoted dtype, broadcast shape) of two validated operands. Both must be floating, or with ``promote``
    (mse_loss, cosine_similarity, as torch) their promoted dtype must be."""
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
        raise device_mismatch(op, "target", input, target)
    if same_shape:
        if target.shape != input.shape:
            raise ShapeError(f"{op}: target size {target.shape} must be the same as input size {input.shape}")
    return dt.promote_types(input._dtype, target._dtype), broadcast_shapes(input.shape, target.shape, op=op)


def _check_bcast(op: str, name: str, t: Tensor, shape: tuple[int, ...]) -> None:
    """t's shape must broadcast to shape (the input's) without growing it."""
    try:
        ok = broadcast_shapes(t.shape, shape, op=op) == shape
    except ShapeError:
        ok = False
    if not ok:
        raise ShapeError(f"{op}: {name} of shape {t.shape} does not broadcast to input shape {shape}")


def _check_weight(op: str, weight: Tensor | None, shape: tuple[int, ...]) -> None:
    """An elementwise loss weight must be a Tensor of the loss's (broadcast) shape, as torch requires."""
    if weight is None:
        return
    check_tensor(weight, op, "weight")
    if weight.shape != shape:
        raise ShapeError(f"{op}: weights and input must have the same size, got weight shape {weight.shape} "
                         f"and input shape {shape}")


def mse_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
             weight: Tensor | None = None) -> Tensor:
    """(input - target)^2, reduced."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("mse_loss", mse_loss, input, target, size_average, reduce, reduction, weight)
    check_reduction(reduction, "mse_loss")
    d, shape = _pair("mse_loss", input, target, promote=True)
    _check_weight("mse_loss", weight, shape)
    return _nn.pointwise_loss("mse_loss", input, target, d, shape, reduction, weight)


def l1_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
            weight: Tensor | None = None) -> Tensor:
    """``|input - target|``, reduced."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("l1_loss", l1_loss, input, target, size_average, reduce, reduction, weight)
    check_reduction(reduction, "l1_loss")
    d, shape = _pair("l1_loss", input, target)
    _check_weight("l1_loss", weight, shape)
    return _nn.pointwise_loss("l1_loss", input, target, d, shape, reduction, weight)


def smooth_l1_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None,
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """``0.5 * d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 * beta``."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("smooth_l1_loss", smooth_l1_loss, input, target, size_average, reduce, reduction, beta)
    check_reduction(reduction, "smooth_l1_loss")
    if beta < 0:
        raise ValueRangeError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    d, shape = _pair("smooth_l1_loss", input, target)
    return _nn.pointwise_loss("smooth_l1_loss", input, target, d, shape, reduction, None, beta)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: Tensor | None = None) -> Tensor:
    """``0.5 * d^2`` where ``|d| < delta``, else ``delta * (|d| - 0.5 * delta)``."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("huber_loss", huber_loss, input, target, reduction, delta, weight)
    check_reduction(reduction, "huber_loss")
    if not delta > 0:
        raise ValueRangeError(f"huber_loss: delta must be positive, got {delta}")
    d, shape = _pair("huber_loss", input, target)
    _check_weight("huber_loss", weight, shape)
    return _nn.pointwise_loss("huber_loss", input, target, d, shape, reduction, weight, delta)


def _check_range01(op: str, x: Tensor) -> None:
    if x.numel() == 0:
        return
    lo_v, hi_v = _nn.host_extrema(x)
    if not (lo_v >= 0.0 and hi_v <= 1.0):  # NaN fails too
        raise ValueRangeError(f"{op}: all elements of input should be between 0 and 1 (got min {lo_v}, "
                              f"max {hi_v})")


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: Any = None,
                         reduce: Any = None, reduction: str = "mean") -> Tensor:
    """-(t * log(x) + (1 - t) * log(1 - x)) with each log clamped to >= -100, as torch."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("binary_cross_entropy", binary_cross_entropy, input, target, weight, size_average, reduce,
                        reduction)
    op = "binary_cross_entropy"
    check_reduction(reduction, op)
    check_float(input, op)
    check_like(input, target, op, "target")
    if target.shape != input.shape:
        raise ShapeError(f"{op}: using a target size {target.shape} that is different to the input size "
                         f"{input.shape} is not supported; please ensure they have the same size")
    _check_range01(op, input)
    if weight is not None:
        check_like(input, weight, op, "weight")
        _check_bcast(op, "weight", weight, input.shape)
    return _nn.binary_cross_entropy(input, target, weight, reduction)


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     size_average: Any = None, reduce: Any = None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    """Sigmoid + binary cross-entropy in one stable formula; pos_weight scales the positive term."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("binary_cross_entropy_with_logits", binary_cross_entropy_with_logits, input, target, weight,
                        size_average, reduce, reduction, pos_weight)
    op = "binary_cross_entropy_with_logits"
    check_reduction(reduction, op)
    check_float(input, op)
    check_like(input, target, op, "target")
    if target.shape != input.shape:
        raise ShapeError(f"{op}: target size {target.shape} must be the same as input size {input.shape}")
    if pos_weight is not None:
        check_like(input, pos_weight, op, "pos_weight")
        _check_bcast(op, "pos_weight", pos_weight, input.shape)
    if weight is not None:
        check_like(input, weight, op, "weight")
        _check_bcast(op, "weight", weight, input.shape)
    return _nn.binary_cross_entropy_with_logits(input, target, weight, reduction, pos_weight)


def kl_div(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
           log_target: bool = False) -> Tensor:
    """target * (log(target) - input) pointwise (0 where target is 0); reduction may also be 'batchmean'."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("kl_div", kl_div, input, target, size_average, reduce, reduction, log_target)
    op = "kl_div"
    check_reduction(reduction, op, ("batchmean",))
    d, shape = _pair(op, input, target)
    return _nn.pointwise_loss(op, input, target, d, shape, reduction, None, bool(log_target))


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
        raise device_mismatch(op, "target", input, target)
    if target._dtype is dt.uint8:  # compared with a negative ignore_index below
        target = _nn.cast(target, dt.int64)
    c = input.shape[1] if input.ndim >= 2 else input.shape[0]
    expected = (input.shape[0],) + input.shape[2:] if input.ndim >= 2 else ()
    if target.shape != expected:
        raise ShapeError(f"{op}: expected target of shape {expected} for input of shape {input.shape}, "
                         f"got {target.shape}")
    if weight is not None:
        check_like(input, weight, op, "weight", (c,))
    if target.numel():
        if c == 0:  # no class is in bounds: only ignored targets are allowed
            if _nn.class_target_bounds(target, ignore_index, any_only=True)[0]:
                raise IndexOutOfRangeError(f"{op}: target is out of bounds for 0 classes "
                                           f"(every target must be ignore_index={ignore_index})")
        else:
            _, lo, hi = _nn.class_target_bounds(target, ignore_index, any_only=False)
            bad = hi if hi >= c else lo if lo < 0 else None
            if bad is not None:
                raise IndexOutOfRangeError(f"{op}: target {bad} is out of bounds for {c} classes")
    return target


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: Any = None,
             ignore_index: int = -100, reduce: Any = None, reduction: str = "mean") -> Tensor:
    """-input[n, target[n]] (weighted); 'mean' divides by the total weight of non-ignored targets."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("nll_loss", nll_loss, input, target, weight, size_average, ignore_index, reduce, reduction)
    op = "nll_loss"
    check_reduction(reduction, op)
    check_float(input, op)
    check_tensor(target, op, "target")
    if input.ndim == 0:
        raise ShapeError(f"{op}: expected input with 1 or more dims (C,) or (N, C, *), got shape {input.shape}")
    target = _class_target(op, input, target, weight, ignore_index)
    return _nn.nll_loss(input, target, weight, ignore_index, reduction)


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: Any = None,
                  ignore_index: int = -100, reduce: Any = None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """log_softmax over dim 1 (dim 0 for unbatched (C,) input) + nll_loss; target holds class indices (int64)
    or class probabilities (the input's shape and dtype)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("cross_entropy", cross_entropy, input, target, weight, size_average, ignore_index, reduce,
                        reduction, label_smoothing)
    op = "cross_entropy"
    check_reduction(reduction, op)
    check_float(input, op)
    check_tensor(target, op, "target")
    if input.ndim == 0:
        raise ShapeError(f"{op}: expected input with 1 or more dims (C,) or (N, C, *), got shape {input.shape}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueRangeError(f"{op}: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")
    c = input.shape[1 if input.ndim >= 2 else 0]
    if target._dtype.is_floating_point:
        if target.shape != input.shape:
            raise ShapeError(f"{op}: class-probability target must have the input's shape {input.shape}, "
                             f"got {target.shape}")
        if target._device is not input._device:
            raise device_mismatch(op, "target", input, target)
        if ignore_index >= 0:  # torch: a negative ignore_index (the default -100) is simply unused here
            raise UnsupportedError(f"{op}: ignore_index is not supported for class-probability (floating point) "
                                   f"targets, got ignore_index={ignore_index}")
        # torch takes log_softmax in the input's dtype, then the product with the target (and the weight) in their
        # promoted dtype (float16 logits, float32 target -> float32; a float64 weight -> float64)
        d = dt.promote_types(input._dtype, target._dtype)
        if weight is not None:
            check_tensor(weight, op, "weight")
            if weight._device is not input._device:
                raise device_mismatch(op, "weight", input, weight)
            if weight.shape != (c,):
                raise ShapeError(f"{op}: expected 'weight' of shape {(c,)}, got shape {weight.shape}")
            d = dt.promote_types(d, weight._dtype)
        return _nn.cross_entropy_probs(input, target, weight, d, reduction, label_smoothing)
    target = _class_target(op, input, target, weight, ignore_index)
    if (c and input._dtype in _FUSED_DTYPES and (weight is None or not weight.requires_grad)
            and _tk.has_kernel(_tk.cross_entropy_index, input)):
        # one op (log-softmax, gather, reduction) and one backward op where the backend has kernels for them; a
        # weight that requires grad keeps the composition, which differentiates it
        return _tk.cross_entropy_index(input, target, weight, ignore_index=ignore_index, reduction=reduction,
                                       label_smoothing=label_smoothing)[0]
    return _nn.cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing)


# ----------------------------------------------------------------------------------------------------------
# distances
# ----------------------------------------------------------------------------------------------------------
def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """sum(x1 * x2) / (max(||x1||, eps) * max(||x2||, eps)) along dim (inputs broadcast)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("cosine_similarity", cosine_similarity, x1, x2, dim, eps)
    op = "cosine_similarity"
    d, shape = _pair(op, x1, x2, promote=True)
    nd = len(shape)
    dd = norm_dim(dim, nd, op)
    if nd == 0:
        raise ShapeError(f"{op}: inputs must have at least 1 dim, got shapes {x1.shape} and {x2.shape}")
    return _nn.cosine_similarity(x1, x2, dd, eps, d, shape)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """||x1 - x2 + eps||_p over the last dim."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("pairwise_distance", pairwise_distance, x1, x2, p, eps, keepdim)
    op = "pairwise_distance"
    d, shape = _pair(op, x1, x2)
    if not shape:
        raise ShapeError(f"{op}: inputs must have at least 1 dim, got shapes {x1.shape} and {x2.shape}")
    return _nn.pairwise_distance(x1, x2, p, eps, keepdim, d, shape)


__all__ = [
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div", "nll_loss", "cross_entropy", "cosine_similarity",
    "pairwise_distance",
]
