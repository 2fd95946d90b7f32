"""Training hot spots as single extension ops: softmax + cross-entropy, training-mode batch norm, the Adam update,
GELU and layer norm.

Each op's default composition is written in ember ops, so every backend runs it (fused and differentiated like any
ember code); a backend may register one kernel per op (see docs/extensions.md; ember-flex registers numpy kernels
in ``ember_flex.train_kernels``). The differentiable ops have a vjp that is itself one op, so a backend with kernels
for both pays neither per-op dispatch nor per-op autodiff recording -- PyTorch's ``log_softmax``/``nll_loss`` and
``native_batch_norm`` pairs, and a one-kernel-per-parameter Adam (torch's ``fused=True``):

* ``nn.cross_entropy_index`` (x, target, weight) -> (loss, lse): log-softmax over the class dim, the gather at
  class-index targets (``ignore_index``, per-class ``weight``, ``label_smoothing``) and the reduction, as
  ``torch.nn.functional.cross_entropy``; ``lse`` (the batched target's shape) is each row's log-sum-exp, what the
  backward needs to rebuild the softmax. ``nn.cross_entropy_index_backward`` is ``softmax - onehot``, scaled.
* ``nn.batch_norm_train`` (x, weight, bias) -> (y, mean, invstd, var): batch statistics over every dim but the
  channel dim 1 of (N, C, *) x, torch's ``native_batch_norm`` in training mode (``var`` is the biased variance;
  the caller updates the running statistics from ``mean`` and ``var``). ``nn.batch_norm_train_backward`` is the
  classic one-pass backward ``dx = invstd * gamma * (dy - mean(dy) - xhat * mean(dy * xhat))`` with dgamma, dbeta.
* ``optim.adam_step`` (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq) -> (param, exp_avg, exp_avg_sq
  [, max_exp_avg_sq]): one parameter's Adam/AdamW update (``torch.optim.Adam``'s single-tensor arithmetic, in its
  order, so a kernel can match it bit for bit), **in place**: unlike other extension ops, its kernels update the
  param and moment handles they receive and return them. The optimizer first syncs the device (a fused device
  runs whatever pending value might read the old contents) and then writes each result back into its tensor
  through the stack (``write_back``; a copy of a handle onto itself costs nothing on flex), so autodiff's version
  counters and every decorator see an ordinary in-place update, and a stack that hands the kernel copies still
  ends with the right values.

* ``nn.gelu`` (x) -> y and ``nn.gelu_backward`` (x, grad) -> dx: exact (erf) or tanh GELU, torch's ``gelu`` and
  ``gelu_backward``; the vjp reads x only. Used by inference as much as by training.
* ``nn.layer_norm`` (x, weight, bias) -> (y, mean, rstd): torch's ``native_layer_norm`` over the trailing
  ``normalized_shape`` dims (statistics of shape ``x.shape[:-k] + (1,) * k``); ``nn.layer_norm_backward`` gives
  dx, dweight and dbias in one op.

Callers (``nn.functional.cross_entropy``/``batch_norm``, ``optim.Adam``; ``ops.nn``'s GELU and float32/float64
layer norm) route through an op only where the
device's backend has a kernel for it (:func:`has_kernel`): elsewhere their own compositions run, unchanged. The
vjps name the outputs they read (``vjp(outputs=...)``: lse; mean and invstd), so the loss and the normalised
output callers get are not saved, and in-place ops on them (ResNet's ``out += shortcut`` after batch norm,
``loss /= accumulation_steps``) stay legal, as in torch.
"""

from __future__ import annotations

import math
from typing import Any

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError, ValueRangeError
from ..extension import ExtensionOp, TensorSpec, backend_extension
from ..tensor import Tensor

__all__ = ["adam_step", "batch_norm_train", "batch_norm_train_backward", "cross_entropy_index",
           "cross_entropy_index_backward", "gelu", "gelu_backward", "has_kernel", "layer_norm", "layer_norm_backward"]

_REDUCTIONS = ("none", "mean", "sum")


def has_kernel(op: ExtensionOp, x: Tensor) -> bool:
    """Whether ``op`` runs a backend kernel on x's device (else its composition would): a dict lookup after the
    first call per (op, stack)."""
    from ..dispatch import extension_kernel

    return extension_kernel(op, x._device.stack) is not None


