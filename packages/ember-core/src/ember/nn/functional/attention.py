"""scaled_dot_product_attention (the math path of torch's SDPA, including GQA and causal masks): checks here,
the attention itself in one extension op (:mod:`ember.ops.attention`), fused into one kernel where the backend has
one."""

from __future__ import annotations

import math

from ... import dtypes as dt
from ...amp.autocast_mode import STATE as _AMP
from ...amp.autocast_mode import run as _amp_run
from ...errors import DTypeError, ShapeError, ValueRangeError
from ...ops import attention as _attention
from ...ops import nn as _nn
from ...shapes import broadcast_shapes
from ...tensor import Tensor
from ._util import check_float, check_like, check_tensor


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v over (..., L, E), (..., S, E), (..., S, Ev).

    A bool mask keeps positions where it is True; a float mask is added to the scores. Rows whose every
    position is masked give zeros (torch's math path uses a "safe" softmax).
    """
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("scaled_dot_product_attention", scaled_dot_product_attention, query, key, value, attn_mask,
                        dropout_p, is_causal, scale, enable_gqa)
    op = "scaled_dot_product_attention"
    check_float(query, op, "query")
    check_like(query, key, op, "key")
    check_like(query, value, op, "value")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.ndim < 2:
            raise ShapeError(f"{op}: expected {name} with at least 2 dims (..., seq, features), got shape {t.shape}")
    L, E = query.shape[-2:]
    S, Ek = key.shape[-2:]
    if Ek != E:
        raise ShapeError(f"{op}: query and key must have the same embedding size, got query shape {query.shape} "
                         f"and key shape {key.shape}")
    if value.shape[-2] != S:
        raise ShapeError(f"{op}: key and value must have the same sequence length, got key shape {key.shape} "
                         f"and value shape {value.shape}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueRangeError(f"{op}: dropout_p must be between 0 and 1, got {dropout_p}")
    if is_causal and attn_mask is not None:
        raise ValueRangeError(f"{op}: explicit attn_mask should not be set when is_causal=True")
    rk = rv = 1
    if enable_gqa and query.ndim >= 3:
        hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
        if hq % hk or hq % hv:
            raise ShapeError(f"{op}: with enable_gqa the number of query heads ({hq}) must be a multiple of the "
                             f"key ({hk}) and value ({hv}) heads (shapes {query.shape}, {key.shape}, "
                             f"{value.shape})")
        rk, rv = hq // hk, hq // hv
    batch_q, batch_k, batch_v = query.shape[:-2], _attention.repeated_shape(key.shape, rk)[:-2], \
        _attention.repeated_shape(value.shape, rv)[:-2]
    try:
        batch = broadcast_shapes(batch_q, batch_k, batch_v, op=op)
    except ShapeError:
        raise ShapeError(f"{op}: batch dims of query {query.shape}, key {key.shape} and value {value.shape} do "
                         f"not broadcast") from None
    d = query._dtype
    if attn_mask is not None:
        check_tensor(attn_mask, op, "attn_mask")
        if attn_mask._dtype is not dt.bool_ and attn_mask._dtype is not d:
            raise DTypeError(f"{op}: expected attn_mask dtype to be bool or {d.name} (the query's), got "
                             f"{attn_mask._dtype.name}")
        try:
            broadcast_shapes(attn_mask.shape, batch + (L, S), op=op)
        except ShapeError:
            raise ShapeError(f"{op}: attn_mask of shape {attn_mask.shape} does not broadcast to the attention "
                             f"shape {batch + (L, S)}") from None
    # E == 0: every score is exactly 0 and attention is uniform (PyTorch), whatever the scale
    sc = (1.0 / math.sqrt(E) if E else 1.0) if scale is None else float(scale)
    out_shape = batch + (L, value.shape[-1])
    if dropout_p == 1.0 or 0 in out_shape or S == 0 or \
            (attn_mask is not None and broadcast_shapes(attn_mask.shape, batch + (L, S)) != batch + (L, S)):
        # dropping everything, empty operands and a mask that widens the batch run the ops composition
        return _nn.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, sc, rk, rv,
                                                out_shape)
    drop = None
    if dropout_p > 0.0:
        # the same draw from the device's stream as the composition's: keep where rand < 1 - p, scaled by 1/(1-p)
        drop = _nn.dropout_factors(query, batch + (L, S), dropout_p, d)
    # one extension op (a backend's fused kernel where it has one; ember.ops.attention's composition otherwise)
    if not _attention.gradient_can_flow(query, key, value, attn_mask):
        # no gradient can flow: the output alone, without the (..., L, S) weights the backward would read
        return _attention.sdpa_out(query, key, value, attn_mask, drop, scale=sc, is_causal=is_causal, repeat_k=rk,
                                   repeat_v=rv)
    mask_grad = attn_mask is not None and attn_mask._dtype is not dt.bool_ and attn_mask.requires_grad
    return _attention.sdpa(query, key, value, attn_mask, drop, scale=sc, is_causal=is_causal, repeat_k=rk,
                           repeat_v=rv, mask_grad=mask_grad)[0]


__all__ = ["scaled_dot_product_attention"]
