"""``Embedding``: a lookup table of learnable vectors indexed by integer ids."""

from __future__ import annotations

from typing import Any

from ...autograd import no_grad
from ...errors import ShapeError, ValueRangeError
from ...tensor import Tensor
from .. import functional as F
from .. import init
from ..module import Module, Parameter
from ._common import _check_input, _label, _param, _positive_int


class Embedding(Module):
    """Weight ``(num_embeddings, embedding_dim)`` initialised N(0, 1); the padding_idx row is zero and receives
    no gradient; max_norm renormalises looked-up rows in place."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight: Tensor | None = None, _freeze: bool = False, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.num_embeddings = _positive_int("Embedding", "num_embeddings", num_embeddings)
        self.embedding_dim = _positive_int("Embedding", "embedding_dim", embedding_dim)
        if padding_idx is not None:
            if isinstance(padding_idx, bool) or not isinstance(padding_idx, int) or \
                    not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueRangeError(f"Embedding: padding_idx must be within num_embeddings ({num_embeddings}), "
                                      f"got {padding_idx!r}")
            if padding_idx < 0:
                padding_idx = num_embeddings + padding_idx
        self.padding_idx = padding_idx
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        if _weight is None:
            self.weight = _param((num_embeddings, embedding_dim), device, dtype)
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ShapeError(f"Embedding: shape of weight {tuple(_weight.shape)} does not match "
                                 f"num_embeddings and embedding_dim ({num_embeddings}, {embedding_dim})")
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        self._fill_padding_idx_with_zero()

    def _fill_padding_idx_with_zero(self) -> None:
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx] = 0

    def forward(self, input: Tensor) -> Tensor:
        _check_input(self, input)
        if input._dtype.is_floating_point or input._dtype.is_bool:
            from ...errors import DTypeError

            raise DTypeError(f"{_label(self)}: expected integer indices (int64 or int32), got dtype "
                             f"{input._dtype.name}")
        return F.embedding(input, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq is not False:
            s += f", scale_grad_by_freq={self.scale_grad_by_freq}"
        if self.sparse is not False:
            s += ", sparse=True"
        return s

    @classmethod
    def from_pretrained(cls, embeddings: Tensor, freeze: bool = True, padding_idx: int | None = None,
                        max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                        sparse: bool = False) -> Embedding:
        """An Embedding whose weight is (a copy-free view of) the 2-D embeddings tensor; frozen by default."""
        if not isinstance(embeddings, Tensor) or embeddings.ndim != 2:
            raise ShapeError(f"Embedding.from_pretrained: embeddings must be a 2-D tensor, got "
                             f"{getattr(embeddings, 'shape', type(embeddings).__name__)}")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse, _weight=embeddings,
                   _freeze=freeze)


__all__ = ["Embedding"]
