"""Normalisation layers: ``BatchNorm1d/2d/3d``, ``InstanceNorm1d/2d/3d``, ``LayerNorm``, ``RMSNorm``,
``GroupNorm``, with PyTorch's running statistics, momentum rules, buffers and initialisation."""

from __future__ import annotations

import warnings
from typing import Any

from ... import dtypes as dt
from ...autograd import no_grad
from ...errors import ShapeError, ValueRangeError
from ...ops.creation import tensor as _tensor
from ...tensor import Tensor
from .. import functional as F
from .. import init
from ..module import Module
from ._common import _check_input, _empty, _label, _param, _positive_int


def _register_affine(module: Module, shape: tuple[int, ...], affine: bool, bias: bool, device: Any,
                     dtype: Any) -> None:
    """The learnable per-element scale (``weight``) and shift (``bias``) of a norm layer, or None entries."""
    module.register_parameter("weight", _param(shape, device, dtype) if affine else None)
    module.register_parameter("bias", _param(shape, device, dtype) if affine and bias else None)

class _NormBase(Module):
    """Per-channel affine parameters and running statistics (torch.nn.modules.batchnorm._NormBase)."""

    _ranks: tuple[int, ...] = ()
    _rank_text = ""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device: Any = None, dtype: Any = None, *,
                 bias: bool = True) -> None:
        super().__init__()
        self.num_features = _positive_int(type(self).__name__, "num_features", num_features)
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        _register_affine(self, (num_features,), affine, bias, device, dtype)
        if track_running_stats:
            self.register_buffer("running_mean", _empty((num_features,), device, dtype))
            self.register_buffer("running_var", _empty((num_features,), device, dtype))
            self.register_buffer("num_batches_tracked", _tensor(0, dtype=dt.int64, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            init.zeros_(self.running_mean)
            init.ones_(self.running_var)
            init.zeros_(self.num_batches_tracked)

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def _check_rank(self, input: Any) -> Tensor:
        _check_input(self, input)
        if input.ndim not in self._ranks:
            raise ShapeError(f"{_label(self)}: expected {self._rank_text} input, got shape {input.shape}")
        return input

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class _BatchNorm(_NormBase):
    def forward(self, input: Tensor) -> Tensor:
        self._check_rank(input)
        if input.shape[1] != self.num_features:
            raise ShapeError(f"{_label(self)}: expected input with {self.num_features} channels (dim 1), got "
                             f"{input.shape[1]} in shape {input.shape}")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            nbt = self.num_batches_tracked
            with no_grad():
                nbt.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(nbt.item())
        # in eval, batch statistics are used only when there are no running statistics to use
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        use_running = not self.training or self.track_running_stats
        return F.batch_norm(input, self.running_mean if use_running else None,
                            self.running_var if use_running else None, self.weight, self.bias, bn_training,
                            factor, self.eps)


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of ``(N, C)`` or ``(N, C, L)`` input."""

    _ranks = (2, 3)
    _rank_text = "2D or 3D"


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of ``(N, C, H, W)`` input."""

    _ranks = (4,)
    _rank_text = "4D"


class BatchNorm3d(_BatchNorm):
    """Batch normalisation of ``(N, C, D, H, W)`` input."""

    _ranks = (5,)
    _rank_text = "5D"


class _InstanceNorm(_NormBase):
    _nd = 0

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
                 track_running_stats: bool = False, device: Any = None, dtype: Any = None, *,
                 bias: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)

    def forward(self, input: Tensor) -> Tensor:
        self._check_rank(input)
        nd = self._nd
        c = input.shape[-nd - 1]
        if c != self.num_features:
            if self.affine:
                raise ShapeError(f"{_label(self)}: expected input with {self.num_features} channels (dim "
                                 f"{input.ndim - nd - 1}), got {c} in shape {input.shape}")
            warnings.warn(f"{_label(self)}: input has {c} channels but num_features is {self.num_features}; "
                          "num_features is ignored when affine=False", stacklevel=2)
        unbatched = input.ndim == nd + 1
        x = input.unsqueeze(0) if unbatched else input
        use_input_stats = self.training or not self.track_running_stats
        # PyTorch: momentum None leaves the running stats of instance norm untouched (no cumulative average, and
        # num_batches_tracked is never counted)
        out = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias, use_input_stats,
                              self.momentum if self.momentum is not None else 0.0, self.eps)
        return out.squeeze(0) if unbatched else out


class InstanceNorm1d(_InstanceNorm):
    """Instance normalisation of ``(N, C, L)`` or ``(C, L)`` input."""

    _nd = 1
    _ranks = (2, 3)
    _rank_text = "2D (unbatched) or 3D (batched)"


class InstanceNorm2d(_InstanceNorm):
    """Instance normalisation of ``(N, C, H, W)`` or ``(C, H, W)`` input."""

    _nd = 2
    _ranks = (3, 4)
    _rank_text = "3D (unbatched) or 4D (batched)"


class InstanceNorm3d(_InstanceNorm):
    """Instance normalisation of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input."""

    _nd = 3
    _ranks = (4, 5)
    _rank_text = "4D (unbatched) or 5D (batched)"


def _shape_tuple(cls: str, normalized_shape: Any) -> tuple[int, ...]:
    t = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not t or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in t):
        raise ValueRangeError(f"{cls}: normalized_shape must be an int or a non-empty sequence of non-negative "
                              f"ints, got {normalized_shape!r}")
    return t


def _check_trailing(m: Module, input: Any, ns: tuple[int, ...]) -> Tensor:
    _check_input(m, input)
    if input.ndim < len(ns) or input.shape[input.ndim - len(ns):] != ns:
        raise ShapeError(f"{_label(m)}: expected input with trailing dims {ns}, got shape {input.shape}")
    return input


class LayerNorm(Module):
    """Normalise over the trailing normalized_shape dims; weight 1 and bias 0 when elementwise_affine."""

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.normalized_shape = _shape_tuple("LayerNorm", normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        _register_affine(self, self.normalized_shape, elementwise_affine, bias, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        _check_trailing(self, input, self.normalized_shape)
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) over the trailing dims, times weight (1); eps None means the dtype's epsilon."""

    def __init__(self, normalized_shape: Any, eps: float | None = None, elementwise_affine: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.normalized_shape = _shape_tuple("RMSNorm", normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = _param(self.normalized_shape, device, dtype)
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, input: Tensor) -> Tensor:
        _check_trailing(self, input, self.normalized_shape)
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
    """Normalise ``(N, C, *)`` over groups of num_channels // num_groups channels; weight 1, bias 0."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 device: Any = None, dtype: Any = None, *, bias: bool = True) -> None:
        super().__init__()
        _positive_int("GroupNorm", "num_groups", num_groups, allow_zero=False)
        _positive_int("GroupNorm", "num_channels", num_channels)
        if num_channels % num_groups:
            raise ValueRangeError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups "
                                  f"({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        _register_affine(self, (num_channels,), affine, bias, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        _check_input(self, input)
        if input.ndim < 2 or input.shape[1] != self.num_channels:
            raise ShapeError(f"{_label(self)}: expected input (N, {self.num_channels}, *), got shape {input.shape}")
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")


__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
           "LayerNorm", "RMSNorm", "GroupNorm"]