def _float(op: str, name: str, spec: Any) -> None:
    if not isinstance(spec, TensorSpec) or not spec.dtype.is_floating_point:
        raise DTypeError(f"{op}: expected {name} to be a floating-point tensor, got "
                         f"{getattr(spec, 'dtype', spec)!r}")


def _like(op: str, name: str, spec: Any, shape: tuple[int, ...], dtype: dt.DType) -> None:
    if not isinstance(spec, TensorSpec) or spec.shape != shape:
        raise ShapeError(f"{op}: expected {name} of shape {shape}, got {getattr(spec, 'shape', spec)!r}")
    if spec.dtype is not dtype:
        raise DTypeError(f"{op}: {name} has dtype {spec.dtype.name}, expected {dtype.name}")


# -- cross-entropy with class-index targets ------------------------------------------------------------------------
def _ce_check(op: str, x: TensorSpec, target: TensorSpec, weight: Any, reduction: str,
              label_smoothing: float) -> tuple[int, tuple[int, ...]]:
    """Check the arguments; returns (C, the batched target shape (N, *))."""
    _float(op, "input", x)
    if x.ndim == 0:
        raise ShapeError(f"{op}: expected input with 1 or more dims (C,) or (N, C, *), got shape {x.shape}")
    if reduction not in _REDUCTIONS:
        raise ValueRangeError(f"{op}: {reduction!r} is not a valid value for reduction (one of {_REDUCTIONS})")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueRangeError(f"{op}: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")
    c = x.shape[1] if x.ndim >= 2 else x.shape[0]
    tshape = (x.shape[0],) + x.shape[2:] if x.ndim >= 2 else ()
    _like(op, "target", target, tshape, dt.int64)
    if weight is not None:
        _like(op, "weight", weight, (c,), x.dtype)
    return c, (x.shape[0],) + x.shape[2:] if x.ndim >= 2 else (1,)


def _ce_spec(x: TensorSpec, target: TensorSpec, weight: Any, *, ignore_index: int = -100, reduction: str = "mean",
             label_smoothing: float = 0.0) -> tuple[TensorSpec, TensorSpec]:
    _, batched = _ce_check("cross_entropy_index", x, target, weight, reduction, label_smoothing)
    loss = target.shape if reduction == "none" else ()
    return TensorSpec(loss, x.dtype), TensorSpec(batched, x.dtype)


