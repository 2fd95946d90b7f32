"""Quantized layers and ``quantize_dynamic``.

* :class:`Linear4bit`: a frozen NF4/FP4 weight (QLoRA's base layer); the forward is one ``quant.matmul_4bit`` op
  (the weight dequantized on the fly, a chunk of rows at a time on backends with a kernel), in ``compute_dtype``.
* :class:`DynamicQuantizedLinear`: int8 inference (PyTorch's ``torch.ao.nn.quantized.dynamic.Linear``): the
  weight per output channel, symmetric; each input row quantized on the fly with its own absmax scale; the
  integer product is accumulated in float32 (exact while ``in_features * 127 * 127 < 2**24``) and rescaled.
* :class:`DynamicQuantizedConv2d`: the same for ``nn.Conv2d``: int8 weight per output channel, symmetric; each
  sample of the input quantized on the fly with its own absmax scale; the integer convolution accumulated in
  float32 (exact while ``in_channels / groups * kh * kw * 127 * 127 < 2**24``) and rescaled by both scales.
* :func:`quantize_dynamic` swaps a model's ``nn.Linear`` (and, when asked, ``nn.Conv2d``) layers for the dynamic
  int8 layers in place; the ``out_proj`` of a ``MultiheadAttention`` is left alone, as PyTorch does (the attention
  reads its weight directly).
"""

from __future__ import annotations

from typing import Any

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError, ValueRangeError
from ..nn.layers.conv import Conv2d
from ..nn.layers.linear import Linear
from ..nn.module import Module, Parameter
from ..nn.sequence.attention import MultiheadAttention
from ..tensor import Tensor
from . import ops as _ops
from .tensor import QuantizedTensor, quantize_4bit, quantize_int8

__all__ = ["DynamicQuantizedConv2d", "DynamicQuantizedLinear", "Linear4bit", "model_size", "quantize_dynamic",
           "quantized_modules"]


class QuantizedModule(Module):
    """Base of the quantized layers: the weight is a :class:`QuantizedTensor` whose parts are buffers
    (``weight`` = the data, ``weight_scale``, and those present of ``weight_zero_point``, ``weight_scale2``,
    ``weight_offset``), so ``state_dict`` saves them; :meth:`weight_tag` is the format tag records store."""

    def _set_weight(self, q: QuantizedTensor) -> None:
        self._qmeta = {k: v for k, v in q.tag().items()}
        for part, t in q.tensors().items():
            self.register_buffer("weight" if part == "data" else f"weight_{part}", t)

    def quantized_weight(self) -> QuantizedTensor:
        """The weight as a :class:`QuantizedTensor` (sharing this module's buffers)."""
        parts = {"data": self._buffers["weight"]}
        for part in ("scale", "zero_point", "scale2", "offset"):
            t = self._buffers.get(f"weight_{part}")
            if t is not None:
                parts[part] = t
        return QuantizedTensor.from_parts(self._qmeta, parts)

    def weight_tag(self) -> dict[str, Any]:
        """The weight's format tag (see :meth:`QuantizedTensor.tag`)."""
        return dict(self._qmeta)

    def dequantized_linear(self, dtype: dt.DType | None = None) -> Linear:
        """A float ``nn.Linear`` with the dequantized weight (``dtype``: default the original) and this bias."""
        w = self.quantized_weight().dequantize(dtype)
        out_f, in_f = w.shape
        bias = self.bias
        lin = Linear(in_f, out_f, bias=bias is not None, device=w.device, dtype=w.dtype)
        from ..autograd import no_grad

        with no_grad():
            lin.weight.copy_(w)
            if bias is not None:
                lin.bias.copy_(bias.to(w.dtype))
        return lin


def _check_linear(op: str, linear: Any) -> Linear:
    if not isinstance(linear, Linear):
        raise DTypeError(f"{op}: expected an nn.Linear, got {type(linear).__name__}")
    return linear


