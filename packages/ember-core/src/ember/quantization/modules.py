"""Quantized layers and ``quantize_dynamic``.

* :class:`Linear4bit`: a frozen NF4/FP4 weight (QLoRA's base layer); the forward is one ``quant.matmul_4bit`` op
  (the weight dequantized on the fly, a chunk of rows at a time on backends with a kernel), in ``compute_dtype``.
* :class:`DynamicQuantizedLinear`: int8 inference (PyTorch's ``torch.ao.nn.quantized.dynamic.Linear``): the
  weight per output channel, symmetric; each input row quantized on the fly with its own absmax scale; the
  integer product is accumulated in float32 (exact while ``in_features * 127 * 127 < 2**24``) and rescaled.
* :func:`quantize_dynamic` swaps a model's ``nn.Linear`` layers for :class:`DynamicQuantizedLinear` in place.
"""

from __future__ import annotations

from typing import Any

from .. import dtypes as dt
from ..errors import DTypeError, ValueRangeError
from ..nn.layers.linear import Linear
from ..nn.module import Module, Parameter
from ..tensor import Tensor
from . import ops as _ops
from .tensor import QuantizedTensor, quantize_4bit, quantize_int8

__all__ = ["DynamicQuantizedLinear", "Linear4bit", "model_size", "quantize_dynamic", "quantized_modules"]


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


def quantized_modules(model: Module) -> list[tuple[str, QuantizedModule]]:
    """(path, module) for every quantized layer of ``model``."""
    return [(p, m) for p, m in model.named_modules() if isinstance(m, QuantizedModule)]


def _replace(model: Module, op: str, make: Any, dtype_ok: Any = None) -> Module:
    if not isinstance(model, Module):
        raise DTypeError(f"{op}: model must be an nn.Module, got {type(model).__name__}")
    if isinstance(model, Linear):
        raise DTypeError(f"{op}: model is itself an nn.Linear; wrap it in a container (nn.Sequential) so it can "
                         "be replaced in place")
    todo = [(p, m) for p, m in model.named_modules() if type(m) is Linear]
    for path, m in todo:
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        setattr(parent, name, make(m))
    return model


def quantize_dynamic(model: Module, qconfig_spec: Any = None, dtype: dt.DType = dt.int8,
                     inplace: bool = True) -> Module:
    """Replace every ``nn.Linear`` of ``model`` with a :class:`DynamicQuantizedLinear` (int8 weights per output
    channel, dynamic per-row activation scales): PyTorch's ``torch.ao.quantization.quantize_dynamic`` for
    Linear. For inference (the quantized layers hold no trainable weight). Returns the model.

    ``qconfig_spec`` (torch's set of layer types) may be None or ``{nn.Linear}``; ``inplace=False`` quantizes a
    deep copy.

    >>> import ember
    >>> from ember import nn, quantization as Q
    >>> m = Q.quantize_dynamic(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4)))
    >>> type(m[0]).__name__, Q.model_size(m)["weights_bytes"]
    ('DynamicQuantizedLinear', 2464)
    """
    op = "quantize_dynamic"
    if dtype is not dt.int8:
        raise DTypeError(f"{op}: only dtype=ember.int8 is supported, got {dtype!r}")
    if qconfig_spec is not None and set(qconfig_spec) != {Linear}:
        raise ValueRangeError(f"{op}: qconfig_spec may only name nn.Linear, got {qconfig_spec!r}")
    if not inplace:
        import copy

        model = copy.deepcopy(model)
    return _replace(model, op, DynamicQuantizedLinear.from_linear)


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