def _batched(x: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """(N, C, *) input and (N, *) target; unbatched (C,) input is one row."""
    if x.ndim == 1:
        return x.reshape(1, x.shape[0]), target.reshape(1)
    return x, target


@backend_extension("nn.cross_entropy_index", output=_ce_spec, publish=False,
                   description="log-softmax + class-index gather + reduction (cross-entropy), with its log-sum-exp")
def cross_entropy_index(x: Tensor, target: Tensor, weight: Tensor | None, *, ignore_index: int = -100,
                        reduction: str = "mean", label_smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """Cross-entropy of logits ``x`` ((C,) or (N, C, *)) at int64 class indices ``target`` (validated in range),
    as ``torch.nn.functional.cross_entropy``; returns (loss, lse) where lse (N, *) is each row's log-sum-exp over
    the classes."""
    from . import nn as _nn

    loss = _nn.cross_entropy(x, target, weight, ignore_index, reduction, label_smoothing)
    xb, _ = _batched(x, target)
    return loss, xb.logsumexp(1)


def _ce_bwd_spec(x: TensorSpec, target: TensorSpec, weight: Any, lse: TensorSpec, grad: TensorSpec, *,
                 ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> TensorSpec:
    op = "cross_entropy_index_backward"
    _, batched = _ce_check(op, x, target, weight, reduction, label_smoothing)
    _like(op, "lse", lse, batched, x.dtype)
    _like(op, "grad", grad, target.shape if reduction == "none" else (), x.dtype)
    return TensorSpec(x.shape, x.dtype)


@backend_extension("nn.cross_entropy_index_backward", output=_ce_bwd_spec, publish=False,
                   description="gradient of cross-entropy at class-index targets: (softmax - onehot), scaled")
def cross_entropy_index_backward(x: Tensor, target: Tensor, weight: Tensor | None, lse: Tensor, grad: Tensor, *,
                                 ignore_index: int = -100, reduction: str = "mean",
                                 label_smoothing: float = 0.0) -> Tensor:
    """dloss/dx of :func:`cross_entropy_index` from the loss's gradient ``grad`` and the forward's ``lse``.

    With softmax p, per-row scale s (grad, divided by the summed weight of the kept targets for 'mean'),
    a = s * w[t] * (1 - label_smoothing) and b = s * label_smoothing / C (zero at ignored targets):
    dx = p * (a + b * sum(w)) - b * w - a * onehot(t).
    """
    from .creation import ones_like
    from .pointwise import where

    xb, t = _batched(x, target)
    c = xb.shape[1]
    extra = (1,) * (xb.ndim - 2)
    p = (xb - lse.unsqueeze(1)).exp()
    valid = t != ignore_index
    safe = where(valid, t, 0)
    wt = weight[safe] if weight is not None else ones_like(lse)
    scale = grad.reshape(t.shape) if reduction == "none" else grad
    if reduction == "mean":
        scale = scale / where(valid, wt, 0.0).sum()
    a = where(valid, scale * wt * (1.0 - label_smoothing), 0.0)
    b = where(valid, scale * (label_smoothing / c), 0.0)
    wsum = weight.sum() if weight is not None else float(c)
    onehot = (safe.unsqueeze(1) == _class_ids(c, xb, extra)).to(xb.dtype)
    dx = p * (a + b * wsum).unsqueeze(1) - a.unsqueeze(1) * onehot
    if label_smoothing > 0:
        dx = dx - b.unsqueeze(1) * (weight.reshape((1, c) + extra) if weight is not None else 1.0)
    return dx.reshape(x.shape)


def _class_ids(c: int, like: Tensor, extra: tuple[int, ...]) -> Tensor:
    from .creation import arange

    return arange(c, device=like._device).reshape((1, c) + extra)


@cross_entropy_index.vjp(outputs=(1,))  # reads lse only: the loss may be modified in place
def _cross_entropy_vjp(ctx: Any, gloss: Tensor, glse: Tensor) -> tuple[Tensor | None, ...]:
    x, target, weight = ctx.inputs
    # lse is the op's own workspace (no caller differentiates it): its gradient is ignored
    dx = cross_entropy_index_backward(x, target, weight, ctx.outputs[1], gloss, **ctx.kwargs)
    return dx, None, None


# -- batch norm in training mode -----------------------------------------------------------------------------------
def _bn_check(op: str, x: TensorSpec, weight: Any, bias: Any) -> int:
    _float(op, "input", x)
    if x.ndim < 2:
        raise ShapeError(f"{op}: expected input with at least 2 dims (N, C, *), got shape {x.shape}")
    c = x.shape[1]
    count = x.shape[0]
    for n in x.shape[2:]:
        count *= n
    if count <= 1:
        raise ValueRangeError(f"{op}: expected more than 1 value per channel when training, got input shape "
                              f"{x.shape}")
    for name, spec in (("weight", weight), ("bias", bias)):
        if spec is not None:
            _like(op, name, spec, (c,), x.dtype)
    return c


def _bn_spec(x: TensorSpec, weight: Any, bias: Any, *, eps: float = 1e-5) -> tuple[TensorSpec, ...]:
    c = _bn_check("batch_norm_train", x, weight, bias)
    stat = TensorSpec((c,), x.dtype)
    return TensorSpec(x.shape, x.dtype), stat, stat, stat


def _reduced_dims(x: Tensor) -> tuple[int, ...]:
    return (0,) + tuple(range(2, x.ndim))


def _channel_view(t: Tensor, ndim: int) -> Tensor:
    return t.reshape((1, t.shape[0]) + (1,) * (ndim - 2))


@backend_extension("nn.batch_norm_train", output=_bn_spec, publish=False,
                   description="batch norm in training mode: batch statistics, normalisation and affine")
def batch_norm_train(x: Tensor, weight: Tensor | None, bias: Tensor | None, *,
                     eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Normalise (N, C, *) x per channel with its batch statistics, then ``weight``/``bias``; returns
    (y, mean, invstd, var) with the (C,) batch mean, 1 / sqrt(var + eps) and the biased variance."""
    dims = _reduced_dims(x)
    c = x.shape[1]
    mean = x.mean(dims, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(dims, keepdim=True)  # two passes, as the unfused path: no cancellation
    invstd = (var + eps).rsqrt()
    y = xc * invstd
    if weight is not None:
        y = y * _channel_view(weight, x.ndim)
    if bias is not None:
        y = y + _channel_view(bias, x.ndim)
    return y, mean.reshape(c), invstd.reshape(c), var.reshape(c)


def _bn_bwd_spec(x: TensorSpec, weight: Any, mean: TensorSpec, invstd: TensorSpec,
                 dy: TensorSpec) -> tuple[TensorSpec, ...]:
    op = "batch_norm_train_backward"
    c = _bn_check(op, x, weight, None)
    _like(op, "mean", mean, (c,), x.dtype)
    _like(op, "invstd", invstd, (c,), x.dtype)
    _like(op, "dy", dy, x.shape, x.dtype)
    stat = TensorSpec((c,), x.dtype)
    return TensorSpec(x.shape, x.dtype), stat, stat


@backend_extension("nn.batch_norm_train_backward", output=_bn_bwd_spec, publish=False,
                   description="batch norm (training mode) backward: dx, dweight, dbias in one op")
def batch_norm_train_backward(x: Tensor, weight: Tensor | None, mean: Tensor, invstd: Tensor,
                              dy: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`batch_norm_train`'s y: (dx, dweight, dbias), dweight = sum(dy * xhat) and dbias =
    sum(dy) per channel (returned even when the forward had no weight or bias)."""
    dims = _reduced_dims(x)
    nd = x.ndim
    count = x.numel() // x.shape[1]
    xhat = (x - _channel_view(mean, nd)) * _channel_view(invstd, nd)
    dbias = dy.sum(dims)
    dweight = (dy * xhat).sum(dims)
    k = invstd if weight is None else invstd * weight
    dx = _channel_view(k, nd) * (dy - _channel_view(dbias / count, nd) - xhat * _channel_view(dweight / count, nd))
    return dx, dweight, dbias


@batch_norm_train.vjp(outputs=(1, 2))  # reads mean and invstd: y may be modified in place
def _batch_norm_vjp(ctx: Any, gy: Tensor, *stat_grads: Tensor) -> tuple[Tensor | None, ...]:
    x, weight, bias = ctx.inputs
    _, mean, invstd, _ = ctx.outputs
    # the statistics feed only the running-stat update, under no_grad: their gradients are ignored
    dx, dweight, dbias = batch_norm_train_backward(x, weight, mean, invstd, gy)
    return dx, (dweight if weight is not None else None), (dbias if bias is not None else None)


# -- Adam / AdamW --------------------------------------------------------------------------------------------------
def _adam_spec(param: TensorSpec, grad: TensorSpec, exp_avg: TensorSpec, exp_avg_sq: TensorSpec,
               max_exp_avg_sq: Any, **hyper: Any) -> tuple[TensorSpec, ...]:
    op = "adam_step"
    _float(op, "param", param)
    for name, spec in (("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        _like(op, name, spec, param.shape, param.dtype)
    out = [TensorSpec(param.shape, param.dtype)] * 3
    if hyper.get("amsgrad", False):
        _like(op, "max_exp_avg_sq", max_exp_avg_sq, param.shape, param.dtype)
        out.append(out[0])
    elif max_exp_avg_sq is not None:
        raise ShapeError(f"{op}: max_exp_avg_sq is given only with amsgrad=True")
    return tuple(out)


def adam_scalars(lr: float, beta1: float, beta2: float, step: float) -> tuple[float, float]:
    """(step_size, bias_correction2_sqrt) of Adam at ``step`` (1-based), in torch's formulas."""
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    return lr / bias_correction1, bias_correction2**0.5


@backend_extension("optim.adam_step", output=_adam_spec, publish=False,
                   description="one parameter's Adam/AdamW update, in place (param and moments)")
def adam_step(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, max_exp_avg_sq: Tensor | None, *,
              lr: float, beta1: float, beta2: float, eps: float, weight_decay: float = 0.0,
              decoupled_weight_decay: bool = False, amsgrad: bool = False, maximize: bool = False,
              step: float = 1.0) -> tuple[Tensor, ...]:
    """``torch.optim.Adam``'s single-tensor update of one parameter at ``step`` (already incremented), in place:
    param, exp_avg, exp_avg_sq (and, with amsgrad, max_exp_avg_sq) are updated and returned. ``grad`` has param's
    dtype. Run under ``no_grad``; callers write each result back into its tensor (``write_back``: a kernel that
    updated the handle itself makes that a no-op) so that every decorator sees an in-place update."""
    from ..optim.optimizer import addcdiv_, addcmul_, lerp_
    from .pointwise import maximum

    g = -grad if maximize else grad
    if weight_decay != 0:
        if decoupled_weight_decay:
            param.mul_(1 - lr * weight_decay)
        else:
            g = g + param * weight_decay
    lerp_(exp_avg, g, 1 - beta1)
    addcmul_(exp_avg_sq.mul_(beta2), g, g, 1 - beta2)
    step_size, bc2_sqrt = adam_scalars(lr, beta1, beta2, step)
    out = [param, exp_avg, exp_avg_sq]
    if amsgrad:
        assert max_exp_avg_sq is not None  # the spec checked
        max_exp_avg_sq.copy_(maximum(max_exp_avg_sq, exp_avg_sq))
        denom = (max_exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
        out.append(max_exp_avg_sq)
    else:
        denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
    addcdiv_(param, exp_avg, denom, -step_size)
    return tuple(out)


# -- GELU ----------------------------------------------------------------------------------------------------------
_GELU_MODES = ("none", "tanh")
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_KAPPA = 0.044715


def _gelu_check(op: str, x: TensorSpec, approximate: str) -> None:
    _float(op, "input", x)
    if approximate not in _GELU_MODES:
        raise ValueRangeError(f"{op}: approximate must be 'none' or 'tanh', got {approximate!r}")


def _gelu_spec(x: TensorSpec, *, approximate: str = "none") -> TensorSpec:
    _gelu_check("gelu", x, approximate)
    return TensorSpec(x.shape, x.dtype)


@backend_extension("nn.gelu", output=_gelu_spec, publish=False,
                   description="GELU x * Phi(x) (exact, with erf) or its tanh approximation, in one op")
def gelu(x: Tensor, *, approximate: str = "none") -> Tensor:
    """``torch.nn.functional.gelu``: x * Phi(x), Phi the standard normal CDF (``approximate='none'``, through erf)
    or ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))`` (``'tanh'``)."""
    from . import nn as _nn

    return _nn.gelu_composition(x, approximate)


def _gelu_bwd_spec(x: TensorSpec, grad: TensorSpec, *, approximate: str = "none") -> TensorSpec:
    op = "gelu_backward"
    _gelu_check(op, x, approximate)
    _like(op, "grad", grad, x.shape, x.dtype)
    return TensorSpec(x.shape, x.dtype)


@backend_extension("nn.gelu_backward", output=_gelu_bwd_spec, publish=False,
                   description="gradient of GELU (exact or tanh) times the output's gradient, in one op")
def gelu_backward(x: Tensor, grad: Tensor, *, approximate: str = "none") -> Tensor:
    """dgelu/dx * grad, torch's ``gelu_backward`` formulas: exact ``Phi(x) + x * phi(x)``; tanh
    ``0.5 * (1 + t) + 0.5 * x * (1 - t**2) * sqrt(2 / pi) * (1 + 3 * 0.044715 * x**2)`` with t the forward's tanh."""
    if approximate == "tanh":
        x_sq = x * x
        t = ((x + x_sq * x * _GELU_KAPPA) * _SQRT_2_OVER_PI).tanh()
        left = x * 0.5
        right = t + 1.0
        left_derivative = right * 0.5
        right_derivative = left * (1.0 - t * t) * ((x_sq * (3.0 * _GELU_KAPPA) + 1.0) * _SQRT_2_OVER_PI)
        return grad * (left_derivative + right_derivative)
    cdf = ((x * (1.0 / math.sqrt(2.0))).erf() + 1.0) * 0.5
    pdf = (x * x * -0.5).exp() * (1.0 / math.sqrt(2.0 * math.pi))
    return grad * (cdf + x * pdf)


@gelu.vjp(outputs=())  # reads the input only: the output may be modified in place
def _gelu_vjp(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    (x,) = ctx.inputs
    return (gelu_backward(x, grad, **ctx.kwargs),)


# -- layer norm ----------------------------------------------------------------------------------------------------
def _ln_check(op: str, x: TensorSpec, weight: Any, bias: Any, normalized_shape: tuple[int, ...]) -> int:
    """Check the arguments; returns the number of normalised dims."""
    _float(op, "input", x)
    k = len(normalized_shape)
    if k == 0 or x.ndim < k or tuple(x.shape[x.ndim - k:]) != tuple(normalized_shape):
        raise ShapeError(f"{op}: normalized_shape {tuple(normalized_shape)} must be the trailing dims of the "
                         f"input's shape {x.shape}")
    for name, spec in (("weight", weight), ("bias", bias)):
        if spec is not None:
            _like(op, name, spec, tuple(normalized_shape), x.dtype)
    return k


def _stat_shape(shape: tuple[int, ...], k: int) -> tuple[int, ...]:
    """torch's native_layer_norm statistics: the input's leading dims, then 1 per normalised dim."""
    return tuple(shape[:len(shape) - k]) + (1,) * k


def _ln_spec(x: TensorSpec, weight: Any, bias: Any, *, normalized_shape: tuple[int, ...],
             eps: float = 1e-5) -> tuple[TensorSpec, ...]:
    k = _ln_check("layer_norm", x, weight, bias, normalized_shape)
    stat = TensorSpec(_stat_shape(x.shape, k), x.dtype)
    return TensorSpec(x.shape, x.dtype), stat, stat


@backend_extension("nn.layer_norm", output=_ln_spec, publish=False,
                   description="layer norm: statistics over the trailing dims, normalisation and affine, in one op")
def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, *, normalized_shape: tuple[int, ...],
               eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    """Normalise x over its trailing ``normalized_shape`` dims, then ``weight``/``bias`` (of that shape); returns
    (y, mean, rstd) as torch's ``native_layer_norm``: the statistics have x's leading dims and 1 per normalised
    dim, rstd = 1 / sqrt(var + eps) with the biased variance."""
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = x.mean(dims, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(dims, keepdim=True)  # two passes, as the composition of nn.functional: no cancellation
    rstd = (var + eps).rsqrt()
    y = xc * rstd
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y, mean, rstd


def _ln_bwd_spec(x: TensorSpec, weight: Any, mean: TensorSpec, rstd: TensorSpec, dy: TensorSpec, *,
                 normalized_shape: tuple[int, ...]) -> tuple[TensorSpec, ...]:
    op = "layer_norm_backward"
    k = _ln_check(op, x, weight, None, normalized_shape)
    stat = _stat_shape(x.shape, k)
    _like(op, "mean", mean, stat, x.dtype)
    _like(op, "rstd", rstd, stat, x.dtype)
    _like(op, "dy", dy, x.shape, x.dtype)
    param = TensorSpec(tuple(normalized_shape), x.dtype)
    return TensorSpec(x.shape, x.dtype), param, param


@backend_extension("nn.layer_norm_backward", output=_ln_bwd_spec, publish=False,
                   description="layer norm backward: dx, dweight, dbias in one op")
def layer_norm_backward(x: Tensor, weight: Tensor | None, mean: Tensor, rstd: Tensor, dy: Tensor, *,
                        normalized_shape: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`layer_norm`'s y: (dx, dweight, dbias) with g = dy * weight and xhat = (x - mean) * rstd,
    ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` over the normalised dims; dweight = sum(dy * xhat) and
    dbias = sum(dy) over the leading dims (returned even when the forward had no weight or bias)."""
    k = len(normalized_shape)
    dims = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    xhat = (x - mean) * rstd
    g = dy if weight is None else dy * weight
    dx = rstd * (g - g.mean(dims, keepdim=True) - xhat * (g * xhat).mean(dims, keepdim=True))
    dweight = (dy * xhat).sum(lead) if lead else dy * xhat
    dbias = dy.sum(lead) if lead else dy * 1.0
    return dx, dweight, dbias


@layer_norm.vjp(outputs=(1, 2))  # reads mean and rstd: y may be modified in place
def _layer_norm_vjp(ctx: Any, gy: Tensor, *stat_grads: Tensor) -> tuple[Tensor | None, ...]:
    x, weight, bias = ctx.inputs
    _, mean, rstd = ctx.outputs
    # the statistics are the op's workspace (no caller differentiates them): their gradients are ignored
    dx, dweight, dbias = layer_norm_backward(x, weight, mean, rstd, gy,
                                             normalized_shape=ctx.kwargs["normalized_shape"])
    return dx, (dweight if weight is not None else None), (dbias if bias is not None else None)