class Linear4bit(QuantizedModule):
    """A Linear layer whose weight is stored in 4 bits (NF4 or FP4, bitsandbytes' format) and never trained.

    Build it with :meth:`from_linear`. The forward runs ``x @ dequant(W).T + bias`` in ``compute_dtype`` (float32 or
    bfloat16; the input is cast to it) and returns the input's dtype (as bitsandbytes' ``Linear4bit``). ``bias``
    stays a float parameter in
    ``compute_dtype`` (frozen unless someone unfreezes it); gradients flow to the input and the bias only.
    """

    def __init__(self, q: QuantizedTensor, bias: Tensor | None, compute_dtype: dt.DType = dt.float32) -> None:
        super().__init__()
        if q.format not in ("nf4", "fp4") or len(q.shape) != 2:
            raise ValueRangeError(f"Linear4bit: expected a 2-d nf4/fp4 QuantizedTensor, got {q!r}")
        if compute_dtype not in (dt.float32, dt.bfloat16, dt.float16, dt.float64):
            raise DTypeError(f"Linear4bit: compute_dtype must be a floating-point dtype, got {compute_dtype!r}")
        self.out_features, self.in_features = q.shape
        self.quant_type, self.blocksize, self.compute_dtype = q.format, q.blocksize, compute_dtype
        self._set_weight(q)
        if bias is not None:
            self.bias = Parameter(bias.detach().to(compute_dtype), requires_grad=False)
        else:
            self.bias = None

    @classmethod
    def from_linear(cls, linear: Linear, quant_type: str = "nf4", blocksize: int = 64, double_quant: bool = False,
                    compute_dtype: dt.DType = dt.float32) -> Linear4bit:
        """Quantize ``linear``'s weight (its float32 values) to ``quant_type``."""
        _check_linear("Linear4bit.from_linear", linear)
        q = quantize_4bit(linear.weight.detach(), quant_type, blocksize, double_quant)
        return cls(q, linear.bias, compute_dtype)

    def forward(self, x: Tensor) -> Tensor:
        q_abs = self.quantized_weight().absmax()
        in_dtype = x.dtype
        x = x.to(self.compute_dtype) if in_dtype is not self.compute_dtype else x
        out = _ops.matmul_4bit(x, self._buffers["weight"], q_abs, self.bias, out_features=self.out_features,
                               in_features=self.in_features, blocksize=self.blocksize, quant_type=self.quant_type)
        return out.to(in_dtype) if in_dtype is not self.compute_dtype and in_dtype.is_floating_point else out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"quant_type={self.quant_type!r}, blocksize={self.blocksize}, "
                f"double_quant={'weight_scale2' in self._buffers}, compute_dtype={self.compute_dtype.name}")


class DynamicQuantizedLinear(QuantizedModule):
    """Dynamic int8 Linear for inference (see the module docstring); build it with :meth:`from_linear`."""

    def __init__(self, q: QuantizedTensor, bias: Tensor | None) -> None:
        super().__init__()
        if q.format != "int8" or q.granularity != "per_channel" or q.axis != 0 or len(q.shape) != 2:
            raise ValueRangeError(f"DynamicQuantizedLinear: expected a 2-d per-channel (axis 0) int8 weight, got {q!r}")
        self.out_features, self.in_features = q.shape
        self._set_weight(q)
        self.bias = Parameter(bias.detach().to(dt.float32), requires_grad=False) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: Linear) -> DynamicQuantizedLinear:
        """Quantize ``linear``'s weight per output channel, symmetric int8."""
        _check_linear("DynamicQuantizedLinear.from_linear", linear)
        return cls(quantize_int8(linear.weight.detach(), "symmetric", "per_channel", 0), linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        from ..ops.pointwise import where

        if not x.dtype.is_floating_point:
            raise DTypeError(f"DynamicQuantizedLinear: expected a floating-point input, got {x.dtype.name}")
        xf = x.to(dt.float32)
        amax = xf.abs().amax(-1, keepdim=True)
        sx = where(amax > 0, amax / 127, 1.0)  # one scale per row, from this call's values
        xq = (xf / sx).round().clamp(-127, 127)
        w = self._buffers["weight"].to(dt.float32)
        sw = self._buffers["weight_scale"].reshape(1, -1)
        out = (xq @ w.T) * sx * sw
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype) if x.dtype is not dt.float32 else out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


