"""Gradient clipping and flat-vector views of parameters (``torch.nn.utils``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ...autograd import no_grad
from ...errors import DeviceError, DTypeError, ShapeError, ValueRangeError
from ...tensor import Tensor


def _as_tensors(op: str, parameters: Any) -> list[Tensor]:
    if isinstance(parameters, Tensor):
        return [parameters]
    try:
        out = list(parameters)
    except TypeError:
        raise DTypeError(f"{op}: parameters must be a Tensor or an iterable of Tensors, got "
                         f"{type(parameters).__name__}") from None
    for p in out:
        if not isinstance(p, Tensor):
            raise DTypeError(f"{op}: expected Tensors, but one of the parameters is {type(p).__name__}")
    return out


def _norm_type(op: str, norm_type: Any) -> float:
    if isinstance(norm_type, str) and norm_type == "inf":
        return math.inf
    try:
        v = float(norm_type)
    except (TypeError, ValueError):
        raise ValueRangeError(f"{op}: norm_type must be a number or 'inf', got {norm_type!r}") from None
    if math.isnan(v):
        raise ValueRangeError(f"{op}: norm_type must not be NaN")
    return v


def get_total_norm(tensors: Any, norm_type: float | str = 2.0, error_if_nonfinite: bool = False,
                   foreach: bool | None = None) -> Tensor:
    """The norm of all tensors together, as if concatenated into one vector (``torch.nn.utils.get_total_norm``)."""
    from ... import dtypes as dt
    from ...linalg import vector_norm
    from ...ops.creation import tensor
    from ...ops.shape import stack

    op = "get_total_norm"
    ts = _as_tensors(op, tensors)
    p = _norm_type(op, norm_type)
    if not ts:
        return tensor(0.0)
    dev = ts[0]._device
    for t in ts[1:]:
        if t._device is not dev:
            raise DeviceError(f"{op}: expected all tensors on the same device, got {dev} and {t._device}")
    with no_grad():
        norms = [vector_norm(t, p) for t in ts]
        kind = norms[0]._dtype
        for n in norms[1:]:
            kind = dt.promote_types(kind, n._dtype)
        total = vector_norm(stack([n if n._dtype is kind else n.to(kind) for n in norms]), p)
    if error_if_nonfinite and not math.isfinite(total.item()):
        raise ValueRangeError(
            f"{op}: the total norm of order {norm_type} for gradients from `parameters` is non-finite "
            f"({total.item()}), so it cannot be clipped; to disable this error and scale the gradients by the "
            "non-finite norm anyway, set `error_if_nonfinite=False`"
        )
    return total


def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float | str = 2.0, error_if_nonfinite: bool = False,
                    foreach: bool | None = None) -> Tensor:
    """Scale the gradients of ``parameters`` in place so their total norm is at most ``max_norm``; return the total
    norm before clipping (PyTorch's numerics: ``coef = min(max_norm / (total + 1e-6), 1)``)."""
    op = "clip_grad_norm_"
    params = _as_tensors(op, parameters)
    try:
        max_norm = float(max_norm)
    except (TypeError, ValueError):
        raise ValueRangeError(f"{op}: max_norm must be a number, got {max_norm!r}") from None
    _norm_type(op, norm_type)
    grads = [g for g in (p.grad for p in params) if g is not None]
    total = get_total_norm(grads, norm_type, error_if_nonfinite)
    if not grads:
        return total
    with no_grad():
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef if coef._device is g._device else coef.to(g._device))
    return total


def clip_grad_value_(parameters: Any, clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient of ``parameters`` into ``[-clip_value, clip_value]``, in place."""
    op = "clip_grad_value_"
    params = _as_tensors(op, parameters)
    try:
        clip_value = float(clip_value)
    except (TypeError, ValueError):
        raise ValueRangeError(f"{op}: clip_value must be a number, got {clip_value!r}") from None
    if clip_value < 0 or math.isnan(clip_value):
        raise ValueRangeError(f"{op}: clip_value must be non-negative, got {clip_value}")
    with no_grad():
        for p in params:
            g = p.grad
            if g is not None:
                g.clamp_(min=-clip_value, max=clip_value)


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """All parameters flattened and concatenated into one 1-D tensor (a copy)."""
    from ...ops.shape import cat

    op = "parameters_to_vector"
    params = _as_tensors(op, parameters)
    if not params:
        raise ValueRangeError(f"{op}: got no parameters")
    dev = params[0]._device
    for p in params[1:]:
        if p._device is not dev:
            raise DeviceError(f"{op}: found parameters on different devices: {dev} and {p._device}")
    return cat([p.reshape(-1) for p in params])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy consecutive slices of the 1-D ``vec`` into ``parameters`` (each keeps its identity and shape)."""
    op = "vector_to_parameters"
    if not isinstance(vec, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, but got {type(vec).__name__}")
    if vec.ndim != 1:
        raise ShapeError(f"{op}: expected a 1-D vector, got shape {vec.shape}")
    params = _as_tensors(op, parameters)
    total = sum(p.numel() for p in params)
    if total != vec.shape[0]:
        raise ShapeError(f"{op}: the vector has {vec.shape[0]} elements but the parameters have {total}")
    with no_grad():
        start = 0
        for p in params:
            n = p.numel()
            p.copy_(vec[start:start + n].reshape(p.shape))
            start += n


from . import rnn  # noqa: E402 - packed sequences (nn.utils.rnn), after the helpers above

__all__ = ["rnn", "clip_grad_norm_", "clip_grad_value_", "get_total_norm", "parameters_to_vector",
           "vector_to_parameters"]
