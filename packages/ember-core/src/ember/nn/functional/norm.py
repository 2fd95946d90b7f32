"""Normalisation layers as functions: layer_norm, rms_norm, batch_norm, group_norm, instance_norm."""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import dtypes as dt
from ...amp.autocast_mode import STATE as _AMP
from ...amp.autocast_mode import run as _amp_run
from ...autograd import no_grad
from ...errors import ShapeError, ValueRangeError
from ...ops import nn as _nn
from ...ops import train_kernels as _tk
from ...tensor import Tensor
from ._util import check_float, check_like, is_int, prod


def _normalized_shape(op: str, input: Tensor, normalized_shape: Any) -> tuple[int, ...]:
    if is_int(normalized_shape):
        ns: tuple[int, ...] = (int(normalized_shape),)
    elif isinstance(normalized_shape, (tuple, list)) and all(is_int(v) for v in normalized_shape):
        ns = tuple(int(v) for v in normalized_shape)
    else:
        raise ValueRangeError(f"{op}: normalized_shape must be an int or a sequence of ints, "
                              f"got {normalized_shape!r}")
    k = len(ns)
    if k == 0 or k > input.ndim or input.shape[input.ndim - k:] != ns:
        raise ShapeError(f"{op}: normalized_shape {ns} does not match the last {k} dims of input shape "
                         f"{input.shape}")
    return ns


def layer_norm(input: Tensor, normalized_shape: Any, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the trailing normalized_shape dims, then weight and bias."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("layer_norm", layer_norm, input, normalized_shape, weight, bias, eps)
    op = "layer_norm"
    check_float(input, op)
    ns = _normalized_shape(op, input, normalized_shape)
    # torch's mixed-dtype form: float16/bfloat16 input with float32 weight and bias, computed in float32
    params = [t for t in (weight, bias) if t is not None]
    mixed = (input._dtype in (dt.float16, dt.bfloat16) and bool(params)
             and all(isinstance(t, Tensor) and t._dtype is dt.float32 for t in params))
    ref = Tensor._make(input._h, dt.float32, input._device) if mixed else input  # dtype reference for the checks
    if weight is not None:
        check_like(ref, weight, op, "weight", ns)
    if bias is not None:
        check_like(ref, bias, op, "bias", ns)
    return _nn.layer_norm(input, ns, weight, bias, eps, mixed)


def rms_norm(input: Tensor, normalized_shape: Any, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the trailing dims; eps defaults to the dtype's machine epsilon."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("rms_norm", rms_norm, input, normalized_shape, weight, eps)
    op = "rms_norm"
    check_float(input, op)
    ns = _normalized_shape(op, input, normalized_shape)
    if weight is not None:
        check_like(input, weight, op, "weight", ns)
    if eps is None:
        eps = float(np.finfo(input._dtype.numpy).eps)
    return _nn.rms_norm(input, ns, weight, eps)


def _channel_params(op: str, input: Tensor, c: int, **params: Tensor | None) -> None:
    for name, t in params.items():
        if t is not None:
            check_like(input, t, op, name, (c,))


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalise ``(N, C, *)`` per channel; in training, batch stats are used and running stats updated in place
    (running_var gets the unbiased variance, as torch)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        # the running statistics go by keyword: autocast never casts them (they are updated in place)
        return _amp_run("batch_norm", batch_norm, input, running_mean=running_mean, running_var=running_var,
                        weight=weight, bias=bias, training=training, momentum=momentum, eps=eps)
    op = "batch_norm"
    check_float(input, op)
    if input.ndim < 2:
        raise ShapeError(f"{op}: expected input with at least 2 dims (N, C, *), got shape {input.shape}")
    c = input.shape[1]
    _channel_params(op, input, c, running_mean=running_mean, running_var=running_var, weight=weight, bias=bias)
    count = prod(input.shape[d] for d in (0,) + tuple(range(2, input.ndim)))
    if training and count == 1:
        raise ValueRangeError(f"{op}: expected more than 1 value per channel when training, got input "
                              f"shape {input.shape}")
    if not training and (running_mean is None or running_var is None):
        raise ValueRangeError(f"{op}: running_mean and running_var must be given when training=False")
    if (training and input.numel() and input._dtype in (dt.float32, dt.float64)
            and _tk.has_kernel(_tk.batch_norm_train, input)):
        return _batch_norm_fused(input, running_mean, running_var, weight, bias, momentum, eps, count)
    return _nn.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def _batch_norm_fused(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None,
                      bias: Tensor | None, momentum: float, eps: float, count: int) -> Tensor:
    """Training-mode batch norm as one op (and one backward op) where the backend has kernels for them; the
    running statistics are updated from the op's batch mean and variance as the unfused path does."""
    y, mean, _, var = _tk.batch_norm_train(input, weight, bias, eps=eps)
    with no_grad():  # the statistics only feed the buffers: nothing here joins the gradient graph
        _nn.update_running_stats(running_mean, running_var, mean, var, momentum, count)
    return y


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalise ``(N, C, *)`` over groups of C // num_groups channels (and all spatial positions)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("group_norm", group_norm, input, num_groups, weight, bias, eps)
    op = "group_norm"
    check_float(input, op)
    if input.ndim < 2:
        raise ShapeError(f"{op}: expected input with at least 2 dims (N, C, *), got shape {input.shape}")
    if not is_int(num_groups) or num_groups < 1:
        raise ValueRangeError(f"{op}: num_groups must be a positive int, got {num_groups!r}")
    c = input.shape[1]
    if c % num_groups:
        raise ShapeError(f"{op}: expected number of channels in input to be divisible by num_groups, but got "
                         f"input of shape {input.shape} and num_groups={num_groups}")
    _channel_params(op, input, c, weight=weight, bias=bias)
    return _nn.group_norm(input, num_groups, weight, bias, eps)


def instance_norm(input: Tensor, running_mean: Tensor | None = None, running_var: Tensor | None = None,
                  weight: Tensor | None = None, bias: Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalise each (n, c) plane of ``(N, C, *)`` over its spatial positions."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("instance_norm", instance_norm, input, running_mean=running_mean, running_var=running_var,
                        weight=weight, bias=bias, use_input_stats=use_input_stats, momentum=momentum, eps=eps)
    op = "instance_norm"
    check_float(input, op)
    if input.ndim < 3:
        raise ShapeError(f"{op}: expected input with at least 3 dims (N, C, *spatial), got shape {input.shape}")
    c = input.shape[1]
    _channel_params(op, input, c, running_mean=running_mean, running_var=running_var, weight=weight, bias=bias)
    count = prod(input.shape[2:])
    if use_input_stats:
        if count <= 1:
            raise ValueRangeError(f"{op}: expected more than 1 spatial element when training, got input shape "
                                  f"{input.shape}")
    elif running_mean is None or running_var is None:
        raise ValueRangeError(f"{op}: running_mean and running_var must be given when use_input_stats=False")
    return _nn.instance_norm(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)


__all__ = ["layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm"]
