"""scaled_dot_product_attention (the math path of torch's SDPA, including GQA and causal masks)."""

from __future__ import annotations

import math
from typing import Any

from ... import dtypes as dt
from ..._bridge import broadcast_shapes2
from ...errors import DTypeError, ShapeError, ValueRangeError
from ...ops.elementwise import keep_graph
from ...tensor import Tensor
from ._util import check_float, check_like, check_tensor, like, prod


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v over (..., L, E), (..., S, E), (..., S, Ev).

    A bool mask keeps positions where it is True; a float mask is added to the scores. Rows whose every
    position is masked give zeros (torch's math path uses a "safe" softmax).
    """
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
    s = query._device.stack
    kh, vh = key._h, value._h
    if enable_gqa and query.ndim >= 3:
        hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
        if hq % hk or hq % hv:
            raise ShapeError(f"{op}: with enable_gqa the number of query heads ({hq}) must be a multiple of the "
                             f"key ({hk}) and value ({hv}) heads (shapes {query.shape}, {key.shape}, "
                             f"{value.shape})")
        kh = _repeat_heads(s, kh, hq // hk)
        vh = _repeat_heads(s, vh, hq // hv)
    batch_q, batch_k, batch_v = query.shape[:-2], tuple(kh.shape[:-2]), tuple(vh.shape[:-2])
    try:
        batch = broadcast_shapes2(broadcast_shapes2(batch_q, batch_k, op), batch_v, op)
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
            broadcast_shapes2(attn_mask.shape, batch + (L, S), op)
        except ShapeError:
            raise ShapeError(f"{op}: attn_mask of shape {attn_mask.shape} does not broadcast to the attention "
                             f"shape {batch + (L, S)}") from None
    # E == 0: every score is exactly 0 and attention is uniform (PyTorch), whatever the scale
    sc = (1.0 / math.sqrt(E) if E else 1.0) if scale is None else float(scale)
    out_shape = batch + (L, value.shape[-1])
    if prod(out_shape) == 0 or S == 0:
        return like(query, keep_graph(s, s.full(out_shape, 0.0, d), query, key, value, attn_mask))
    scores = s.binary("mul", s.matmul(query._h, s.permute(kh, tuple(range(len(kh.shape) - 2)) +
                                                           (len(kh.shape) - 1, len(kh.shape) - 2))), sc)
    keep = None
    if is_causal:
        r = s.reshape(s.arange(0, L, 1, dt.int64), (L, 1))
        c = s.reshape(s.arange(0, S, 1, dt.int64), (1, S))
        keep = s.binary("le", c, r)  # top-left aligned lower triangle, as torch
    elif attn_mask is not None and attn_mask._dtype is dt.bool_:
        keep = attn_mask._h
    elif attn_mask is not None:
        scores = s.binary("add", scores, attn_mask._h)
    if keep is not None:
        scores = s.where(keep, scores, float("-inf"))
    last = len(scores.shape) - 1
    attn = s.softmax(scores, last, False)
    # safe softmax: a row that is entirely -inf gives zeros instead of NaN
    m = s.reduce("max", scores, (last,), True)
    attn = s.where(s.binary("eq", m, float("-inf")), 0.0, attn)
    if dropout_p > 0.0:
        if dropout_p == 1.0:
            attn = s.binary("mul", attn, 0.0)
        else:
            mask = s.binary("lt", s.rand(tuple(attn.shape), d), 1.0 - dropout_p)
            attn = s.binary("mul", attn, s.binary("mul", s.cast(mask, d), 1.0 / (1.0 - dropout_p)))
    return like(query, s.reshape(s.matmul(attn, vh), out_shape))


def _repeat_heads(s: Any, h: Any, r: int) -> Any:
    """repeat_interleave by r along dim -3 (each key/value head serves r query heads)."""
    if r == 1:
        return h
    shape = tuple(h.shape)
    n = len(shape)
    e = s.reshape(h, shape[:-2] + (1,) + shape[-2:])
    e = s.expand(e, shape[:-2] + (r,) + shape[-2:])
    return s.reshape(s.contiguous(e), shape[:n - 3] + (shape[-3] * r,) + shape[-2:])


__all__ = ["scaled_dot_product_attention"]
