"""Transformer encoder/decoder layers and stacks with torch's submodule names (``self_attn``, ``linear1``,
``norm1`` ...), so a torch state_dict loads unchanged."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from ...autograd import no_grad
from ...errors import DTypeError, ShapeError
from ...ops.creation import full
from ...tensor import Tensor
from ..layers import Dropout, LayerNorm, Linear
from ..module import Module, ModuleList
from ._common import (
    check_input,
    check_positive_int,
    check_prob,
    get_activation,
    uniform_param,
    xavier_uniform_bound,
)
from .attention import MultiheadAttention


def _init_layer(self: Module, cls: str, d_model: int, nhead: int, dim_feedforward: int, dropout: float,
                activation: Any, batch_first: bool, norm_first: bool) -> None:
    check_positive_int(cls, "d_model", d_model)
    check_positive_int(cls, "nhead", nhead)
    check_positive_int(cls, "dim_feedforward", dim_feedforward)
    check_prob(cls, "dropout", dropout)
    self.batch_first = bool(batch_first)
    self.norm_first = bool(norm_first)
    act = get_activation(cls, activation)
    self.activation_relu_or_gelu = 1 if activation in ("relu",) else 2 if activation in ("gelu",) else 0
    self.activation = act


def _check_src(cls: str, name: str, x: Tensor, d_model: int) -> None:
    check_input(cls, name, x)
    if x.ndim not in (2, 3):
        raise ShapeError(f"{cls}: expected {name} to be 2-D (seq, d_model) or 3-D (seq, batch, d_model; batch first "
                         f"with batch_first=True), got shape {x.shape}")
    if x.shape[-1] != d_model:
        raise ShapeError(f"{cls}: {name} has {x.shape[-1]} features (shape {x.shape}) but d_model={d_model}")


class TransformerEncoderLayer(Module):
    """Self-attention + feed-forward block (post-norm by default, pre-norm with ``norm_first=True``)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable[[Tensor], Tensor] = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        cls = type(self).__name__
        kw = {"device": device, "dtype": dtype}
        _init_layer(self, cls, d_model, nhead, dim_feedforward, dropout, activation, batch_first, norm_first)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, **kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(float(dropout))
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(float(dropout))
        self.dropout2 = Dropout(float(dropout))

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        _check_src(type(self).__name__, "src", src, self.self_attn.embed_dim)
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Tensor, attn_mask: Tensor | None, key_padding_mask: Tensor | None,
                  is_causal: bool) -> Tensor:
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerDecoderLayer(Module):
    """Self-attention + cross-attention over ``memory`` + feed-forward block."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable[[Tensor], Tensor] = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        cls = type(self).__name__
        kw = {"device": device, "dtype": dtype}
        _init_layer(self, cls, d_model, nhead, dim_feedforward, dropout, activation, batch_first, norm_first)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, **kw)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first, **kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(float(dropout))
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(float(dropout))
        self.dropout2 = Dropout(float(dropout))
        self.dropout3 = Dropout(float(dropout))

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False) -> Tensor:
        cls = type(self).__name__
        d = self.self_attn.embed_dim
        _check_src(cls, "tgt", tgt, d)
        _check_src(cls, "memory", memory, d)
        if memory.ndim != tgt.ndim:
            raise ShapeError(f"{cls}: tgt and memory must both be batched (3-D) or unbatched (2-D), got shapes "
                             f"{tgt.shape} and {memory.shape}")
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Tensor, attn_mask: Tensor | None, key_padding_mask: Tensor | None,
                  is_causal: bool) -> Tensor:
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                           need_weights=False)[0]
        return self.dropout1(x)

    def _mha_block(self, x: Tensor, mem: Tensor, attn_mask: Tensor | None, key_padding_mask: Tensor | None,
                   is_causal: bool) -> Tensor:
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=is_causal, need_weights=False)[0]
        return self.dropout2(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))


def _clones(cls: str, layer: Any, expected: type, num_layers: int) -> ModuleList:
    if not isinstance(layer, expected):
        raise DTypeError(f"{cls}: expected a {expected.__name__}, got {type(layer).__name__}")
    check_positive_int(cls, "num_layers", num_layers, allow_zero=True)
    # independent copies (same initial weights), as torch's _get_clones
    return ModuleList([copy.deepcopy(layer) for _ in range(num_layers)])


def _check_norm(cls: str, norm: Any) -> None:
    if norm is not None and not callable(norm):
        raise DTypeError(f"{cls}: norm must be a Module (or callable) or None, got {type(norm).__name__}")


class TransformerEncoder(Module):
    """A stack of ``num_layers`` deep copies of ``encoder_layer``, optionally followed by ``norm``."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        cls = type(self).__name__
        self.layers = _clones(cls, encoder_layer, TransformerEncoderLayer, num_layers)
        self.num_layers = num_layers
        _check_norm(cls, norm)
        self.norm = norm
        # nested tensors are a torch fast path (padded outputs become 0); ember always takes the exact path
        self.enable_nested_tensor = False
        self.mask_check = mask_check

    def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool | None = None) -> Tensor:
        out = src
        for mod in self.layers:
            out = mod(out, src_mask=mask, is_causal=bool(is_causal), src_key_padding_mask=src_key_padding_mask)
        if self.norm is not None:
            out = self.norm(out)
        return out


