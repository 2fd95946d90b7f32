"""numpy kernels for core's attention ops (``nn.scaled_dot_product_attention`` and its backward).

Forward, in one call: the scale folded into q (L*E multiplies instead of L*S), one batched GEMM for the scores, the
mask or causal triangle applied in place, a numerically stable softmax in place in the scores' buffer (max
subtracted, exp, times the reciprocal of the row sums; rows that are entirely masked give zeros, torch's "safe"
softmax), and one batched GEMM with v (of the probabilities times the dropout factors, when dropout is on). The
probabilities are the op's second output: the backward reads them.

Backward, in one pass: dv = (attn * drop)^T @ dout, dP = dout @ v^T * drop, and in place in dP's buffer
dS = attn * (dP - rowsum(dout * out)); then dq = dS @ k * scale and dk = dS^T @ q * scale. Broadcast batch dims
and repeated (GQA) heads are summed back to each input's shape.

float32 and float64 compute in their own dtype; other floating dtypes in float32, rounded once at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .kernel_dtypes import cast_back as _cast
from .kernel_dtypes import work_arrays as _work

__all__ = ["register", "sdpa", "sdpa_backward"]


def _repeat(h: np.ndarray, r: int) -> np.ndarray:
    """repeat_interleave by r along dim -3 (GQA: each key/value head serves r query heads)."""
    return h if r == 1 else np.repeat(h, r, axis=-3)


def _unrepeat(g: np.ndarray, r: int) -> np.ndarray:
    if r == 1:
        return g
    s = g.shape
    return g.reshape(s[:-3] + (s[-3] // r, r) + s[-2:]).sum(-3)


def _sum_to(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """g summed over the dims broadcasting added or expanded, down to ``shape``."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=dims).reshape(shape) if dims else g.reshape(shape)


def _full(h: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """h as a writable array of ``shape`` (a copy where h's batch dims broadcast to it)."""
    return h if h.shape == shape else np.broadcast_to(h, shape).copy()


def sdpa(backend: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
         drop: np.ndarray | None, *, scale: float, is_causal: bool = False, repeat_k: int = 1, repeat_v: int = 1,
         mask_grad: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The forward (see the module docstring); returns (out, attn)."""
    dt = q.dtype
    work, (q, k, v, mask, drop) = _work(q, k, v, mask, drop)
    k, v = _repeat(k, repeat_k), _repeat(v, repeat_v)
    L, S = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    qs = q * work.type(scale)
    scores = _full(np.matmul(qs, np.swapaxes(k, -1, -2)), batch + (L, S))
    if is_causal:
        np.copyto(scores, -np.inf, where=np.triu(np.ones((L, S), np.bool_), 1))
    elif mask is not None and mask.dtype == np.bool_:
        np.copyto(scores, -np.inf, where=~mask)
    elif mask is not None:
        scores += mask
    # stable softmax in place: rows whose max is -inf (all masked) subtract 0 and divide by 1, giving zeros
    m = scores.max(-1, keepdims=True)
    empty = m == -np.inf
    masked_rows = bool(empty.any())
    if masked_rows:
        m[empty] = 0
    scores -= m
    with np.errstate(under="ignore"):
        np.exp(scores, out=scores)
    total = scores.sum(-1, keepdims=True)
    if masked_rows:
        total[empty] = 1
    scores *= np.reciprocal(total, out=total)  # as torch's CPU softmax: one reciprocal per row, then multiplies
    out = np.matmul(scores if drop is None else scores * drop, v)
    return _cast(dt, (out, scores))


def sdpa_backward(backend: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                  drop: np.ndarray | None, out: np.ndarray, attn: np.ndarray, dout: np.ndarray, *, scale: float,
                  is_causal: bool = False, repeat_k: int = 1, repeat_v: int = 1,
                  mask_grad: bool = False) -> tuple[np.ndarray, ...]:
    """dq, dk, dv (and the float mask's gradient with ``mask_grad``) in one pass (see the module docstring)."""
    dt = q.dtype
    q_shape = q.shape
    work, (q, k, v, mask, drop, out, attn, dout) = _work(q, k, v, mask, drop, out, attn, dout)
    kr, vr = _repeat(k, repeat_k), _repeat(v, repeat_v)
    dv = np.matmul(np.swapaxes(attn if drop is None else attn * drop, -1, -2), dout)
    ds = np.matmul(dout, np.swapaxes(vr, -1, -2))  # dP, then dS in place
    if ds.shape != attn.shape:  # v's batch dims narrower than the attention's
        ds = _full(ds, attn.shape)
    if drop is not None:
        ds *= drop
    ds -= np.einsum("...i,...i->...", dout, out)[..., None]
    ds *= attn
    dq = np.matmul(ds, kr)
    dq *= scale
    dk = np.matmul(np.swapaxes(ds, -1, -2), q)
    dk *= scale
    grads = [_sum_to(dq, q_shape),
             _unrepeat(_sum_to(dk, kr.shape), repeat_k),
             _unrepeat(_sum_to(dv, vr.shape), repeat_v)]
    if mask_grad and mask is not None:
        grads.append(_sum_to(ds, mask.shape))
    return _cast(dt, tuple(np.ascontiguousarray(g) for g in grads))


def register() -> None:
    """Register the kernels with core's attention ops (called when the flex plugin is loaded)."""
    from ember.ops import attention

    attention.sdpa.kernel("flex")(sdpa)
    attention.sdpa_backward.kernel("flex")(sdpa_backward)
