"""``nn.MultiheadAttention`` with torch's parameters, initialisation, masks and numerics."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ...autograd import no_grad
from ...errors import DTypeError, ShapeError, ValueRangeError
from ...ops.creation import zeros
from ...ops.shape import cat
from ...tensor import Tensor
from .. import functional as F
from ..layers import Linear
from ..module import Module
from ._common import (
    causal_mask,
    check_input,
    check_positive_int,
    check_prob,
    const_param,
    float_mask,
    normal_param,
    uniform_param,
    xavier_uniform_bound,
)

_CLS = "MultiheadAttention"


class MultiheadAttention(Module):
    """Multi-head attention (Vaswani et al.): ``out_proj(concat_h softmax(q_h k_h^T / sqrt(d) + mask) v_h)``.

    Inputs are (L, N, E) (or (N, L, E) with batch_first, or unbatched (L, E)); returns ``(attn_output,
    attn_weights)`` with weights averaged over heads unless ``average_attn_weights=False`` (None when
    ``need_weights=False``). Masks: bool True means "do not attend"; float masks are added to the scores.

    ``projection_hook``: None, or ``hook(name, x, y) -> Tensor`` called on each projection's output, ``name`` one
    of ``"q"``, ``"k"``, ``"v"``, ``"out"``, ``x`` the projection's 2-D input rows and ``y`` its output rows (bias
    included); what it returns replaces ``y``. Adapters (LoRA) add their low-rank terms through it: the packed
    ``in_proj_weight`` is one GEMM, so there is no per-projection layer to wrap.
    """

    #: see the class docstring; an instance attribute when set
    projection_hook: Callable[[str, Tensor, Tensor], Tensor] | None = None

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        check_positive_int(_CLS, "embed_dim", embed_dim)
        check_positive_int(_CLS, "num_heads", num_heads)
        self.embed_dim = embed_dim
        self.kdim = check_positive_int(_CLS, "kdim", kdim) if kdim is not None else embed_dim
        self.vdim = check_positive_int(_CLS, "vdim", vdim) if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = check_prob(_CLS, "dropout", dropout)
        self.batch_first = bool(batch_first)
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise ValueRangeError(f"{_CLS}: embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        e = embed_dim
        if self._qkv_same_embed_dim:
            # xavier_uniform_ over the packed (3E, E) matrix, as torch
            self.in_proj_weight = uniform_param((3 * e, e), xavier_uniform_bound(3 * e, e), device, dtype)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = uniform_param((e, e), xavier_uniform_bound(e, e), device, dtype)
            self.k_proj_weight = uniform_param((e, self.kdim), xavier_uniform_bound(e, self.kdim), device, dtype)
            self.v_proj_weight = uniform_param((e, self.vdim), xavier_uniform_bound(e, self.vdim), device, dtype)
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = const_param((3 * e,), 0.0, device, dtype)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(e, e, bias=bias, device=device, dtype=dtype)
        if bias:
            with no_grad():
                self.out_proj.bias.zero_()
        if add_bias_kv:
            # xavier_normal_ on a (1, 1, E) tensor: fan_in = fan_out = E
            std = math.sqrt(2.0 / float(2 * e))
            self.bias_k = normal_param((1, 1, e), std, device, dtype)
            self.bias_v = normal_param((1, 1, e), std, device, dtype)
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = bool(add_zero_attn)

    def _check(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None,
               attn_mask: Tensor | None) -> bool:
        """torch's ``_mha_shape_check`` plus embedding-size checks; returns whether the input is batched."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            check_input(_CLS, name, t)
        for name, m in (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask)):
            if m is not None and not isinstance(m, Tensor):
                raise DTypeError(f"{_CLS}: expected {name} to be a Tensor or None, got {type(m).__name__}")
        if query._dtype is not key._dtype or query._dtype is not value._dtype:
            raise DTypeError(f"{_CLS}: query, key and value must have the same dtype, got {query._dtype.name}, "
                             f"{key._dtype.name} and {value._dtype.name}")
        if query.ndim == 3:
            batched, kpm_dim = True, 2
        elif query.ndim == 2:
            batched, kpm_dim = False, 1
        else:
            raise ShapeError(f"{_CLS}: query should be unbatched 2-D (L, E) or batched 3-D (L, N, E) (N, L, E with "
                             f"batch_first), got shape {query.shape}")
        if key.ndim != query.ndim or value.ndim != query.ndim:
            raise ShapeError(f"{_CLS}: for {query.ndim}-D query (shape {query.shape}) key and value must be "
                             f"{query.ndim}-D too, got shapes {key.shape} and {value.shape}")
        if key_padding_mask is not None and key_padding_mask.ndim != kpm_dim:
            raise ShapeError(f"{_CLS}: for {query.ndim}-D query, expected key_padding_mask to be None or "
                             f"{kpm_dim}-D, got shape {key_padding_mask.shape}")
        if attn_mask is not None and attn_mask.ndim not in (2, 3):
            raise ShapeError(f"{_CLS}: expected attn_mask to be None, 2-D (L, S) or 3-D (N*num_heads, L, S), got "
                             f"shape {attn_mask.shape}")
        for name, t, want in (("query", query, self.embed_dim), ("key", key, self.kdim), ("value", value, self.vdim)):
            if t.shape[-1] != want:
                attr = {"query": "embed_dim", "key": "kdim", "value": "vdim"}[name]
                raise ShapeError(f"{_CLS}: {name} has {t.shape[-1]} features (shape {t.shape}) but the module was "
                                 f"built with {attr}={want}")
        if key.shape[:-1] != value.shape[:-1]:
            raise ShapeError(f"{_CLS}: key and value must have the same sequence and batch dims, got key shape "
                             f"{key.shape} and value shape {value.shape}")
        if batched:
            bdim = 0 if self.batch_first else 1
            if key.shape[bdim] != query.shape[bdim]:
                raise ShapeError(f"{_CLS}: query and key must have the same batch size, got query shape "
                                 f"{query.shape} and key shape {key.shape} (batch_first={self.batch_first})")
        return batched

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        batched = self._check(query, key, value, key_padding_mask, attn_mask)
        same_qk, same_kv = query is key, key is value
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        # the inputs keep their layout: batch_first (N, L, E) or (L, N, E); the projections run on their rows as one
        # GEMM each and the heads are views (N, h, L, hd) of the results, so no transposed copy is made
        bf = self.batch_first and batched
        seq_dim = 1 if bf else 0
        tgt_len, bsz, e = query.shape[seq_dim], query.shape[1 - seq_dim], query.shape[2]
        src_len = key.shape[seq_dim]
        h, hd = self.num_heads, self.head_dim

        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (bsz, src_len):
            want = (bsz, src_len) if batched else (src_len,)
            raise ShapeError(f"{_CLS}: expected key_padding_mask of shape {want} (batch, source length), got "
                             f"{tuple(key_padding_mask.shape) if batched else tuple(key_padding_mask.shape[1:])}")
        kpm = float_mask(_CLS, "key_padding_mask", key_padding_mask, query)
        if attn_mask is not None:
            want2, want3 = (tgt_len, src_len), (bsz * h, tgt_len, src_len)
            if tuple(attn_mask.shape) not in (want2, want3):
                raise ShapeError(f"{_CLS}: attn_mask of shape {tuple(attn_mask.shape)} should be 2-D {want2} or 3-D "
                                 f"{want3} (target length, source length; batch * num_heads first)")
        sdpa_causal = False
        if is_causal and kpm is None and not need_weights:
            # torch hands the causal hint to SDPA and ignores attn_mask
            attn_mask, sdpa_causal = None, True
        elif is_causal and attn_mask is None:
            # torch demands the mask here; building the causal one gives the answer the hint asks for
            attn_mask = causal_mask(tgt_len, src_len, query)
        else:
            attn_mask = float_mask(_CLS, "attn_mask", attn_mask, query)
        # masks in the heads' layout: (1, 1, L, S) or (N, h, L, S); the key padding mask (N, 1, 1, S)
        if attn_mask is not None:
            attn_mask = attn_mask.reshape(*((1, 1) if attn_mask.ndim == 2 else (bsz, h)), *attn_mask.shape[-2:])
        if kpm is not None:
            kpm = kpm.reshape(bsz, 1, 1, src_len)

        hook = self.projection_hook
        if same_qk and same_kv and self._qkv_same_embed_dim and hook is None:
            # self-attention: one GEMM over the rows, and q, k, v as head views (N, h, L, hd) of its result: 4 ops
            # instead of ~17 reshapes, slices and permutes (same GEMM, same numbers)
            a, b = query.shape[0], query.shape[1]
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias).reshape(a, b, 3, h, hd)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0) if bf else qkv.permute(2, 1, 3, 0, 4).unbind(0)
        else:
            q, k, v = self._in_projection(query, key, value, same_qk and same_kv, same_kv)
            q, k, v = self._heads(q, bf), self._heads(k, bf), self._heads(v, bf)

        if self.bias_k is not None and self.bias_v is not None:
            k = cat([k, self.bias_k.reshape(1, h, 1, hd).expand(bsz, h, 1, hd)], 2)
            v = cat([v, self.bias_v.reshape(1, h, 1, hd).expand(bsz, h, 1, hd)], 2)
            attn_mask = _pad_last(attn_mask)
            kpm = _pad_last(kpm)
        if self.add_zero_attn:
            z = zeros((bsz, h, 1, hd), dtype=k._dtype, device=k._device)
            k, v = cat([k, z], 2), cat([v, z], 2)
            attn_mask = _pad_last(attn_mask)
            kpm = _pad_last(kpm)
        src_len = k.shape[2]
        if kpm is not None:
            attn_mask = kpm if attn_mask is None else attn_mask + kpm
        dropout_p = self.dropout if self.training else 0.0

        attn_weights: Tensor | None = None
        if need_weights:
            scores = (q * math.sqrt(1.0 / float(hd))) @ k.transpose(-2, -1)
            if attn_mask is not None:
                scores = scores + attn_mask
            weights = F.softmax(scores, dim=-1)
            if dropout_p > 0.0:
                weights = F.dropout(weights, p=dropout_p)
            out = weights @ v
            attn_weights = weights.mean(dim=1) if average_attn_weights else weights
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, sdpa_causal)
        # (N, h, L, hd) -> the input's layout (N, L, E) or (L, N, E) -> out_proj as one GEMM over its rows
        out = out.permute(0, 2, 1, 3) if bf else out.permute(2, 0, 1, 3)
        out = out.reshape(bsz, tgt_len, e) if bf else out.reshape(tgt_len, bsz, e)
        if hook is None:
            out = F.linear(out, self.out_proj.weight, self.out_proj.bias)
        else:
            rows = out.reshape(tgt_len * bsz, e)
            out = hook("out", rows, F.linear(rows, self.out_proj.weight, self.out_proj.bias))
            out = out.reshape(bsz, tgt_len, e) if bf else out.reshape(tgt_len, bsz, e)
        if not batched:
            out = out.squeeze(1)
            if attn_weights is not None:
                attn_weights = attn_weights.squeeze(0)
        return out, attn_weights

    def _heads(self, x: Tensor, batch_first: bool) -> Tensor:
        """Projected (N, L, E) or (L, N, E) -> (N, h, L, hd), a view where x's rows are contiguous."""
        a, b = x.shape[0], x.shape[1]
        x = x.reshape(a, b, self.num_heads, self.head_dim)
        return x.permute(0, 2, 1, 3) if batch_first else x.permute(1, 2, 0, 3)

    def _in_projection(self, query: Tensor, key: Tensor, value: Tensor, self_attn: bool,
                       kv_same: bool) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v of the 3-D inputs, each projection one 2-D GEMM over the input's rows (a batched 3-D matmul
        over a transposed input is several times slower on CPU backends)."""
        lead_q, lead_k, lead_v = query.shape[:2], key.shape[:2], value.shape[:2]
        rows_q, rows_k = query.reshape(-1, query.shape[-1]), key.reshape(-1, key.shape[-1])
        rows_v = value.reshape(-1, value.shape[-1])
        q, k, v = self._project(rows_q, rows_k, rows_v, self_attn, kv_same)
        hook = self.projection_hook
        if hook is not None:
            q, k, v = hook("q", rows_q, q), hook("k", rows_k, k), hook("v", rows_v, v)
        e = self.embed_dim
        return q.reshape(*lead_q, e), k.reshape(*lead_k, e), v.reshape(*lead_v, e)

    def _project(self, query: Tensor, key: Tensor, value: Tensor, self_attn: bool,
                 kv_same: bool) -> tuple[Tensor, Tensor, Tensor]:
        e = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:e], b[e:2 * e], b[2 * e:])
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            if self_attn:
                # one matmul for the packed projection, then split (torch's _in_projection_packed)
                return F.linear(query, w, b).chunk(3, dim=-1)  # type: ignore[return-value]
            q = F.linear(query, w[:e], bq)
            if kv_same:
                k, v = F.linear(key, w[e:], None if b is None else b[e:]).chunk(2, dim=-1)
                return q, k, v
            return q, F.linear(key, w[e:2 * e], bk), F.linear(value, w[2 * e:], bv)
        return (F.linear(query, self.q_proj_weight, bq), F.linear(key, self.k_proj_weight, bk),
                F.linear(value, self.v_proj_weight, bv))


def _pad_last(mask: Tensor | None) -> Tensor | None:
    """Append one zero (attend) column to an additive mask, for the extra bias_k / zero-attention key."""
    if mask is None:
        return None
    z = zeros(tuple(mask.shape[:-1]) + (1,), dtype=mask._dtype, device=mask._device)
    return cat([mask, z], mask.ndim - 1)


__all__ = ["MultiheadAttention"]