class TransformerDecoder(Module):
    """A stack of ``num_layers`` deep copies of ``decoder_layer``, optionally followed by ``norm``."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        cls = type(self).__name__
        self.layers = _clones(cls, decoder_layer, TransformerDecoderLayer, num_layers)
        self.num_layers = num_layers
        _check_norm(cls, norm)
        self.norm = norm

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        out = tgt
        for mod in self.layers:
            out = mod(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        if self.norm is not None:
            out = self.norm(out)
        return out


class Transformer(Module):
    """Encoder-decoder transformer (torch's ``nn.Transformer``): ``encoder`` and ``decoder`` stacks with final
    layer norms; every matrix parameter is re-initialised with ``xavier_uniform_``."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable[[Tensor], Tensor] = "relu", custom_encoder: Any = None,
                 custom_decoder: Any = None, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        common = {"dim_feedforward": dim_feedforward, "dropout": dropout, "activation": activation,
                  "layer_norm_eps": layer_norm_eps, "batch_first": batch_first, "norm_first": norm_first,
                  "bias": bias}
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(d_model, nhead, **common, **kw)
            self.encoder = TransformerEncoder(layer, num_encoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(d_model, nhead, **common, **kw)
            self.decoder = TransformerDecoder(layer, num_decoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw))
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = bool(batch_first)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        for p in self.parameters():
            if p.ndim > 1:
                bound = xavier_uniform_bound(_xavier_fan_out(p.shape), _fan_in(p.shape))
                with no_grad():
                    p.copy_(uniform_param(p.shape, bound, p._device, p._dtype))

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                src_is_causal: bool | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        cls = type(self).__name__
        check_input(cls, "src", src)
        check_input(cls, "tgt", tgt)
        is_batched = src.ndim == 3
        if src.ndim != tgt.ndim:
            raise ShapeError(f"{cls}: src and tgt must both be batched (3-D) or unbatched (2-D), got shapes "
                             f"{src.shape} and {tgt.shape}")
        bdim = 0 if self.batch_first else 1
        if is_batched and src.shape[bdim] != tgt.shape[bdim]:
            raise ShapeError(f"{cls}: the batch number of src and tgt must be equal, got shapes {src.shape} and "
                             f"{tgt.shape} (batch_first={self.batch_first})")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ShapeError(f"{cls}: the feature number of src and tgt must be equal to d_model={self.d_model}, "
                             f"got shapes {src.shape} and {tgt.shape}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device: Any = None, dtype: Any = None) -> Tensor:
        """A float (sz, sz) mask: -inf above the diagonal (future positions), 0 elsewhere."""
        check_positive_int("Transformer.generate_square_subsequent_mask", "sz", sz, allow_zero=True)
        return full((sz, sz), float("-inf"), dtype=dtype, device=device).triu(diagonal=1)


def _fan_in(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape[1:]:
        n *= s
    return n


def _xavier_fan_out(shape: tuple[int, ...]) -> int:
    n = shape[0]
    for s in shape[2:]:
        n *= s
    return n


__all__ = ["TransformerEncoderLayer", "TransformerEncoder", "TransformerDecoderLayer", "TransformerDecoder",
           "Transformer"]