class DynamicQuantizedConv2d(QuantizedModule):
    """Dynamic int8 Conv2d for inference (see the module docstring); build it with :meth:`from_conv`.

    The weight is int8, symmetric, one scale per output channel (``scale = absmax / 127``). At each call every
    sample of the batch is quantized with its own scale (``absmax / 127`` over the sample, 1 for an all-zero
    sample), the convolution of the integer values runs in float32 and is rescaled by the sample's and the output
    channel's scales; the bias is added in float32. Stride, padding (every ``padding_mode``), dilation and groups
    are the original layer's.
    """

    def __init__(self, q: QuantizedTensor, bias: Tensor | None, conv: Conv2d) -> None:
        super().__init__()
        if q.format != "int8" or q.granularity != "per_channel" or q.axis != 0 or len(q.shape) != 4:
            raise ValueRangeError(f"DynamicQuantizedConv2d: expected a 4-d per-channel (axis 0) int8 weight, got "
                                  f"{q!r}")
        self.out_channels, self.in_channels = conv.out_channels, conv.in_channels
        self.kernel_size, self.stride, self.padding = conv.kernel_size, conv.stride, conv.padding
        self.dilation, self.groups, self.padding_mode = conv.dilation, conv.groups, conv.padding_mode
        self._reversed_padding_repeated_twice = list(conv._reversed_padding_repeated_twice)
        self._set_weight(q)
        self.bias = Parameter(bias.detach().to(dt.float32), requires_grad=False) if bias is not None else None

    @classmethod
    def from_conv(cls, conv: Conv2d) -> DynamicQuantizedConv2d:
        """Quantize ``conv``'s weight per output channel, symmetric int8."""
        if not isinstance(conv, Conv2d):
            raise DTypeError(f"DynamicQuantizedConv2d.from_conv: expected an nn.Conv2d, got {type(conv).__name__}")
        return cls(quantize_int8(conv.weight.detach(), "symmetric", "per_channel", 0), conv.bias, conv)

    def forward(self, x: Tensor) -> Tensor:
        from ..nn import functional as F
        from ..ops.pointwise import where

        op = "DynamicQuantizedConv2d"
        if not x.dtype.is_floating_point:
            raise DTypeError(f"{op}: expected a floating-point input, got {x.dtype.name}")
        if x.ndim not in (3, 4) or x.shape[-3] != self.in_channels:
            raise ShapeError(f"{op}: expected input of shape (N, {self.in_channels}, H, W) or "
                             f"({self.in_channels}, H, W), got {tuple(x.shape)}")
        batched = x.ndim == 4
        xf = (x if batched else x.unsqueeze(0)).to(dt.float32)
        amax = xf.abs().amax((1, 2, 3), keepdim=True)
        sx = where(amax > 0, amax / 127, 1.0)  # one scale per sample, from this call's values
        xq = (xf / sx).round().clamp(-127, 127)
        padding: Any = self.padding
        if self.padding_mode != "zeros":
            # reflect / replicate / circular copy input values, so padding the codes equals coding the padded input
            xq, padding = F.pad(xq, self._reversed_padding_repeated_twice, mode=self.padding_mode), 0
        w = self._buffers["weight"].to(dt.float32)
        out = F.conv2d(xq, w, None, self.stride, padding, self.dilation, self.groups)
        out = out * sx * self._buffers["weight_scale"].reshape(1, -1, 1, 1)
        if self.bias is not None:
            out = out + self.bias.reshape(1, -1, 1, 1)
        out = out if batched else out.squeeze(0)
        return out.to(x.dtype) if x.dtype is not dt.float32 else out

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
             f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
             f"bias={self.bias is not None}")
        return s + (f", padding_mode={self.padding_mode}" if self.padding_mode != "zeros" else "") + ", int8"


def quantized_modules(model: Module) -> list[tuple[str, QuantizedModule]]:
    """(path, module) for every quantized layer of ``model``."""
    return [(p, m) for p, m in model.named_modules() if isinstance(m, QuantizedModule)]


