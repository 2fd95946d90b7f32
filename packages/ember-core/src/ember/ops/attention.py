"""Scaled dot-product attention as one extension op, and its backward as another.

``sdpa`` computes ``attn = softmax(q @ k^T * scale + mask)`` and ``out = attn @ v`` over (..., L, E), (..., S, E),
(..., S, Ev). Its default composition is written in ember ops, so every backend runs it (fused and differentiated
like any ember code); a backend may register one kernel for the whole attention (see docs/extensions.md; ember-flex
does). The op's vjp is ``sdpa_backward``, itself one op with a composition in ember ops, so a backend with kernels
for both pays one dispatch and one autodiff node per attention instead of a dozen.

Besides ``out`` the op returns ``attn``, the softmax probabilities (..., L, S): the backward reads them (PyTorch's
math path saves the same), and MultiheadAttention's ``need_weights`` could return them. Masks: a bool mask keeps
positions where it is True, a float mask is added to the scores; ``is_causal`` keeps the top-left aligned lower
triangle (as torch). Rows whose every position is masked give zeros (torch's math path uses a "safe" softmax).
Grouped-query attention (``enable_gqa``) repeats each key/value head ``repeat_k`` / ``repeat_v`` times along dim -3
(repeat_interleave, as torch). Dropout comes as ``dropout_mask``, drawn by the caller (so the device's random stream
is used as everywhere else): the kept positions' factor ``1 / (1 - p)``, zeros elsewhere, of the attention's shape;
``out = (attn * dropout_mask) @ v`` while ``attn`` stays the undropped probabilities.

``sdpa_out`` is the same forward returning ``out`` alone, for calls no gradient can flow through (inference:
grad mode off, or no operand requires grad) that do not ask for the weights: its default composition is
``sdpa(...)[0]`` (so a backend's ``sdpa`` kernel serves it), and a backend may register a kernel that never holds
the whole (..., L, S) probabilities (ember-flex keeps one block's scores at a time). It has no vjp of its own: on a
stack that tracks its operands, autodiff differentiates that composition, so a tracked call still gets every
gradient.

The backward uses ``D = rowsum(dout * out)`` (FlashAttention's identity, equal to ``rowsum(dP * attn)``):
``dS = attn * (dout @ v^T * dropout_mask - D)``, ``dq = dS @ k * scale``, ``dk = dS^T @ q * scale``,
``dv = (attn * dropout_mask)^T @ dout``; gradients of broadcast batch dims and of repeated (GQA) heads are summed
back to each input's shape.
"""

from __future__ import annotations

from typing import Any

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError
from ..extension import TensorSpec, backend_extension
from ..shapes import broadcast_shapes
from ..tensor import Tensor
from . import nn as _nn
from .elementwise import tracks_grad
from .pointwise import where

__all__ = ["gradient_can_flow", "repeated_shape", "sdpa", "sdpa_backward", "sdpa_out", "sdpa_shapes"]

_OP = "scaled_dot_product_attention"


def gradient_can_flow(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None) -> bool:
    """Whether autodiff would record this attention: a differentiable stack, grad mode on and an operand that
    requires grad. Where it would not, :func:`sdpa_out` computes the output alone (no (..., L, S) weights)."""
    return tracks_grad(query._device.stack, query._h, key._h, value._h, None if attn_mask is None else attn_mask._h)


def repeated_shape(shape: tuple[int, ...], r: int) -> tuple[int, ...]:
    """The shape after repeating dim -3 (the heads) r times (GQA's repeat_interleave)."""
    return shape if r == 1 else shape[:-3] + (shape[-3] * r,) + shape[-2:]


