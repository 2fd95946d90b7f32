"""Affine maps, lookups and dropout: linear, bilinear, embedding, one_hot, dropout(1d/2d/3d)."""

from __future__ import annotations

from ... import dtypes as dt
from ...amp.autocast_mode import STATE as _AMP
from ...amp.autocast_mode import run as _amp_run
from ...errors import DTypeError, ShapeError, ValueRangeError
from ...ops import nn as _nn
from ...tensor import Tensor
from ._util import check_float, check_like, check_tensor, device_mismatch, is_int


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``input @ weight.T + bias``; input ``(*, in_features)``, weight ``(out_features, in_features)`` or
    ``(in_features,)``."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("linear", linear, input, weight, bias)
    op = "linear"
    check_float(input, op)
    check_like(input, weight, op, "weight")
    if weight.ndim not in (1, 2):
        raise ShapeError(f"{op}: expected weight with 2 dims (out_features, in_features) or 1, got shape "
                         f"{weight.shape}")
    if input.ndim == 0:
        raise ShapeError(f"{op}: expected input with at least 1 dim (*, in_features), got shape {input.shape}")
    fin = weight.shape[-1]
    if input.shape[-1] != fin:
        raise ShapeError(f"{op}: input has {input.shape[-1]} features (shape {input.shape}) but weight expects "
                         f"{fin} (weight shape {weight.shape})")
    out_shape = input.shape[:-1] + weight.shape[:-1]
    if bias is not None:
        check_like(input, bias, op, "bias")
        if bias.shape not in ((), weight.shape[:-1], (1,) * len(weight.shape[:-1])):
            raise ShapeError(f"{op}: bias of shape {bias.shape} does not match out_features "
                             f"{weight.shape[:-1]} (weight shape {weight.shape})")
    return _nn.linear(input, weight, bias, out_shape)


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y[..., o] = input1[..., i] * weight[o, i, j] * input2[..., j] + bias[o]."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("bilinear", bilinear, input1, input2, weight, bias)
    op = "bilinear"
    check_float(input1, op, "input1")
    check_like(input1, input2, op, "input2")
    check_like(input1, weight, op, "weight")
    if weight.ndim != 3:
        raise ShapeError(f"{op}: expected weight with 3 dims (out_features, in1_features, in2_features), got "
                         f"shape {weight.shape}")
    o, i1, i2 = weight.shape
    if input1.ndim == 0 or input1.shape[-1] != i1 or input2.ndim == 0 or input2.shape[-1] != i2:
        raise ShapeError(f"{op}: input1 shape {input1.shape} and input2 shape {input2.shape} do not match weight "
                         f"shape {weight.shape} (expected last dims {i1} and {i2})")
    if input1.shape[:-1] != input2.shape[:-1]:
        raise ShapeError(f"{op}: input1 and input2 must have the same batch dims, got {input1.shape} and "
                         f"{input2.shape}")
    if bias is not None:
        check_like(input1, bias, op, "bias", (o,))
    return _nn.bilinear(input1, input2, weight, bias)


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """Rows of weight (num_embeddings, dim) picked by the integer indices in input; max_norm renormalises the
    referenced rows of weight in place, as torch."""
    op = "embedding"
    check_tensor(input, op)
    check_tensor(weight, op, "weight")
    if input._dtype not in (dt.int64, dt.int32):
        raise DTypeError(f"{op}: expected indices of dtype int64 or int32, got {input._dtype.name}")
    if weight.ndim != 2:
        raise ShapeError(f"{op}: expected weight with 2 dims (num_embeddings, embedding_dim), got shape "
                         f"{weight.shape}")
    if input._device is not weight._device:
        raise device_mismatch(op, "weight", input, weight)
    num = weight.shape[0]
    if padding_idx is not None:
        if not is_int(padding_idx) or not -num <= padding_idx < num:
            raise ValueRangeError(f"{op}: padding_idx must be within num_embeddings ({num}), got {padding_idx!r}")
    return _nn.embedding(input, weight, padding_idx, max_norm, norm_type)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """int64 one-hot encoding with a trailing dim of num_classes (-1: max value + 1)."""
    op = "one_hot"
    check_tensor(tensor, op, "tensor")
    if tensor._dtype is not dt.int64:
        raise DTypeError(f"{op}: is only applicable to index tensors of dtype int64, got {tensor._dtype.name}")
    if not is_int(num_classes) or num_classes < -1:
        raise ValueRangeError(f"{op}: num_classes must be -1 or a non-negative int, got {num_classes!r}")
    return _nn.one_hot(tensor, num_classes)


# ----------------------------------------------------------------------------------------------------------
# dropout
# ----------------------------------------------------------------------------------------------------------
def _dropout(op: str, input: Tensor, p: float, training: bool, inplace: bool, mask_shape: tuple[int, ...]) -> Tensor:
    if not 0.0 <= p <= 1.0:
        raise ValueRangeError(f"{op}: dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0 or input.numel() == 0:
        return input
    # keep with probability 1 - p, scale kept values by 1 / (1 - p); one draw from the device stream
    return _nn.dropout(input, p, inplace, mask_shape)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero each element with probability p and scale the rest by 1 / (1 - p) (identity when not training)."""
    check_tensor(input, "dropout")
    if not input._dtype.is_floating_point and training and p not in (0.0, 1.0) and input.numel():
        # torch accepts integer and bool input where no scaling happens (p of 0 or 1, eval mode, empty input);
        # a 1 / (1 - p) scale has a float result, which it refuses to write back into the input's dtype
        raise DTypeError(f"dropout: result type float32 can't be cast to the desired output type "
                         f"{input._dtype.name} (p={p} scales by 1 / (1 - p); pass a floating point tensor)")
    return _dropout("dropout", input, p, training, inplace, input.shape)


def _feature_dropout(op: str, nd: int, input: Tensor, p: float, training: bool, inplace: bool) -> Tensor:
    check_float(input, op)
    if input.ndim not in (nd + 1, nd + 2):
        raise ShapeError(f"{op}: expected input with {nd + 2} dims (N, C, *spatial) or {nd + 1} (C, *spatial), "
                         f"got shape {input.shape}")
    # one draw per channel: zero whole feature maps (unbatched inputs keep their leading channel dim)
    lead = 1 if input.ndim == nd + 1 else 2
    if nd == 2 and input.ndim == 3:
        lead = 2  # torch keeps dropout2d's historical reading of 3-D input as (N, C, L)
    mask = input.shape[:lead] + (1,) * (input.ndim - lead)
    return _dropout(op, input, p, training, inplace, mask)


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Channel-wise dropout of (N, C, L) or (C, L)."""
    return _feature_dropout("dropout1d", 1, input, p, training, inplace)


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Channel-wise dropout of (N, C, H, W) or (C, H, W)."""
    return _feature_dropout("dropout2d", 2, input, p, training, inplace)


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Channel-wise dropout of (N, C, D, H, W) or (C, D, H, W)."""
    return _feature_dropout("dropout3d", 3, input, p, training, inplace)


__all__ = ["linear", "bilinear", "embedding", "one_hot", "dropout", "dropout1d", "dropout2d", "dropout3d"]