#: what quantize_dynamic replaces, and with what
_DYNAMIC: dict[type, Any] = {Linear: DynamicQuantizedLinear.from_linear, Conv2d: DynamicQuantizedConv2d.from_conv}


def _replace(model: Module, op: str, types: set[type]) -> Module:
    if not isinstance(model, Module):
        raise DTypeError(f"{op}: model must be an nn.Module, got {type(model).__name__}")
    if type(model) in types:
        raise DTypeError(f"{op}: model is itself an nn.{type(model).__name__}; wrap it in a container "
                         "(nn.Sequential) so it can be replaced in place")
    # a MultiheadAttention reads out_proj's weight itself (PyTorch types it NonDynamicallyQuantizableLinear so
    # quantize_dynamic passes it by): its projections stay float
    inside_attention = {id(m) for _, a in model.named_modules() if isinstance(a, MultiheadAttention)
                        for _, m in a.named_modules()}
    todo = [(p, m) for p, m in model.named_modules() if type(m) in types and id(m) not in inside_attention]
    for path, m in todo:
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        setattr(parent, name, _DYNAMIC[type(m)](m))
    return model


def quantize_dynamic(model: Module, qconfig_spec: Any = None, dtype: dt.DType = dt.int8,
                     inplace: bool = True) -> Module:
    """Replace the ``nn.Linear`` layers of ``model`` with :class:`DynamicQuantizedLinear` (int8 weights per output
    channel, dynamic per-row activation scales), and with ``qconfig_spec={nn.Linear, nn.Conv2d}`` also its
    ``nn.Conv2d`` layers with :class:`DynamicQuantizedConv2d` (dynamic per-sample scales): PyTorch's
    ``torch.ao.quantization.quantize_dynamic``. For inference (the quantized layers hold no trainable weight).
    ``MultiheadAttention``'s ``out_proj`` stays float, as in PyTorch. Returns the model.

    ``qconfig_spec`` (torch's set of layer types) may be None (``{nn.Linear}``, torch's default for these layers)
    or a non-empty subset of ``{nn.Linear, nn.Conv2d}``; ``inplace=False`` quantizes a deep copy.

    >>> import ember
    >>> from ember import nn, quantization as Q
    >>> m = Q.quantize_dynamic(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4)))
    >>> type(m[0]).__name__, Q.model_size(m)["weights_bytes"]
    ('DynamicQuantizedLinear', 2464)
    >>> c = Q.quantize_dynamic(nn.Sequential(nn.Conv2d(1, 8, 3), nn.Flatten(), nn.Linear(8 * 4 * 4, 2)),
    ...                        {nn.Linear, nn.Conv2d})
    >>> type(c[0]).__name__, tuple(c(ember.randn(2, 1, 6, 6)).shape)
    ('DynamicQuantizedConv2d', (2, 2))
    """
    op = "quantize_dynamic"
    if dtype is not dt.int8:
        raise DTypeError(f"{op}: only dtype=ember.int8 is supported, got {dtype!r}")
    types = {Linear} if qconfig_spec is None else set(qconfig_spec)
    if not types or not types <= set(_DYNAMIC):
        raise ValueRangeError(f"{op}: qconfig_spec may only name nn.Linear and nn.Conv2d, got {qconfig_spec!r}")
    if not inplace:
        import copy

        model = copy.deepcopy(model)
    return _replace(model, op, types)


def model_size(model: Module) -> dict[str, int]:
    """Storage of ``model``: ``parameters_bytes`` (float parameters), ``quantized_bytes`` (the quantized layers'
    buffers: data and scales), ``weights_bytes`` (the two together) and ``total_bytes`` (every parameter and buffer,
    what ``state_dict`` holds)."""
    if not isinstance(model, Module):
        raise DTypeError(f"model_size: model must be an nn.Module, got {type(model).__name__}")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    quant = sum(m.quantized_weight().nbytes() for _, m in quantized_modules(model))
    total = params + sum(b.numel() * b.element_size() for b in model.buffers())
    return {"parameters_bytes": params, "quantized_bytes": quant, "weights_bytes": params + quant,
            "total_bytes": total}