def sdpa_shapes(q: Any, k: Any, v: Any, mask: Any, repeat_k: int, repeat_v: int,
                op: str = _OP) -> tuple[tuple[int, ...], int, int, int]:
    """Check the operands' shapes (specs or tensors); returns (batch, L, S, Ev): the attention is batch + (L, S)."""
    for name, t in (("query", q), ("key", k), ("value", v)):
        if len(t.shape) < 2:
            raise ShapeError(f"{op}: expected {name} with at least 2 dims (..., seq, features), got shape {t.shape}")
    (L, E), (S, Ek) = q.shape[-2:], k.shape[-2:]
    if Ek != E or v.shape[-2] != S:
        raise ShapeError(f"{op}: expected query (..., L, E), key (..., S, E), value (..., S, Ev), got shapes "
                         f"{q.shape}, {k.shape} and {v.shape}")
    for name, t, r in (("key", k, repeat_k), ("value", v, repeat_v)):
        if r != 1 and len(t.shape) < 3:
            raise ShapeError(f"{op}: repeating the heads of {name} (GQA) needs dim -3, got shape {t.shape}")
    batch = broadcast_shapes(q.shape[:-2], repeated_shape(k.shape, repeat_k)[:-2],
                             repeated_shape(v.shape, repeat_v)[:-2], op=op)
    if mask is not None and broadcast_shapes(mask.shape, batch + (L, S), op=op) != batch + (L, S):
        raise ShapeError(f"{op}: attn_mask of shape {mask.shape} does not broadcast to the attention shape "
                         f"{batch + (L, S)}")
    return batch, L, S, v.shape[-1]


def _check_dtypes(q: Any, k: Any, v: Any, mask: Any, op: str) -> None:
    d = q.dtype
    if not d.is_floating_point:
        raise DTypeError(f"{op}: expected a floating-point dtype, got {d.name}")
    if k.dtype is not d or v.dtype is not d:
        raise DTypeError(f"{op}: query, key and value must have one dtype, got {d.name}, {k.dtype.name} and "
                         f"{v.dtype.name}")
    if mask is not None and mask.dtype is not dt.bool_ and mask.dtype is not d:
        raise DTypeError(f"{op}: expected attn_mask dtype to be bool or {d.name} (the query's), got "
                         f"{mask.dtype.name}")


def _check_dropout(drop: Any, q: TensorSpec, shape: tuple[int, ...], op: str) -> None:
    if drop is not None and (not isinstance(drop, TensorSpec) or drop.shape != shape or drop.dtype is not q.dtype):
        raise ShapeError(f"{op}: expected dropout_mask of shape {shape} and dtype {q.dtype.name} (the attention's), "
                         f"got {getattr(drop, 'shape', drop)!r}")


def _spec(q: TensorSpec, k: TensorSpec, v: TensorSpec, mask: TensorSpec | None, drop: TensorSpec | None, *,
          scale: float, is_causal: bool = False, repeat_k: int = 1, repeat_v: int = 1,
          mask_grad: bool = False) -> tuple[TensorSpec, TensorSpec]:
    _check_dtypes(q, k, v, mask, _OP)
    batch, L, S, ev = sdpa_shapes(q, k, v, mask, repeat_k, repeat_v)
    _check_dropout(drop, q, batch + (L, S), _OP)
    return TensorSpec(batch + (L, ev), q.dtype), TensorSpec(batch + (L, S), q.dtype)


def _repeat_heads(t: Tensor, r: int) -> Tensor:
    """repeat_interleave by r along dim -3 (each key/value head serves r query heads)."""
    if r == 1:
        return t
    shape = tuple(t.shape)
    e = t.unsqueeze(-3).expand(*shape[:-2], r, *shape[-2:])
    return e.reshape(repeated_shape(shape, r))


def _unrepeat_heads(g: Tensor, r: int) -> Tensor:
    """The gradient of :func:`_repeat_heads`: each head's r copies summed."""
    if r == 1:
        return g
    shape = tuple(g.shape)
    return g.reshape(*shape[:-3], shape[-3] // r, r, *shape[-2:]).sum(-3)


def _sum_to(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """g summed over the dims broadcasting added or expanded, down to ``shape``."""
    if tuple(g.shape) == shape:
        return g
    lead = g.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return g.sum(dim=dims, keepdim=True).reshape(shape) if dims else g.reshape(shape)


def _keep_causal(L: int, S: int, like: Tensor) -> Tensor:
    """(L, S) bool: True on and below the diagonal (top-left aligned, as torch's is_causal)."""
    from .creation import arange

    r = arange(L, device=like._device).reshape(L, 1)
    c = arange(S, device=like._device).reshape(1, S)
    return c <= r


@backend_extension("nn.scaled_dot_product_attention", output=_spec, publish=False,
                   description="scaled dot-product attention (softmax(q k^T * scale + mask) v) and its weights")
def sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, dropout_mask: Tensor | None, *,
         scale: float,
         is_causal: bool = False, repeat_k: int = 1, repeat_v: int = 1,
         mask_grad: bool = False) -> tuple[Tensor, Tensor]:
    """Attention of validated operands; returns ``(out, attn)`` (see the module docstring).

    Args:
        query, key, value: (..., L, E), (..., S, E), (..., S, Ev), batch dims broadcasting (after the GQA repeat).
        attn_mask: None, a bool mask (True keeps) or a float mask added to the scores, broadcasting to
            (..., L, S); never given together with ``is_causal``.
        dropout_mask: None, or the dropout's factors (0 or ``1 / (1 - p)``) of the attention's shape (..., L, S).
        scale: the factor of the scores. repeat_k, repeat_v: GQA head repeats of key and value.
        mask_grad: whether the backward should return the float mask's gradient (it requires grad).
    """
    k, v = _repeat_heads(key, repeat_k), _repeat_heads(value, repeat_v)
    batch, L, S, _ = sdpa_shapes(query, key, value, attn_mask, repeat_k, repeat_v)
    scores = (query @ k.transpose(-2, -1)) * scale
    if is_causal:
        scores = where(_keep_causal(L, S, query), scores, float("-inf"))
    elif attn_mask is not None and attn_mask.dtype is dt.bool_:
        scores = where(attn_mask, scores, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask
    if tuple(scores.shape) != batch + (L, S):  # value's batch dims broadcast further than query's and key's
        scores = scores.expand(*batch, L, S)
    attn = _nn.softmax(scores, scores.ndim - 1, scores.dtype)
    # safe softmax: a row that is entirely -inf gives zeros instead of NaN
    attn = where(scores.amax(-1, keepdim=True) == float("-inf"), 0.0, attn)
    return (attn if dropout_mask is None else attn * dropout_mask) @ v, attn


def _out_spec(q: TensorSpec, k: TensorSpec, v: TensorSpec, mask: TensorSpec | None, drop: TensorSpec | None, *,
              scale: float, is_causal: bool = False, repeat_k: int = 1, repeat_v: int = 1) -> TensorSpec:
    return _spec(q, k, v, mask, drop, scale=scale, is_causal=is_causal, repeat_k=repeat_k, repeat_v=repeat_v)[0]


@backend_extension("nn.scaled_dot_product_attention_out", output=_out_spec, publish=False,
                   description="scaled dot-product attention's output alone (no weights kept: inference)")
def sdpa_out(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, dropout_mask: Tensor | None, *,
             scale: float, is_causal: bool = False, repeat_k: int = 1, repeat_v: int = 1) -> Tensor:
    """``out`` of :func:`sdpa` without the attention weights (see the module docstring); same operands.

    The composition is :func:`sdpa`'s first output, so a backend with an ``sdpa`` kernel runs it here too; on a
    stack that tracks the operands autodiff differentiates it (a float mask that requires grad gets its gradient).
    """
    mask_grad = attn_mask is not None and attn_mask.dtype is not dt.bool_ and attn_mask.requires_grad
    return sdpa(query, key, value, attn_mask, dropout_mask, scale=scale, is_causal=is_causal, repeat_k=repeat_k,
                repeat_v=repeat_v, mask_grad=mask_grad)[0]


def _backward_spec(q: TensorSpec, k: TensorSpec, v: TensorSpec, mask: TensorSpec | None, drop: TensorSpec | None,
                   out: TensorSpec, attn: TensorSpec, dout: TensorSpec, *, scale: float, is_causal: bool = False,
                   repeat_k: int = 1, repeat_v: int = 1, mask_grad: bool = False) -> tuple[TensorSpec, ...]:
    op = "scaled_dot_product_attention_backward"
    _check_dtypes(q, k, v, mask, op)
    batch, L, S, ev = sdpa_shapes(q, k, v, mask, repeat_k, repeat_v, op)
    _check_dropout(drop, q, batch + (L, S), op)
    for name, spec, shape in (("out", out, batch + (L, ev)), ("attn", attn, batch + (L, S)),
                              ("dout", dout, batch + (L, ev))):
        if not isinstance(spec, TensorSpec) or spec.shape != shape or spec.dtype is not q.dtype:
            raise ShapeError(f"{op}: expected {name} of shape {shape} and dtype {q.dtype.name}, got "
                             f"{getattr(spec, 'shape', spec)!r}")
    outs = [TensorSpec(q.shape, q.dtype), TensorSpec(k.shape, q.dtype), TensorSpec(v.shape, q.dtype)]
    if mask_grad:
        if mask is None or mask.dtype is dt.bool_:
            raise DTypeError(f"{op}: mask_grad needs a float attn_mask, got {mask!r}")
        outs.append(TensorSpec(mask.shape, q.dtype))
    return tuple(outs)


@backend_extension("nn.scaled_dot_product_attention_backward", output=_backward_spec, publish=False,
                   description="gradients of scaled dot-product attention in one pass")
def sdpa_backward(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, dropout_mask: Tensor | None,
                  out: Tensor, attn: Tensor, dout: Tensor, *, scale: float, is_causal: bool = False,
                  repeat_k: int = 1, repeat_v: int = 1, mask_grad: bool = False) -> tuple[Tensor, ...]:
    """Gradients of :func:`sdpa` from the forward's inputs, its outputs ``out`` and ``attn``, and ``dout``.

    Takes the forward's inputs too (``dropout_mask`` the same factors). Returns (dquery, dkey, dvalue), each of its
    input's shape, then the float mask's gradient with ``mask_grad``.
    """
    k, v = _repeat_heads(key, repeat_k), _repeat_heads(value, repeat_v)
    dropped = attn if dropout_mask is None else attn * dropout_mask
    dv = dropped.transpose(-2, -1) @ dout
    d = (dout * out).sum(-1, keepdim=True)  # = rowsum(dP * attn), dropout included: out = dropped @ v
    dp = dout @ v.transpose(-2, -1)
    ds = attn * ((dp if dropout_mask is None else dp * dropout_mask) - d)
    dq = (ds @ k) * scale
    dk = (ds.transpose(-2, -1) @ query) * scale
    grads = [_sum_to(dq, tuple(query.shape)),
             _unrepeat_heads(_sum_to(dk, repeated_shape(tuple(key.shape), repeat_k)), repeat_k),
             _unrepeat_heads(_sum_to(dv, repeated_shape(tuple(value.shape), repeat_v)), repeat_v)]
    if mask_grad:
        assert attn_mask is not None
        grads.append(_sum_to(ds, tuple(attn_mask.shape)))
    return tuple(grads)


@sdpa.vjp
def _sdpa_vjp(ctx: Any, dout: Tensor, dattn: Tensor | None = None) -> tuple[Tensor | None, ...]:
    # ``attn`` is the op's second output for the backward's sake; nothing downstream differentiates through it
    # (F.scaled_dot_product_attention returns ``out`` only), so its gradient is not used
    query, key, value, attn_mask, dropout_mask = ctx.inputs
    out, attn = ctx.outputs
    res = sdpa_backward(query, key, value, attn_mask, dropout_mask, out, attn, dout, **ctx.kwargs)
    return res[0], res[1], res[2], (res[3] if ctx.kwargs.get("mask_grad") else None), None
